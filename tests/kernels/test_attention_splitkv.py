"""Split-KV decode attention combines its slices inside the one attention launch (issue 23, items 3-4).

Each KV slice writes fp32 partials (m, l, O), takes a ticket from its region's int32 counter, and
the last to arrive merges the slices in slice order and writes O with eager SDPA's strides; the
counters come from gemm/splitk.py's per-stream pool and a completed launch leaves them zero.
Here: numerics against torch SDPA for several split counts, GQA, cache positions (q_pos) and
sinks, bf16 and fp32; one launch where there were two (a forward and a combine kernel); the same
bits whichever slice arrives last (flysim's tickets handed out in reverse); the counters found
zero by the next launch; a fault between the tickets and the reset stays in its call.
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import flysim.ops_atomic
from translator.tolerances import op_tolerance
from translator_kernels import replay
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.attention import attention, split_geometry
from translator_kernels.attention.tiles import merge_trips
from translator_kernels.gemm import splitk


def _run(arch):
    return executors.current().run(arch)


def _names(launches):
    return [ln.kernel.rsplit("_", 1)[0] for ln in launches]


def _sdpa(q, k, v, pos=None, sinks=None):
    """torch SDPA in fp32 (GQA by repeat_interleave); q_pos as the boolean mask it stands for;
    sinks as an extra softmax column whose probability is dropped."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    keep = None if pos is None else torch.arange(k.shape[2])[None, :] <= pos.reshape(-1, 1)
    if sinks is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    col = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1] @ v


def _inputs(B, H, Hkv, Sq, Sk, D, dt, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Sq, D, generator=g).to(dt)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    return q, k, v


@pytest.mark.parametrize("arch,dtype,B,H,Hkv,Sq,Sk,D,splits,pos,sinks", [
    ("gfx942", "bf16", 1, 8, 2, 1, 200, 64, 2, None, False),      # GQA 4, 2 slices
    ("gfx950", "bf16", 2, 4, 1, 1, 300, 128, 5, 250, False),      # MQA, cache positions: slices past 250 empty
    ("gfx942", "f32", 1, 4, 2, 3, 160, 40, 3, None, True),        # fp32, padded D, 3 rows, sinks
    ("gfx950", "f32", 1, 2, 2, 1, 256, 64, 7, 100, True),         # 7 slices of 48 keys, positions and sinks
    ("gfx942", "bf16", 1, 2, 1, 1, 1024, 64, None, 700, False),   # the split the plan picks (16 slices)
])
def test_split_kv_is_one_launch_and_matches_sdpa(arch, dtype, B, H, Hkv, Sq, Sk, D, splits, pos, sinks):
    dt = NAMED_DTYPES[dtype]
    q, k, v = _inputs(B, H, Hkv, Sq, Sk, D, dt, 0)
    q_pos = None if pos is None else torch.arange(pos - Sq + 1, pos + 1)
    sink_t = torch.linspace(-1.0, 2.0, H) if sinks else None
    nsplit, _ = split_geometry(B, H, Sq, Sk, D, dtype, arch, splits)
    assert nsplit > 1
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), num_splits=splits,
                        q_pos=None if q_pos is None else ex.put(q_pos),
                        sinks=None if sink_t is None else ex.put(sink_t)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]  # was attention_fwd_kernel + attention_combine_kernel
    assert out.shape == q.shape and out.dtype == dt and out.stride() == q.contiguous().stride()
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), _sdpa(q, k, v, q_pos, sink_t), atol=atol, rtol=rtol)


