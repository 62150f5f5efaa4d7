"""Decode attention on a static KV cache, in place (issue 23, item 3), on flysim.

gpt-fast's decoder (tests/unit/gptfast_model.py) slices its mask from a tril buffer by the
step's positions, `causal_mask[None, None, input_pos]`, and hands the whole cache buffers to SDPA.
The translation must (1) read K and V from the cache buffers themselves, no copy or slice of them
before the attention; (2) turn the mask into the kernel's q_pos (a causal offset read on the
device): no gather launch, no mask tensor; (3) give eager's greedy tokens."""

from __future__ import annotations

import pytest
import torch

import translator
import translator_kernels.attention as kernel_attention
from translator.tolerances import model_tol

import gptfast_model as G

pytest.importorskip("flysim")


def _spy(monkeypatch):
    """Record (k, v, q_pos, mask) of every attention kernel call."""
    calls = []
    real = kernel_attention.attention

    def spy(q, k, v, **kw):
        calls.append((k, v, kw.get("q_pos"), kw.get("mask")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(kernel_attention, "attention", spy)
    return calls


def _caches(module):
    return {n.split("layers.", 1)[1]: b for n, b in module.named_buffers() if n.endswith(("k_cache", "v_cache"))}


def _decode(monkeypatch, backend, layers, steps):
    m = G.build(n_layer=layers)
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = m(prompt, torch.arange(8))  # eager prefill fills m's cache
    tok = logits[:, -1].argmax(-1, keepdim=True)
    tm = translator.translate(m, (tok, torch.tensor([8])), backend=backend, dynamic_shapes=None, verify=False)
    assert tm.report.counters.get("sdpa_cache_positions") == layers, tm.report.counters
    code = tm.code
    assert "flydsl.attention" in code and "causal_mask" not in code, "the mask gather is still in the graph"
    mine, eager = _caches(tm), _caches(m)
    assert mine.keys() == eager.keys() and len(mine) == 2 * layers
    for name, buf in mine.items():  # the translated module's state starts where eager's is
        if buf.data_ptr() != eager[name].data_ptr():
            buf.copy_(eager[name])

    calls = _spy(monkeypatch)
    want, got = [], []
    t_e = t_f = tok
    for pos in range(8, 8 + steps):
        p = torch.tensor([pos])
        with torch.no_grad():
            le = m(t_e, p)
            lf = tm(t_f, p)
        torch.testing.assert_close(lf, le, **model_tol())
        t_e, t_f = le[:, -1].argmax(-1, keepdim=True), lf[:, -1].argmax(-1, keepdim=True)
        want.append(int(t_e))
        got.append(int(t_f))
        if backend == "flysim":
            launches = [getattr(ln, "kernel", str(ln)).rsplit("_", 1)[0] for ln in tm.last_launches]
            assert launches.count("attention_fwd_kernel") == layers, launches
            # nothing copies, slices or gathers the cache or the mask (the one layout launch is the
            # RoPE table's row gather, made once per step before layer 0)
            assert launches.count("layout_kernel") <= 1, launches
    assert got == want
    if backend != "flysim":
        return
    assert calls  # the first call builds the plan; later steps replay it with the same tensors
    ptrs = {b.data_ptr() for b in mine.values()}
    for k, v, q_pos, mask in calls:
        assert mask is None and q_pos is not None and q_pos.dtype == torch.int64
        assert k.data_ptr() in ptrs and v.data_ptr() in ptrs and k.shape[2] == m.block_size


def test_gptfast_decode_step_rewrite(monkeypatch):
    """The graph and tokens on the reference backend (fast): q_pos replaces the mask gather."""
    _decode(monkeypatch, "reference", 2, 3)


@pytest.mark.slow  # ~40 s on 2 cores; test_gptfast_decode_step_rewrite and tests/kernels/test_attention_cache.py cover it
def test_gptfast_decode_on_flysim_reads_the_cache_in_place(monkeypatch):
    _decode(monkeypatch, "flysim", 1, 2)
