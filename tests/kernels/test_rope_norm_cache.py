"""RoPE with the per-head RMSNorm before it (Qwen3 / Gemma3's q_norm and k_norm) in the fused RoPE +
K/V cache-write launch (translator_kernels.layout.rope_cache, `norm_ws`), on the session's executor.

q and k are column slices of the QKV output read in place; each head row is normalized over head_dim
(`x * rsqrt(mean(x^2) + eps) * w` in fp32, rounded to x's dtype as flydsl.rms_norm returns it), then
rotated; k goes into the cache at the positions, v's write rides in the same launch. Checked against
torch's rms_norm then the rotation, with the project's tolerances (translator.tolerances.op_tol)."""

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.errors import KernelInputError
from translator_kernels.layout.rope_cache import rope_cache


def _half(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def _normed(x, w, eps):
    return F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype)


def _launches(ex):
    return [r.kernel.split("_kernel")[0] for r in ex.launches]


def _qwen3_layer(dtype, s, hq, hk, d, pos, smax=8, eps=1e-6):
    """Run the fused launch over a QKV output of s tokens; returns (executor, q out, k cache, v cache, the
    expected three)."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, s, (hq + 2 * hk) * d, generator=g).to(dtype)
    wq, wk = torch.randn(d, generator=g).to(dtype), torch.randn(d, generator=g).to(dtype)
    ang = torch.randn(1, 1, s, d // 2, generator=g)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    pos = torch.tensor(pos)
    q, k, v = (t.view(1, s, -1, d).transpose(1, 2) for t in qkv.split([hq * d, hk * d, hk * d], -1))
    want_q = _half(_normed(q, wq, eps).float(), cos.float(), sin.float()).to(dtype)
    want_k, want_v = torch.zeros(1, hk, smax, d, dtype=dtype), torch.zeros(1, hk, smax, d, dtype=dtype)
    if int(pos.max()) < smax:
        want_k.index_copy_(2, pos, _half(_normed(k, wk, eps).float(), cos.float(), sin.float()).to(dtype))
        want_v.index_copy_(2, pos, v)
    with executors.current().run("gfx942") as ex:
        kc, vc = ex.put(want_k * 0), ex.put(want_v * 0)
        x = ex.put(qkv)
        qq, kk, vv = (t.view(1, s, -1, d).transpose(1, 2) for t in x.split([hq * d, hk * d, hk * d], -1))
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], vv, vc,
                          ex.put(pos), 2, norm_ws=[ex.put(wq), ex.put(wk)], eps=eps)
    return ex, outs[0], kc, vc, (want_q, want_k, want_v)


# head rows: 16 lanes of a wave (a butterfly over them); 128 over 2 waves and 256 over 4 (the waves' sums
# through LDS), the last workgroups partly empty (3 heads x 3 tokens x 128 = 4.5 workgroups); 24 and 512 (no
# workgroup holds a row's threads: a workgroup per row)
SHAPES = [(2, 4, 2, 16), (3, 3, 1, 128), (2, 2, 1, 256), (3, 2, 1, 24), (1, 1, 1, 512)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"d{sh[-1]}" for sh in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q_k_norm_rope_and_both_cache_writes_in_one_launch(dtype, shape):
    s, hq, hk, d = shape
    ex, q, kc, vc, (want_q, want_k, want_v) = _qwen3_layer(dtype, s, hq, hk, d, list(range(3, 3 + s)))
    assert _launches(ex) == ["rope_cache"]
    tol = op_tol(dtype, "rope", reduction_length=d)
    torch.testing.assert_close(q.cpu(), want_q, **tol)
    torch.testing.assert_close(kc.cpu(), want_k, **tol)
    assert torch.equal(vc.cpu(), want_v)


def test_a_position_out_of_range_raises_with_the_norm():
    with pytest.raises(IndexError, match="out of range"):
        _qwen3_layer(torch.float32, 2, 2, 1, 128, [3, 8])


@pytest.mark.flysim_only("reads flysim's counted global bytes")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_element_is_loaded_once_for_its_row_sum(dtype):
    """A prefill of 16 tokens at Qwen3's head_dim 128: each q / k element's thread loads 6 values (x, its partner,
    cos, sin and their weights) and the row's sum comes from the row's threads; k's threads read their position
    (int64), v moves in 16-byte vectors with theirs. The per-thread row sum read head_dim + 6 values per element
    (19x these bytes in fp32, 17x in bf16)."""
    s, hq, hk, d = 16, 4, 2, 128
    ex, *_ = _qwen3_layer(dtype, s, hq, hk, d, list(range(s)), smax=16)
    (rec,) = ex.launches
    e, nqk, nk = torch.finfo(dtype).bits // 8, s * (hq + hk) * d, s * hk * d
    assert rec.counters["global_bytes_read"] == e * (6 * nqk + nk) + 8 * nk + 8 * (nk * e // 16)
    assert rec.counters["lds_bytes_read"] > 0 and not rec.counters["warnings"]


def test_the_compiled_kernel_loads_no_head_row_per_thread():
    """Vector-memory loads of Qwen3's decode launch (16 q heads, 8 K/V heads, head_dim 128): 15 in fp32 and bf16
    (x, its partner, cos, sin and two weights per rotation, the positions, v); the per-thread row sum compiled
    to 79 (fp32: the row in dwordx4 loads) and 271 (bf16)."""
    from translator_kernels.isa import compile_many
    from translator_kernels.layout.rope_cache import DECODE_STEP

    jobs = [(DECODE_STEP, (1, 16, 8, 128, 64), dict(norm=True, dtype=dt)) for dt in ("float32", "bfloat16")]
    for (_, _, kw), c in zip(jobs, compile_many(jobs, "gfx942")):
        assert sum(c.main.vmem_loads.values()) <= 16, (kw, c.main.vmem_loads)


def test_a_norm_before_interleaved_pairs_is_refused():
    x = torch.randn(1, 2, 2, 4, 2)
    cos = torch.randn(1, 2, 1, 4)
    with pytest.raises(KernelInputError, match="rotate-half"):
        rope_cache([x], [cos], [cos], True, norm_ws=[torch.ones(2)])
