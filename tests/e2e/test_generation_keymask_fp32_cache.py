"""gpt-fast's fp32 KV cache under precision="bf16": the decode attention reads the fp32 cache buffers
themselves, rounding K / V to bf16 in registers (issue 23; fwd.py KV32, translator/lowerings/attention.py
`_kv_uncast`). Before, each layer cast both whole caches ([B, Hkv, S_max, D]) to bf16 every step: two
elementwise launches a layer (tests/unit/test_precision_casts.py counts 8 launches a layer, was 10).

Here, on flysim: a decode step translated after an eager prefill, three greedy steps equal eager's tokens,
the attention kernel gets the cache buffers (their data pointers, fp32), and a step is 13 launches, the
attention right after the RoPE / cache-write kernel (before: 15, the two cache casts between them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import translator
import translator_kernels.attention as kernel_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # gpt-fast's decoder lives with the unit tests
import gptfast_model as G  # noqa: E402

pytest.importorskip("flysim")


def _spy(monkeypatch):
    calls = []
    real = kernel_attention.attention

    def spy(q, k, v, **kw):
        calls.append((q.dtype, k, v))
        return real(q, k, v, **kw)

    monkeypatch.setattr(kernel_attention, "attention", spy)
    return calls


def _caches(module):
    return {n.split("layers.", 1)[1]: b for n, b in module.named_buffers() if n.endswith(("k_cache", "v_cache"))}


def _kinds(tm):
    return [getattr(ln, "kernel", str(ln)).rsplit("_", 1)[0] for ln in tm.last_launches]


@pytest.mark.slow  # ~40 s on flysim; test_precision_casts.py (launches a layer) and test_attention_keymask_kv32.py (bits) cover it
def test_gptfast_bf16_decode_reads_the_fp32_cache_in_place(monkeypatch):
    m = G.build(n_layer=1)
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tok = m(prompt, torch.arange(8))[:, -1].argmax(-1, keepdim=True)  # eager prefill fills m's cache
    tm = translator.translate(m, (tok, torch.tensor([8])), backend="flysim", precision="bf16", dynamic_shapes=None,
                              verify=False)
    caches, eager = _caches(tm), _caches(m)
    assert caches.keys() == eager.keys() and len(caches) == 2
    for name, buf in caches.items():  # the translated module's state starts where eager's is
        if buf.data_ptr() != eager[name].data_ptr():
            buf.copy_(eager[name])
    calls = _spy(monkeypatch)
    want, got, t_e, t_f = [], [], tok, tok
    for pos in range(8, 11):
        p = torch.tensor([pos])
        with torch.no_grad():
            t_e = m(t_e, p)[:, -1].argmax(-1, keepdim=True)
            t_f = tm(t_f, p)[:, -1].argmax(-1, keepdim=True)
        want.append(int(t_e))
        got.append(int(t_f))
        kinds = _kinds(tm)
        assert kinds.count("attention_fwd_kernel") == 1, kinds
        # before: rope_cache, a cast of each whole cache (two fused_elementwise launches), attention (15 a step)
        at = kinds.index("attention_fwd_kernel")
        assert kinds[at - 1] == "rope_cache_kernel" and len(kinds) == 13, kinds
    assert got == want
    ptrs = {b.data_ptr() for b in caches.values()}
    assert calls
    for qdt, k, v in calls:
        assert qdt == torch.bfloat16 and k.dtype == v.dtype == torch.float32
        assert k.data_ptr() in ptrs and v.data_ptr() in ptrs and k.shape == next(iter(caches.values())).shape
