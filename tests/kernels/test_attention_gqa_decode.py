"""Decode attention packs a KV group's query heads into one block (issue 23, item 3; gqa.py).

At Sq = 1 with H / Hkv = group > 1 the group's query heads are the rows of one workgroup's
16-row tile, so each K / V tile is loaded once per KV head instead of once per query head.
Here: numerics against torch SDPA (enable_gqa) for group 1 (not packed), 2, 4, 8 and MQA, fp32
and bf16, with cache positions, per-head sinks, split KV (its merge inside the launch) and
eager SDPA's output layout; one launch on the packed grid; flysim's bytes read: K / V once per
KV head (1 / group of the unpacked path); the Llama-3-8B decode shape compiles without spills.
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import translator_kernels.attention as attn_mod
from translator.tolerances import op_tolerance
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.attention import attention, empty_in_order
from translator_kernels.attention.decode_plan import decode_plan
from translator_kernels.attention.gqa import pack_group


def _run(arch):
    return executors.current().run(arch)


def _inputs(B, H, Hkv, Sk, D, dt, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g).to(dt)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    return q, k, v


def _sdpa(q, k, v, pos=None, sinks=None):
    """torch SDPA in fp32 with enable_gqa; q_pos as its boolean mask; sinks as an extra softmax
    column whose probability is dropped (GQA by repeat_interleave there)."""
    q, k, v = q.float(), k.float(), v.float()
    keep = None if pos is None else torch.arange(k.shape[2])[None, :] <= pos.reshape(-1, 1)
    if sinks is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    col = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1] @ v


@pytest.mark.flysim_only("reads the launch grid")
@pytest.mark.parametrize("arch,dtype,B,H,Hkv,Sk,D,splits,pos,sinks,order", [
    ("gfx942", "bf16", 1, 4, 4, 200, 64, None, None, False, None),         # group 1: not packed
    ("gfx942", "bf16", 2, 4, 2, 130, 64, 1, 120, True, (0, 2, 1, 3)),      # group 2, no split, positions, sinks
    ("gfx950", "bf16", 1, 8, 2, 300, 128, None, 280, False, (0, 2, 1, 3)),  # group 4, split by the plan
    ("gfx942", "f32", 1, 8, 1, 200, 40, 3, None, True, None),              # MQA (group 8), padded D, split, sinks
    ("gfx950", "f32", 2, 16, 2, 150, 32, 2, 140, True, (0, 2, 1, 3)),      # group 8, split, positions, sinks
])
def test_packed_decode_matches_sdpa_in_one_launch(arch, dtype, B, H, Hkv, Sk, D, splits, pos, sinks, order):
    dt = NAMED_DTYPES[dtype]
    q, k, v = _inputs(B, H, Hkv, Sk, D, dt, 0)
    q_pos = None if pos is None else torch.tensor([pos])
    sink_t = torch.linspace(-2.0, 6.0, H) if sinks else None  # large enough that a wrong head's sink fails
    group = H // Hkv
    assert pack_group(H, Hkv, 1, causal=False, head_scale=None) == group
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), num_splits=splits, out_order=order,
                        q_pos=None if q_pos is None else ex.put(q_pos),
                        sinks=None if sink_t is None else ex.put(sink_t)).cpu()
    (launch,) = ex.launches
    assert launch.kernel.rsplit("_", 1)[0] == "attention_fwd_kernel"
    assert launch.grid[1:] == (Hkv, B)  # one block per (KV slice, KV head, batch): the group shares it
    want = empty_in_order((B, H, 1, D), order or (0, 1, 2, 3), dtype=dt, device="cpu")
    assert out.shape == q.shape and out.dtype == dt and out.stride() == want.stride()
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), _sdpa(q, k, v, q_pos, sink_t), atol=atol, rtol=rtol)


@pytest.mark.flysim_only("reads flysim's byte counters")
@pytest.mark.parametrize("splits", [1, None])
def test_kv_is_read_once_per_kv_head(monkeypatch, splits):
    """GQA 4, 512 keys, bf16: packed, the launch reads K / V once per KV head (262,144 bytes; flysim
    counts 266,240 unsplit, the rest is Q) where one block per query head read them 4 times
    (1,064,960); split KV adds the slices' Q reads and the merge's read-back of the partials."""
    q, k, v = _inputs(1, 8, 2, 512, 64, torch.bfloat16, 1)
    kv_once = 2 * k.numel() * k.element_size()
    reads, outs = [], []
    for packed in (True, False):
        with monkeypatch.context() as mp:
            if not packed:
                mp.setattr(attn_mod, "pack_group", lambda *a, **kw: 1)
            with _run("gfx942") as ex:
                outs.append(attention(ex.put(q), ex.put(k), ex.put(v), num_splits=splits).cpu())
        reads.append(ex.launches[0].counters["global_bytes_read"])
    packed_read, unpacked_read = reads
    assert kv_once <= packed_read < 1.4 * kv_once, reads
    assert unpacked_read >= 4 * kv_once, reads
    assert packed_read < 0.3 * unpacked_read, reads
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=atol, rtol=rtol)


def test_prefill_causal_and_head_scale_keep_one_head_per_block():
    assert pack_group(32, 8, 1, causal=False, head_scale=None) == 4
    assert pack_group(32, 8, 5, causal=False, head_scale=None) == 1      # prefill / Sq > 1
    assert pack_group(32, 8, 1, causal=True, head_scale=None) == 1       # top-left causal at Sq = 1
    assert pack_group(32, 8, 1, causal=False, head_scale=torch.ones(32)) == 1
    assert pack_group(32, 32, 1, causal=False, head_scale=None) == 1     # group 1


def test_llama3_decode_plan():
    """Llama-3-8B (32 heads, 8 KV heads, D 128, bf16) batch 1 at 2k on MI355X: 8 KV heads x 16
    slices of 128 keys (the MODEL's choice, test_attention_decode_split.py); K / V bytes once per KV
    head, a quarter of the unpacked plan's."""
    p, u = decode_plan(1, 32, 8, 2048, 128, "bf16", "gfx950"), decode_plan(1, 32, 8, 2048, 128, "bf16", "gfx950", False)
    assert p["grid"] == (16, 8, 1) and p["rows_per_block"] == 4 and p["keys_per_slice"] == 128
    assert p["kv_bytes"] == 2 * 8 * 2048 * 128 * 2 and u["kv_bytes"] == 4 * p["kv_bytes"]


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_packed_decode_isa_has_no_spills(arch):
    """Llama-3-8B decode (H 32, KV heads 8, D 128, bf16, an 8k cache read up to q_pos, sinks per query
    head) compiles to the one packed forward kernel, merge included, without spills (COMPILE_ONLY)."""
    from translator_kernels.isa import TensorSpec, compile_isa

    q, kv = TensorSpec((1, 32, 1, 128), "bfloat16"), TensorSpec((1, 8, 8192, 128), "bfloat16")
    got = compile_isa("translator_kernels.attention:attention", (q, kv, kv),
                      {"q_pos": TensorSpec((1,), "int64"), "sinks": TensorSpec((32,), "float32")}, arch=arch)
    assert [s.kernel.rsplit("_", 1)[0] for s in got.kernels] == ["attention_fwd_kernel"]
    meta = got.kernels[0].meta
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
    assert meta["vgpr"] <= 256 and got.kernels[0].occupancy[0] >= 2, meta
    assert "global_atomic_add" in got.kernels[0].ops  # the split-KV ticket


@pytest.mark.parametrize("arch,dtype,mask_kind", [("gfx942", "bf16", "bool"), ("gfx950", "f32", "add")])
def test_packed_decode_reads_the_mask_per_query_head(arch, dtype, mask_kind):
    """A user mask goes through the packed strides: a per-head boolean keep-mask [B, H, 1, Sk] (every
    head its own keys) and an additive [B, 1, 1, Sk] one broadcast over the heads, GQA 4, split KV."""
    dt = NAMED_DTYPES[dtype]
    B, H, Hkv, Sk, D = 2, 8, 2, 180, 64
    q, k, v = _inputs(B, H, Hkv, Sk, D, dt, 3)
    g = torch.Generator().manual_seed(4)
    if mask_kind == "bool":
        mask = torch.rand(B, H, 1, Sk, generator=g) < 0.5
    else:
        mask = torch.randn(B, 1, 1, Sk, generator=g).to(dt)
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), mask=ex.put(mask), num_splits=3).cpu()
    assert [ln.kernel.rsplit("_", 1)[0] for ln in ex.launches] == ["attention_fwd_kernel"]
    m = mask if mask.dtype == torch.bool else mask.float()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, enable_gqa=True)
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