def test_output_keeps_the_requested_layout():
    """out_order=(0, 2, 1, 3): the merge writes O as [B, Sq, H, D] memory, as the unsplit kernel does."""
    q, k, v = _inputs(1, 4, 2, 1, 256, 32, torch.bfloat16, 1)
    with _run("gfx942") as ex:
        split = attention(ex.put(q), ex.put(k), ex.put(v), num_splits=4, out_order=(0, 2, 1, 3)).cpu()
        whole = attention(ex.put(q), ex.put(k), ex.put(v), num_splits=1, out_order=(0, 2, 1, 3)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"] * 2
    assert split.stride() == whole.stride() == (128, 32, 128, 1)
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(split.float(), whole.float(), atol=atol, rtol=rtol)


def _reversed_tickets(monkeypatch):
    """flysim serializes an atomic's lanes in increasing workgroup order, so the last slice draws the
    last ticket; reversed, slice 0 does: another workgroup merges."""
    real = flysim.ops_atomic.serialize

    def serialize(kind, addr, x, read, write, bits, need_old=True):
        old = real(kind, addr.flip(0), x.flip(0), read, write, bits, need_old)
        return None if old is None else old.flip(0)

    monkeypatch.setattr(flysim.ops_atomic, "serialize", serialize)


@pytest.mark.flysim_only("reorders flysim's atomics")
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_same_bits_whichever_slice_arrives_last(monkeypatch, dtype):
    dt = NAMED_DTYPES[dtype]
    q, k, v = _inputs(1, 4, 2, 1, 300, 64, dt, 2)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    outs = []
    for reverse in (False, False, True):
        with monkeypatch.context() as mp:
            if reverse:
                _reversed_tickets(mp)
            with _run("gfx942") as ex:
                outs.append(attention(ex.put(q), ex.put(k), ex.put(v), num_splits=5, sinks=ex.put(sinks)).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(outs[0].float(), _sdpa(q, k, v, sinks=sinks), atol=atol, rtol=rtol)


@pytest.mark.flysim_only("inspects the counter pool of the CPU device")
def test_counters_are_zero_for_the_next_launch():
    """The launch takes a counter array from the pool, leaves it zero and gives it back; the next
    launch (another shape) gets the same array and still merges (a counter left non-zero would leave
    its output unwritten)."""
    cpu = torch.device("cpu")
    pool = splitk._POOL.setdefault(splitk._pool_key(cpu), [])
    q, k, v = _inputs(1, 4, 2, 1, 256, 64, torch.float32, 3)
    q2, k2, v2 = _inputs(2, 2, 2, 1, 200, 32, torch.float32, 4)
    atol, rtol = op_tolerance(torch.float32, "attention")
    with _run("gfx942") as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), num_splits=4)
        assert pool, "the launch gave its counters back"
        cnt = pool[-1]
        assert not cnt.any()
        out2 = attention(ex.put(q2), ex.put(k2), ex.put(v2), num_splits=3)
        assert pool[-1] is cnt and not cnt.any()
    torch.testing.assert_close(out.cpu(), _sdpa(q, k, v), atol=atol, rtol=rtol)
    torch.testing.assert_close(out2.cpu(), _sdpa(q2, k2, v2), atol=atol, rtol=rtol)


@pytest.mark.flysim_only("injects its fault into flysim's atomics")
@pytest.mark.parametrize("when", ["first call", "plan replay"])
def test_a_fault_after_the_tickets_stays_in_its_call(monkeypatch, when):
    """flysim raises right after the ticket atomic (tickets drawn, no counter reset): the launch's
    counters are dropped, never given back, and the next calls (direct, replay built, replayed) are right."""
    q, k, v = _inputs(1, 4, 2, 1, 256, 64, torch.float32, 5)
    ref = _sdpa(q, k, v)
    atol, rtol = op_tolerance(torch.float32, "attention")
    replay.clear_replays()
    try:
        with _run("gfx942"):
            for _ in range(3 if when == "plan replay" else 0):
                torch.testing.assert_close(attention(q, k, v, num_splits=4), ref, atol=atol, rtol=rtol)
            real = flysim.ops_atomic.serialize

            def faulty(*args, **kwargs):
                real(*args, **kwargs)
                raise flysim.SimulationError("fault injected after the split-KV tickets were drawn")

            with monkeypatch.context() as mp:
                mp.setattr(flysim.ops_atomic, "serialize", faulty)
                with pytest.raises(flysim.SimulationError, match="fault injected"):
                    attention(q, k, v, num_splits=4)
            for _ in range(3):
                torch.testing.assert_close(attention(q, k, v, num_splits=4), ref, atol=atol, rtol=rtol)
        assert all(not c.any() for c in splitk._POOL.get((torch.device("cpu"), None), []))
    finally:
        replay.clear_replays()


