"""Partial rotary (GPT-NeoX's rotary_pct < 1) in the fused RoPE + K/V cache-write launch
(translator_kernels.layout.rope_cache, `rot`), on the session's executor.

Only each head's first `rot` features rotate (cos / sin span those); the rest pass through. Eager writes it
as `cat([rope(x[..., :rot]), x[..., rot:]], -1)`; the kernel stores the whole head: q rotated to a fresh
contiguous output, k into the cache at the positions, v's write in the same launch. Checked against that
eager form: the pass-through features exactly, the rotated ones with the project's tolerances."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.errors import KernelInputError
from translator_kernels.layout.rope_cache import rope_cache


def _partial(x, cos, sin, rot):
    xr, h = x[..., :rot].float(), rot // 2
    y = xr * cos.float() + torch.cat((-xr[..., h:], xr[..., :h]), -1) * sin.float()
    return torch.cat([y.to(x.dtype), x[..., rot:]], -1)


def _launches(ex):
    return [r.kernel.split("_kernel")[0] for r in ex.launches]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary_q_k_and_both_cache_writes_in_one_launch(dtype):
    b, s, h, d, rot, smax = 1, 2, 2, 16, 4, 8
    g = torch.Generator().manual_seed(0)
    # GPT-NeoX's fused projection: [B, S, H, 3 * D] viewed per head, then chunked into q, k, v
    qkv = torch.randn(b, s, h * 3 * d, generator=g).to(dtype)
    ang = torch.randn(b, 1, s, rot // 2, generator=g)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    pos = torch.tensor([3, 4])
    q, k, v = qkv.view(b, s, h, 3 * d).transpose(1, 2).chunk(3, -1)
    want_q = _partial(q, cos, sin, rot)
    want_k, want_v = torch.zeros(b, h, smax, d, dtype=dtype), torch.zeros(b, h, smax, d, dtype=dtype)
    want_k.index_copy_(2, pos, _partial(k, cos, sin, rot))
    want_v.index_copy_(2, pos, v)
    with executors.current().run("gfx942") as ex:
        kc, vc = ex.put(want_k * 0), ex.put(want_v * 0)
        qq, kk, vv = ex.put(qkv).view(b, s, h, 3 * d).transpose(1, 2).chunk(3, -1)
        outs = rope_cache([qq, kk], [ex.put(cos)] * 2, [ex.put(sin)] * 2, False, kc, [3, 2, 1, 0], vv, vc,
                          ex.put(pos), 2, rot=rot)
    assert _launches(ex) == ["rope_cache"]
    got_q = outs[0].cpu()
    assert got_q.shape == (b, h, s, d) and got_q.is_contiguous()  # the cat's layout
    tol = op_tol(dtype, "rope")
    torch.testing.assert_close(got_q, want_q, **tol)
    torch.testing.assert_close(kc.cpu(), want_k, **tol)
    assert torch.equal(got_q[..., rot:], q[..., rot:]) and torch.equal(kc.cpu()[..., rot:], want_k[..., rot:])
    assert torch.equal(vc.cpu(), want_v)


def test_partial_rotary_refuses_pairs_a_norm_and_a_rot_of_the_whole_head():
    x, cos = torch.randn(1, 2, 2, 8), torch.randn(1, 1, 2, 4)
    with pytest.raises(KernelInputError, match="partial rotary"):
        rope_cache([x], [cos], [cos], False, rot=8)
    with pytest.raises(KernelInputError, match="partial rotation"):
        rope_cache([x], [cos], [cos], False, norm_ws=[torch.ones(8)], rot=4)
    with pytest.raises(KernelInputError, match="do not broadcast"):
        rope_cache([x], [torch.randn(1, 1, 2, 2)], [torch.randn(1, 1, 2, 2)], False, rot=4)
