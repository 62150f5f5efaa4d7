"""Split-K stores S - 1 partial tiles (issue 29 item 3, gemm/splitk.py): the workgroup that draws the last ticket
keeps its partial in registers. flysim's byte counters show it; the MODEL (tiles.partial_bytes) charges the same."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import partial_bytes


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cfg", [G.GemmConfig(16, 64, 64, split=4), G.GemmConfig(32, 32, 128, split=2, kw=4)],
                         ids=lambda c: f"{c.bm}x{c.bn}x{c.bk}-s{c.split}-kw{c.kw}")
def test_last_arriver_stores_no_partial(arch, cfg):
    m, n, k = 5, 72, 1000
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(m, k, generator=g) / k**0.5).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, _config=cfg)
    torch.testing.assert_close(out.cpu().float(), (a.float() @ w.float().T).bfloat16().float(),
                               **op_tol(torch.bfloat16, "gemm"))
    if not executors.current().counts:
        return
    written, read = partial_bytes(m, n, k, cfg)
    per_split = written // (cfg.split - 1)
    got = ex.launches[-1].counters["global_bytes_written"] - m * n * 2  # less the output
    # S - 1 partial tiles (the counters' few atomics and resets add bytes, far below one tile); S before
    assert written <= got < written + per_split // 2, (got, written, per_split)
