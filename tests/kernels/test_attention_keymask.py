"""Decode attention skips the key tiles a user mask drops for every row (issue 23; fwd.py KEY_SKIP).

Under torch.compile, HF's generate passes the decode step's mask as a graph input ([B, 1, 1, S_max]
bool, valid on the prefix 0..pos): nothing proves it causal, so the attention takes the mask tensor
over the whole static cache. The one-wave (decode) kernel loads each tile's mask bytes first (one byte
per key against 2 D esize bytes of K / V) and, in a wave-uniform branch, skips the tile's K / V loads
and math when no row of the wave keeps any of its keys: a bool False or an additive -inf (the values
whose weight is exactly 0 in SDPA). A split-KV slice with no kept key stores an empty partial (m =
-inf, l = 0, O = 0), which the in-launch merge weights 0. A finite fill (finfo.min) keeps its tiles:
SDPA gives a fully masked row of it uniform weights.

Here: numerics against torch SDPA (prefix masks, a mask with holes, fully masked rows, -inf / finfo.min
additive masks, GQA packing, split KV by the plan and forced) and flysim's bytes read: a prefix mask
reads K / V of the kept tiles only.
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol, op_tolerance
from translator_kernels.attention import attention, attention_config

F = torch.nn.functional


def _inputs(B, H, Hkv, Sk, D, dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g).to(dt)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    return q, k, v


def _prefix_mask(B, Sk, lens):
    """HF's decode mask: [B, 1, 1, S_max] bool, True on keys 0 .. lens[b] - 1."""
    return (torch.arange(Sk)[None, :] < torch.tensor(lens)[:, None]).view(B, 1, 1, Sk)


def _run(q, k, v, mask, splits=None):
    with executors.current().run("gfx942") as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), mask=ex.put(mask), num_splits=splits).cpu()
    return out, ex


def _sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)


def _check(out, q, k, v, mask):
    atol, rtol = op_tolerance(q.dtype, "attention")
    torch.testing.assert_close(out.float(), _sdpa(q, k, v, mask), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype,B,H,Hkv,Sk,D,lens,splits", [
    (torch.bfloat16, 1, 8, 2, 1024, 64, [20], None),        # packed GQA, split by the plan: most slices empty
    (torch.bfloat16, 2, 4, 4, 500, 64, [1, 333], 1),        # no split; per-batch lengths, a tail tile
    (torch.float32, 1, 4, 1, 300, 40, [130], 3),            # MQA, padded D, forced split
    (torch.bfloat16, 2, 4, 2, 256, 64, [0, 256], 2),        # a fully masked batch (SDPA: 0), a full one
])
def test_prefix_mask_matches_sdpa(dtype, B, H, Hkv, Sk, D, lens, splits):
    q, k, v = _inputs(B, H, Hkv, Sk, D, dtype)
    mask = _prefix_mask(B, Sk, lens)
    out, ex = _run(q, k, v, mask, splits)
    assert len(ex.launches) == 1
    _check(out, q, k, v, mask)


def test_mask_with_holes_and_additive_forms_match_sdpa():
    """Kept keys in a late tile only (the skip is per tile, not a prefix rule); -inf additive masks skip
    like bool False; finfo.min keeps every tile and equals SDPA."""
    q, k, v = _inputs(2, 4, 2, 384, 64, torch.bfloat16, 3)
    keep = torch.zeros(2, 1, 1, 384, dtype=torch.bool)
    keep[0, ..., 3] = keep[0, ..., 300:317] = True
    keep[1, ..., 383] = True
    masks = [keep] + [torch.zeros(keep.shape).masked_fill(~keep, f) for f in (float("-inf"), torch.finfo(torch.float32).min)]
    for mask in masks:
        for splits in (1, 4) if mask.dtype == torch.bool else (4,):
            out, _ = _run(q, k, v, mask, splits)
            _check(out, q, k, v, mask)


@pytest.mark.flysim_only("reads flysim's byte counters")
@pytest.mark.parametrize("splits,Sk", [(1, 1024), (None, 4096)])
def test_prefix_mask_reads_only_kept_tiles(splits, Sk):
    """A cache at position 20 (GQA 4, D 64, bf16): the launch reads K / V of the first tile only; against
    a full mask it reads exactly the K / V of the other tiles less (the mask bytes, Q and, split, the
    partials' read-back are the same in both). The 4096-slot cache is split by the plan (64 slices, 63
    of them empty)."""
    D = 64
    q, k, v = _inputs(1, 8, 2, Sk, D, torch.bfloat16, 1)
    kv_all = 2 * k.numel() * k.element_size()
    kv_tile = kv_all * attention_config("bf16", D, 4, "gfx942")["block_n"] // Sk
    reads = {}
    for name, n in (("prefix", 21), ("full", Sk)):
        mask = _prefix_mask(1, Sk, [n])
        out, ex = _run(q, k, v, mask, splits)
        _check(out, q, k, v, mask)
        reads[name] = ex.launches[0].counters["global_bytes_read"]
    assert reads["full"] - reads["prefix"] == kv_all - kv_tile, reads
    assert reads["prefix"] < reads["full"] / 3, reads


@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, float("-inf")])
def test_fully_masked_rows_equal_sdpa(fill):
    """SDPA: a row whose additive mask is all -inf gives 0; all finfo.min gives uniform weights (the
    mean of V): the -inf tiles are skipped, the finfo.min ones are not (and finfo.min times log2 e stays
    finite in the kernel: it gave 0 before)."""
    q, k, v = _inputs(1, 2, 2, 200, 32, torch.float32, 5)
    mask = torch.full((1, 1, 1, 200), fill)
    out, _ = _run(q, k, v, mask, 2)
    want = torch.zeros_like(q) if fill == float("-inf") else v.mean(2, keepdim=True)
    torch.testing.assert_close(_sdpa(q, k, v, mask), want, **op_tol(q.dtype, "attention"))  # SDPA's behaviour, pinned
    _check(out, q, k, v, mask)


def test_llama3_decode_with_a_mask_input_compiles_without_spills():
    """Llama-3-8B decode (H 32, KV heads 8, D 128, bf16) over an 8k cache under HF's [1, 1, 1, S_max] bool
    mask: one kernel, no spills, 3 waves per SIMD (measured on gfx942: 154 VGPRs; 148 before the skip).
    And the fp32 cache read (KV32) at the same shape: 2 waves, no spills (188 VGPRs)."""
    from translator_kernels.isa import TensorSpec, compile_isa

    q, kv = TensorSpec((1, 32, 1, 128), "bfloat16"), TensorSpec((1, 8, 8192, 128), "bfloat16")
    for k_spec, kw, waves in ((kv, {"mask": TensorSpec((1, 1, 1, 8192), "bool")}, 3),
                              (TensorSpec((1, 8, 8192, 128), "float32"), {"q_pos": TensorSpec((1,), "int64")}, 2)):
        got = compile_isa("translator_kernels.attention:attention", (q, k_spec, k_spec), kw, arch="gfx942")
        assert [s.kernel.rsplit("_", 1)[0] for s in got.kernels] == ["attention_fwd_kernel"]
        meta = got.kernels[0].meta
        assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
        assert got.kernels[0].occupancy[0] >= waves, (meta, got.kernels[0].occupancy)
