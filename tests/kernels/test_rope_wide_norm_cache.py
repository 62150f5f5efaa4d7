"""RoPE with an RMSNorm over all heads of a token before it (OLMo2's q_norm / k_norm: the norm runs over the
projection's whole row, num_heads x head_dim, before the split into heads) in the fused RoPE + K/V cache-write
launch (translator_kernels.layout.rope_cache, `norm_ws` with `norm_dims`), on the session's executor.

One workgroup per norm row: its threads sum the row's squares, the workgroup adds them (wave butterflies and
LDS), then each thread normalizes (`x * rsqrt(mean(x^2) + eps) * w`, fp32, rounded to x's dtype as flydsl.rms_norm
returns it) and rotates its elements; k goes into the cache, v's write rides in the same launch. Rows longer
than the workgroup's 256 threads (q: 4 heads x 80 = 320, 4 x 128 = 512) and shorter (k: 2 x 80 = 160), whole
multiples of it and not. Checked against torch's rms_norm over the whole row, then the rotation."""

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


def _launches(ex):
    return [r.kernel.split("_kernel")[0] for r in ex.launches]


@pytest.mark.parametrize("dtype,hq,hk,d", [(torch.float32, 4, 2, 80), (torch.bfloat16, 4, 2, 128)])
def test_all_heads_norm_rope_and_both_cache_writes_in_one_launch(dtype, hq, hk, d):
    b, s, smax, eps = 1, 2, 8, 1e-6
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, generator=g).to(dtype)
    wq, wk = torch.randn(hq * d, generator=g).to(dtype), torch.randn(hk * d, generator=g).to(dtype)
    ang = torch.randn(b, 1, s, d // 2, generator=g)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    pos = torch.tensor([3, 4])
    q, k, v = qkv.split([hq * d, hk * d, hk * d], -1)
    qn = F.rms_norm(q.float(), (hq * d,), wq.float(), eps).to(dtype)  # OLMo2: the norm over the whole row
    kn = F.rms_norm(k.float(), (hk * d,), wk.float(), eps).to(dtype)
    heads = lambda t: t.view(b, s, -1, d).transpose(1, 2)  # noqa: E731
    want_q = _half(heads(qn).float(), cos.float(), sin.float()).to(dtype)
    want_k, want_v = torch.zeros(b, hk, smax, d, dtype=dtype), torch.zeros(b, hk, smax, d, dtype=dtype)
    want_k.index_copy_(2, pos, _half(heads(kn).float(), cos.float(), sin.float()).to(dtype))
    want_v.index_copy_(2, pos, heads(v))
    with executors.current().run("gfx942") as ex:
        kc, vc = ex.put(want_k * 0), ex.put(want_v * 0)
        qq, kk, vv = (heads(t) for t in ex.put(qkv).split([hq * d, hk * d, hk * d], -1))
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], vv, vc,
                          ex.put(pos), 2, norm_ws=[ex.put(wq), ex.put(wk)], eps=eps, norm_dims=[1, 3])
    assert _launches(ex) == ["rope_cache"]
    tol = op_tol(dtype, "rope", reduction_length=hq * d)
    torch.testing.assert_close(outs[0].cpu(), want_q, **tol)
    torch.testing.assert_close(kc.cpu(), want_k, **tol)
    assert torch.equal(vc.cpu(), want_v)


def test_norm_dims_must_end_with_the_head_dim():
    x, cos = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(KernelInputError, match="ending with its last"):
        rope_cache([x], [cos], [cos], False, norm_ws=[torch.ones(16)], norm_dims=[3, 1])
    with pytest.raises(KernelInputError, match="norm row's length"):
        rope_cache([x], [cos], [cos], False, norm_ws=[torch.ones(8)], norm_dims=[1, 3])
