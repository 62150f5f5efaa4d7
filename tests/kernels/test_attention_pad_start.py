"""The attention kernel on a left-padded batch (`k_start`: row b's keys start at k_start[b]), on the session's
executor (tests/executors.py): launches and numerics against an fp32 torch reference.

The pads of each row (the keys before its start) hold NaN in these caches: a kernel that loaded one would
carry it into the output (0 * NaN in p @ v), so a finite output that matches the reference shows they were
never read. Decode (one query row, GQA packed, with and without split KV) and a prefill chunk on the LDS path
(4 waves, starts not on a tile boundary, query rows of pads whose keys are all masked: written as 0, as SDPA).
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tolerance
from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.attention import attention
from translator_kernels.errors import KernelInputError
from test_attention_cache import _cache, _names  # tests/kernels/test_attention_cache.py


def ref(q, k, v, pos, start):
    """SDPA's math with the mask (key <= pos[i]) & (key >= start[b]); a row with no key gives 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().nan_to_num().repeat_interleave(rep, 1), v.float().nan_to_num().repeat_interleave(rep, 1)
    kidx = torch.arange(k.shape[2])
    keep = (kidx[None, None, None, :] <= pos.reshape(1, 1, -1, 1)) & (kidx >= start.reshape(-1, 1, 1, 1))
    s = (q.float() @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def _padded_cache(B, Hkv, S_max, D, start, length, dt, g):
    """K / V with row b's keys start[b] .. length - 1 written; its pads (before start[b]) NaN, the keys past the
    length huge: neither may reach the output."""
    k, v = _cache(B, Hkv, S_max, D, length, dt, g)
    for b, s in enumerate(start.tolist()):
        k[b, :, :s] = float("nan")
        v[b, :, :s] = float("nan")
    return k, v


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("dtype,splits", [("f32", None), ("bf16", 4)])
def test_decode_skips_each_rows_pads(arch, dtype, splits):
    g = torch.Generator().manual_seed(0)
    dt = NAMED_DTYPES[dtype]
    start = torch.tensor([0, 3, 70])  # 70: the pads cover the first split slices of that row
    cur = 100
    q = torch.randn(3, 4, 1, 64, generator=g).to(dt)
    k, v = _padded_cache(3, 2, 128, 64, start, cur + 1, dt, g)
    pos = torch.tensor([cur])
    with executors.current().run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos), k_start=ex.put(start),
                        num_splits=splits).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]
    assert out.isfinite().all()
    atol, rtol = op_tolerance(dt, "attention")
    torch.testing.assert_close(out.float(), ref(q, k, v, pos, start), atol=atol, rtol=rtol)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_prefill_chunk_with_pads_on_the_lds_path(arch):
    """40 query rows at positions 0..39 (4 waves, K / V through LDS); row 1's first 13 keys are pads, so its
    query rows 0..12 see no key: 0, as SDPA writes a fully masked row."""
    g = torch.Generator().manual_seed(1)
    start = torch.tensor([0, 13], dtype=torch.int32)
    q = torch.randn(2, 2, 40, 32, generator=g).to(torch.bfloat16)
    k, v = _padded_cache(2, 2, 64, 32, start, 40, torch.bfloat16, g)
    pos = torch.arange(40)
    with executors.current().run(arch) as ex:
        out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(pos), k_start=ex.put(start)).cpu()
    assert _names(ex.launches) == ["attention_fwd_kernel"]
    assert out.isfinite().all() and not out[1, :, :13].any()
    atol, rtol = op_tolerance(torch.bfloat16, "attention")
    torch.testing.assert_close(out.float(), ref(q, k, v, pos, start), atol=atol, rtol=rtol)


def test_bad_key_starts_are_named():
    q = torch.randn(2, 2, 3, 16)
    k = v = torch.randn(2, 2, 8, 16)
    with pytest.raises(KernelInputError, match="k_start must be an int32 / int64"):
        attention(q, k, v, k_start=torch.tensor([1.0, 2.0]))
    with pytest.raises(KernelInputError, match="one first key per batch row"):
        attention(q, k, v, k_start=torch.tensor([1, 2, 3]))
    with pytest.raises(KernelInputError, match="mask and k_start both"):
        attention(q, k, v, mask=torch.ones(8, dtype=torch.bool), k_start=torch.tensor([0, 1]))


@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_a_rows_pads_are_not_read():
    """A decode step at position 999 of a 1024-slot cache whose row starts at key 700: the launch reads the K / V
    of the 300 real keys' tiles, not of the 700 pads (flysim's bytes read against the same step with no pads)."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 1, 64, generator=g).to(torch.bfloat16)
    k, v = _padded_cache(1, 1, 1024, 64, torch.tensor([0]), 1000, torch.bfloat16, g)
    read = {}
    for start in (0, 700):
        with executors.current().run("gfx942") as ex:
            out = attention(ex.put(q), ex.put(k), ex.put(v), q_pos=ex.put(torch.tensor([999])),
                            k_start=ex.put(torch.tensor([start]))).cpu()
        atol, rtol = op_tolerance(torch.bfloat16, "attention")
        torch.testing.assert_close(out.float(), ref(q, k, v, torch.tensor([999]), torch.tensor([start])), atol=atol,
                                   rtol=rtol)
        read[start] = ex.launches[0].counters["global_bytes_read"]
    kv_pads = 2 * 700 * 64 * 2  # K and V of the pads, bf16
    assert read[0] - read[700] > 0.9 * kv_pads, read
