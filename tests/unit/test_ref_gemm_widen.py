"""The reference GEMM widens a low-precision weight a block of rows at a time (lowerings.gemm.WIDEN_BYTES).

A bf16 weight is widened to fp32 on every reference call (the reference computes in fp32); a whole LM
head widened at once is a fresh buffer of N·K·4 bytes whose page faults cost more than its multiply
(docs/verification.md: 0.3 B, 2 layers, forward 853 -> 607 ms, outputs bit-identical). The blocks
must give the math of the whole weight: made (preshuffled) and lazy (the model's own weight) paths,
with bias, epilogue, residual and scale, a 3-D input and a last block shorter than the others.
"""

import pytest
import torch

import translator.lowerings.gemm as lgemm
from translator.tolerances import op_tol
from translator_kernels.gemm.preshuffle import shuffle_weight


@pytest.mark.parametrize("made", [True, False], ids=["preshuffled", "lazy"])
def test_blocks_of_rows_give_the_whole_weight_math(made, monkeypatch):
    g = torch.Generator().manual_seed(0)
    n, k = 200, 64
    a = torch.randn(2, 5, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    bias, res = torch.randn(n, generator=g).bfloat16(), torch.randn(2, 5, n, generator=g).bfloat16()
    if made:
        arg = shuffle_weight(w)
    else:  # a lazy prepared weight: the reference reads the model's own weight through state.natural
        arg = w
        monkeypatch.setattr(lgemm, "natural", lambda t: w)
    want = lgemm.ref_gemm(a, arg, n, k, bias, "gelu", res, 0.5)  # one block (n <= 8 MiB of rows)
    whole = (((a.float() @ w.float().t()) * 0.5 + bias.float())).clone()
    monkeypatch.setattr(lgemm, "WIDEN_BYTES", 48 * 4 * k)  # blocks of 48 rows: 4 of 48, one of 8
    got = lgemm.ref_gemm(a, arg, n, k, bias, "gelu", res, 0.5)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 5, n)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, (torch.nn.functional.gelu(whole) + res.float()).bfloat16(),
                               **op_tol(torch.bfloat16, "gemm", reduction_length=k))