@pytest.mark.flysim_only("reorders flysim's atomics")
@pytest.mark.parametrize("dtype,D,splits,sinks", [
    ("bf16", 128, 20, False),  # 8 packed rows: 2 passes of 4; 20 slices: batches of 8, 8 and 4 (+4 re-read)
    ("f32", 64, 19, True),     # 2 passes of 4 rows, batches of 16 and 3; sinks added once, in the merge
])
def test_merge_batches_and_passes_match_sdpa(monkeypatch, dtype, D, splits, sinks):
    """fwd.merge_rows with more slices than a batch and more rows than a pass (tiles.merge_geometry), against
    SDPA, in one launch, the same bits whichever slice merges."""
    dt = NAMED_DTYPES[dtype]
    g = torch.Generator().manual_seed(3)
    H, Hkv, Sk, pos = 16, 2, 64 * splits, 64 * splits - 90   # the last slices are empty (past the position)
    q = torch.randn(1, H, 1, D, generator=g).to(dt)
    k = torch.randn(1, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(1, Hkv, Sk, D, generator=g).to(dt)
    sink_t = torch.linspace(-1.0, 2.0, H) if sinks else None
    q_pos = torch.tensor([pos])
    assert merge_trips(D, H // Hkv, splits) >= 4
    outs = []
    for reverse in (False, True):
        with monkeypatch.context() as mp:
            if reverse:
                _reversed_tickets(mp)
            with _run("gfx950") as ex:
                outs.append(attention(ex.put(q), ex.put(k), ex.put(v), num_splits=splits, q_pos=ex.put(q_pos),
                                      sinks=None if sink_t is None else ex.put(sink_t)).cpu())
            assert [ln.kernel.rsplit("_", 1)[0] for ln in ex.launches] == ["attention_fwd_kernel"]
    assert torch.equal(outs[0], outs[1])  # the merge adds in slice order, whoever merges
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(outs[0].float(), _sdpa(q, k, v, q_pos, sink_t), atol=atol, rtol=rtol)


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_decode_isa_is_one_kernel_without_spills(arch):
    """Llama-3-8B decode (H 32, KV heads 8, D 128, bf16, an 8k cache read up to q_pos) compiles to the
    one forward kernel, merge included (COMPILE_ONLY child, no GPU), with no spills and the VGPRs of
    2 waves per SIMD (measured: 184 on gfx942, 192 on gfx950, as before the merge)."""
    from translator_kernels.isa import TensorSpec, compile_isa

    q, kv = TensorSpec((1, 32, 1, 128), "bfloat16"), TensorSpec((1, 8, 8192, 128), "bfloat16")
    assert split_geometry(1, 32, 1, 8192, 128, "bf16", arch)[0] > 1
    got = compile_isa("translator_kernels.attention:attention", (q, kv, kv),
                      {"q_pos": TensorSpec((1,), "int64")}, arch=arch)
    assert [s.kernel.rsplit("_", 1)[0] for s in got.kernels] == ["attention_fwd_kernel"]
    meta = got.kernels[0].meta
    assert meta["vgpr_spill"] == 0 and meta["sgpr_spill"] == 0, meta
    assert meta["vgpr"] <= 256 and got.kernels[0].occupancy[0] >= 2, meta
    assert "global_atomic_add" in got.kernels[0].ops  # the ticket
