"""The attention kernel on a static KV cache (causal by positions read on the device) and with
attention sinks, on the session's executor (tests/executors.py: flysim, or rocm on an AMD GPU):
launches and numerics against an fp32 torch reference, tolerances from the project table; the test
of the bytes read is flysim_only (flysim counts them).

q_pos: key k is visible to query row i iff k <= q_pos[i] (gpt-fast's `causal_mask[None, None,
input_pos]`); K / V are the whole [B, Hkv, S_max, D] cache, whose keys past the current length
hold garbage that must never reach the output (here: huge values; a NaN there would reach eager's
output too, through 0 * NaN in p @ v)."""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tolerance
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.attention import attention, split_geometry
from translator_kernels.errors import KernelInputError


def _run(arch):
    return executors.current().run(arch)


def ref(q, k, v, pos=None, sinks=None, causal=False):
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = q.float() @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    sk = k.shape[2]
    if pos is not None:
        keep = torch.arange(sk)[None, :] <= pos.reshape(-1, 1).long()
        s = s.masked_fill(~keep, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        col = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return p.nan_to_num(0.0) @ v


def _cache(B, Hkv, S_max, D, length, dt, g):
    """A static cache whose first `length` keys are written; the rest hold what must not be read."""
    k = torch.randn(B, Hkv, S_max, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, S_max, D, generator=g).to(dt)
    k[:, :, length:] = 1e4
    v[:, :, length:] = -1e4
    return k, v


def _names(launches):
    return [ln.kernel.rsplit("_", 1)[0] for ln in launches]


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("dtype,pos_dtype,S_max,cur", [("f32", torch.int64, 64, 9), ("bf16", torch.int32, 256, 150)])
def test_decode_reads_the_cache_up_to_the_position(arch, dtype, pos_dtype, S_max, cur):
    g = torch.Generator().manual_seed(0)
    dt = NAMED_DTYPES[dtype]
    q = torch.randn(1, 4, 1, 64, generator=g).to(dt)
    k, v = _cache(1, 2, S_max, 64, cur + 1, dt, g)
    pos = torch.tensor([cur], dtype=pos_dtype)
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]  # split or not: the combine is inside the launch
    assert out.isfinite().all()
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), ref(q, k[:, :, :cur + 1], v[:, :, :cur + 1]), atol=atol, rtol=rtol)


@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_long_decode_splits_and_reads_only_the_written_keys():
    """S_max 1024, current length 300: split KV applies (slices past the length are empty), and the
    kernel reads the written keys' tiles, not the cache: flysim counts 155,712 bytes read against
    327,744 for the same call over all 1024 keys (the 2 query heads share one block, GQA packing:
    K / V once; besides the keys' tiles, both calls read the slices' Q and positions and the last
    slice's read-back of the partials and the tickets: the merge runs inside this one launch)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 1, 64, generator=g).to(torch.bfloat16)
    k, v = _cache(1, 1, 1024, 64, 300, torch.bfloat16, g)
    pos = torch.tensor([299])
    with _run("gfx942") as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos)).cpu()
    sim = list(ex.launches)
    assert _names(sim) == ["attention_fwd_kernel"] and split_geometry(1, 2, 1, 1024, 64, "bf16", "gfx942")[0] > 1
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(out.float(), ref(q, k[:, :, :300], v[:, :, :300]), atol=atol, rtol=rtol)
    with _run("gfx942") as ex:
        attention(ex.put(q), ex.put(k), ex.put(v))
    whole = list(ex.launches)
    got, every_key = (s[0].counters["global_bytes_read"] for s in (sim, whole))
    assert got < 0.5 * every_key, (got, every_key)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_prefill_into_the_cache_by_positions(arch):
    """A chunk of 40 query rows at positions 20..59 of a 128-key cache (4 waves, LDS path): each row
    sees the keys up to its own position, the loop stops at the block's largest."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 40, 32, generator=g).to(torch.bfloat16)
    k, v = _cache(1, 2, 128, 32, 60, torch.bfloat16, g)
    pos = torch.arange(20, 60)
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(out.float(), ref(q, k[:, :, :60], v[:, :, :60], pos=pos), atol=atol, rtol=rtol)


def test_unordered_positions_are_exact():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 5, 16, generator=g)
    k, v = _cache(1, 1, 32, 16, 32, torch.float32, g)
    pos = torch.tensor([7, 2, 30, 0, 15])
    with _run("gfx942") as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]
    atol, rtol = op_tolerance(torch.float32, "attention")
    torch.testing.assert_close(out, ref(q, k, v, pos=pos), atol=atol, rtol=rtol)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("dtype,Sq,causal,splits", [("bf16", 64, True, None), ("f32", 1, False, 4), ("bf16", 17, False, None)])
def test_sinks_join_the_denominator(arch, dtype, Sq, causal, splits):
    g = torch.Generator().manual_seed(4)
    dt = NAMED_DTYPES[dtype]
    q = torch.randn(1, 4, Sq, 64, generator=g).to(dt)
    sk = 256 if splits else 64
    k = torch.randn(1, 2, sk, 64, generator=g).to(dt)
    v = torch.randn(1, 2, sk, 64, generator=g).to(dt)
    sinks = torch.tensor([-2.0, 0.5, 3.0, 40.0])  # the last dwarfs every score: its head's output ~ 0
    with _run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), causal=causal, sinks=ex.put(sinks), num_splits=splits).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]  # split KV (splits=4): combined in the launch
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), ref(q, k, v, sinks=sinks, causal=causal), atol=atol, rtol=rtol)


def test_bad_positions_and_sinks_are_named():
    q = torch.randn(1, 2, 3, 16)
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(KernelInputError, match="q_pos"):
        attention(q, k, v, q_pos=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(KernelInputError, match="one position per query row"):
        attention(q, k, v, q_pos=torch.tensor([1, 2]))
    with pytest.raises(KernelInputError, match="causal=True and q_pos"):
        attention(q, k, v, causal=True, q_pos=torch.tensor([1, 2, 3]))
    with pytest.raises(KernelInputError, match="sinks"):
        attention(q, k, v, sinks=torch.zeros(3))
