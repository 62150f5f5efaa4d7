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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q_k_norm_rope_and_both_cache_writes_in_one_launch(dtype):
    b, s, hq, hk, d, smax, eps = 1, 2, 4, 2, 16, 8, 1e-6
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, generator=g).to(dtype)
    wq, wk = torch.randn(d, generator=g).to(dtype), torch.randn(d, generator=g).to(dtype)
    ang = torch.randn(b, 1, s, d // 2, generator=g)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    pos = torch.tensor([3, 4])
    q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in qkv.split([hq * d, hk * d, hk * d], -1))
    want_q = _half(_normed(q, wq, eps).float(), cos.float(), sin.float()).to(dtype)
    want_k, want_v = torch.zeros(b, hk, smax, d, dtype=dtype), torch.zeros(b, hk, smax, d, dtype=dtype)
    want_k.index_copy_(2, pos, _half(_normed(k, wk, eps).float(), cos.float(), sin.float()).to(dtype))
    want_v.index_copy_(2, pos, v)
    with executors.current().run("gfx942") as ex:
        kc, vc = ex.put(want_k * 0), ex.put(want_v * 0)
        x = ex.put(qkv)
        qq, kk, vv = (t.view(b, s, -1, d).transpose(1, 2) for t in x.split([hq * d, hk * d, hk * d], -1))
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], vv, vc,
                          ex.put(pos), 2, norm_ws=[ex.put(wq), ex.put(wk)], eps=eps)
    assert _launches(ex) == ["rope_cache"]
    tol = op_tol(dtype, "rope", reduction_length=d)
    torch.testing.assert_close(outs[0].cpu(), want_q, **tol)
    torch.testing.assert_close(kc.cpu(), want_k, **tol)
    assert torch.equal(vc.cpu(), want_v)


def test_a_norm_before_interleaved_pairs_is_refused():
    x = torch.randn(1, 2, 2, 4, 2)
    cos = torch.randn(1, 2, 1, 4)
    with pytest.raises(KernelInputError, match="rotate-half"):
        rope_cache([x], [cos], [cos], True, norm_ws=[torch.ones(2)])
