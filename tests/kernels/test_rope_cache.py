"""The fused RoPE + K/V cache-write kernel (translator_kernels.layout.rope_cache) on the session's
executor (tests/executors.py: flysim, or rocm on an AMD GPU).

One launch rotates q and k (rotate-half, interleaved pairs) read in place as column slices of a
QKV output, and writes the rotated k and v into static caches [B, Hkv, S_max, D] at the positions
(in place, the rest of the cache untouched); without a cache it returns q and k. Checked against
eager's math (bit-exact in fp32: the same products and sum), on gfx942 and gfx950."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator_kernels.errors import KernelInputError
from translator_kernels.layout.rope_cache import rope_cache


def _qkv(b, s, hq, hk, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, generator=g).to(dtype)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], -1)
    return qkv, q.view(b, s, hq, d), k.view(b, s, hk, d), v.view(b, s, hk, d)


def _half_ref(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def _pairs_ref(x, cos, sin):  # x [..., P, 2], cos / sin [..., P]
    return torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 1] * cos + x[..., 0] * sin], -1)


def _launches(ex):
    return [r.kernel.split("_kernel")[0] for r in ex.launches]


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_interleaved_rope_and_both_cache_writes_in_one_launch(arch):
    """gpt-fast's step: q, k [B, S, H, D/2, 2] views of the QKV output, a [S, D/2] table per position;
    k written as cache[:, :, pos] = k.transpose(1, 2), v likewise."""
    b, s, hq, hk, d, smax = 1, 3, 4, 2, 8, 10
    qkv, q, k, v = _qkv(b, s, hq, hk, d)
    q, k = q.unflatten(-1, (d // 2, 2)), k.unflatten(-1, (d // 2, 2))
    ang = torch.randn(s, d // 2)
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]  # [1, S, 1, P]
    pos = torch.tensor([5, 6, 7])
    kc0, vc0 = torch.randn(b, hk, smax, d), torch.randn(b, hk, smax, d)
    want_q = _pairs_ref(q, cos, sin)
    want_k, want_v = kc0.clone(), vc0.clone()
    want_k[:, :, pos] = _pairs_ref(k, cos, sin).flatten(3).transpose(1, 2)
    want_v[:, :, pos] = v.transpose(1, 2)
    with executors.current().run(arch) as ex:
        kc, vc = ex.put(kc0.clone()), ex.put(vc0.clone())
        x = ex.put(qkv)
        qq, kk, vv = (x[..., :hq * d], x[..., hq * d:(hq + hk) * d], x[..., (hq + hk) * d:])
        qq = qq.view(b, s, hq, d // 2, 2)
        kk = kk.view(b, s, hk, d // 2, 2)
        vv = vv.view(b, s, hk, d).transpose(1, 2)
        # R = [B, S, Hk, P, 2] contiguous; the region [B, Hk, S, D]: D innermost, then Hk, then S
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, True, kc, [3, 1, 2, 0], vv, vc,
                          ex.put(pos), 2)
    assert _launches(ex) == ["rope_cache"]
    assert len(outs) == 1 and torch.equal(outs[0].cpu(), want_q)
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_half_q_and_k_without_a_cache(dtype):
    """HF's plain forward: q, k [B, H, S, D] transposed views, cos / sin [B, 1, S, D]: both returned."""
    b, s, hq, hk, d = 2, 5, 4, 2, 16
    qkv, q, k, _ = _qkv(b, s, hq, hk, d, seed=1, dtype=dtype)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    ang = torch.randn(b, 1, s, d // 2)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    with executors.current().run("gfx950") as ex:
        x = ex.put(qkv)
        qq = x[..., :hq * d].view(b, s, hq, d).transpose(1, 2)
        kk = x[..., hq * d:(hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False)
    assert _launches(ex) == ["rope_cache"]
    for got, x in zip(outs, (q, k)):
        want = _half_ref(x.float(), cos.float(), sin.float()).to(dtype)
        assert got.is_contiguous() and got.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, atol=0 if dtype == torch.float32 else 1e-2, rtol=0 if
                                   dtype == torch.float32 else 1e-2)


def test_hf_static_cache_form_rotate_half_k_into_the_cache():
    """HF StaticCache: k_embed [B, Hk, S, D] index_copy_'d into the cache at cache_position."""
    b, s, hq, hk, d, smax = 1, 2, 4, 2, 8, 6
    qkv, q, k, v = _qkv(b, s, hq, hk, d, seed=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ang = torch.randn(b, 1, s, d // 2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    pos = torch.tensor([3, 4])
    want_k, want_v = torch.zeros(b, hk, smax, d), torch.zeros(b, hk, smax, d)
    want_k.index_copy_(2, pos, _half_ref(k, cos, sin))
    want_v.index_copy_(2, pos, v)
    with executors.current().run("gfx942") as ex:
        kc, vc = ex.put(torch.zeros(b, hk, smax, d)), ex.put(torch.zeros(b, hk, smax, d))
        x = ex.put(qkv)
        qq = x[..., :hq * d].view(b, s, hq, d).transpose(1, 2)
        kk = x[..., hq * d:(hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
        vv = x[..., (hq + hk) * d:].view(b, s, hk, d).transpose(1, 2)
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], vv, vc,
                          ex.put(pos), 2)
    assert _launches(ex) == ["rope_cache"]
    assert torch.equal(outs[0].cpu(), _half_ref(q, cos, sin))
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)


def test_bf16_out_dtype_and_a_bf16_cache_round_the_fp32_math_once():
    """out_dtype (rope_casts.py: a bf16 model's x.float() ... .type_as(x)): q returned in bf16, k stored in
    the bf16 cache, each the fp32 rotation of the bf16 inputs rounded once, as eager's cast of it."""
    b, s, hq, hk, d, smax = 1, 2, 4, 2, 8, 6
    qkv, q, k, _ = _qkv(b, s, hq, hk, d, seed=3, dtype=torch.bfloat16)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    ang = torch.randn(b, 1, s, d // 2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()  # fp32 tables
    pos = torch.tensor([1, 2])
    want_k = torch.zeros(b, hk, smax, d, dtype=torch.bfloat16)
    want_k.index_copy_(2, pos, _half_ref(k.float(), cos, sin).to(torch.bfloat16))
    with executors.current().run("gfx950") as ex:
        kc = ex.put(torch.zeros(b, hk, smax, d, dtype=torch.bfloat16))
        x = ex.put(qkv)
        qq = x[..., :hq * d].view(b, s, hq, d).transpose(1, 2)
        kk = x[..., hq * d:(hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], ids=ex.put(pos),
                          dim=2, out_dtype=torch.bfloat16)
    assert _launches(ex) == ["rope_cache"]
    want_q = _half_ref(q.float(), cos, sin).to(torch.bfloat16)
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0].cpu(), want_q)
    assert torch.equal(kc.cpu(), want_k)


def test_position_out_of_range_raises_and_bad_input_is_refused():
    b, s, hk, d = 1, 1, 2, 4
    k = torch.randn(b, s, hk, d // 2, 2)
    cos, sin = torch.ones(1, s, 1, d // 2), torch.zeros(1, s, 1, d // 2)
    with pytest.raises(IndexError, match="out of range"):
        with executors.current().run("gfx942") as ex:
            kc = ex.put(torch.zeros(b, hk, 4, d))
            rope_cache([ex.put(k)], [ex.put(cos)], [ex.put(sin)], True, kc, [3, 1, 2, 0], None, None,
                       ex.put(torch.tensor([9])), 2)
    assert float(kc.cpu().abs().sum()) == 0
    with pytest.raises(KernelInputError, match="interleaved pairs need x"):
        rope_cache([torch.randn(2, 3)], [torch.ones(2)], [torch.ones(2)], True)
    with pytest.raises(KernelInputError, match="k cache must be float32"):
        rope_cache([k], [cos], [sin], True, torch.zeros(b, hk, 4, d, dtype=torch.int32), [3, 1, 2, 0],
                   ids=torch.tensor([0]))
