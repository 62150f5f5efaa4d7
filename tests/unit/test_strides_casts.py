"""The stride contract for the generated elementwise kernels (docs/strides.md): the precision casts
and every fused pointwise region return the strides eager's `_to_copy` (preserve_format) and
pointwise ops (TensorIterator) give, so a `view` that eager's layout allows keeps working.

Before: `flydsl.fused_elementwise` wrote contiguous outputs. Under `precision="bf16"` the cast of
attention's [B, S, H, D]-ordered output back to fp32 came out contiguous, and the model's
`y.transpose(1, 2).contiguous().view(B, S, D)` (export keeps only the view) raised "view size is
not compatible with input tensor's size and stride" on flysim; `fix_strides` did not see it, since
the cast is the translator's own node with no captured layout to compare with.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import translator
from translator import passes, runtime
from translator.layouts import same_layout
from translator.tolerances import model_tol
from translator_kernels.program import Program

flysim = pytest.importorskip("flysim")


def _cast(dt):
    return Program(1, (("cast", (0,), ("bf16" if dt == torch.bfloat16 else "f32",)),),
                   ((1, "bf16" if dt == torch.bfloat16 else "f32"),)).text()


ADD = Program(2, (("add", (0, 1), ()),), ((2, "f32"),)).text()


def _base(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# (inputs, program, eager's op): transposed, permuted 4-D ([B, S, H, D] memory of a [B, H, S, D]
# value), a non-dense column slice viewed transposed, broadcasts against a transposed input
CASES = {
    "cast_transposed": ([_base(8, 5).t()], _cast(torch.bfloat16), lambda a: a.to(torch.bfloat16)),
    "cast_bshd": ([_base(2, 6, 4, 8).to(torch.bfloat16).transpose(1, 2)], _cast(torch.float32), lambda a: a.float()),
    "cast_slice_transposed": ([_base(2, 6, 4, 16)[..., :8].transpose(1, 2)], _cast(torch.bfloat16),
                              lambda a: a.to(torch.bfloat16)),
    "add_transposed_row": ([_base(2, 6, 4, 8).transpose(1, 2), _base(8)], ADD, lambda a, b: a + b),
    "add_row_transposed": ([_base(8), _base(2, 6, 4, 8).transpose(1, 2)], ADD, lambda a, b: a + b),
    "add_mixed_orders": ([_base(5, 3).t(), _base(3, 5)], ADD, lambda a, b: a + b),
}


@pytest.mark.parametrize("backend", ["reference", "flysim"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_kernel_returns_eager_strides(name, backend):
    inputs, program, eager = CASES[name]
    want = eager(*inputs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        (fake,) = torch.ops.flydsl.fused_elementwise([mode.from_tensor(t) for t in inputs], program)
    with runtime.use_backend(backend, "gfx942") as st:
        (got,) = torch.ops.flydsl.fused_elementwise(inputs, program)
    if backend == "flysim":
        assert st.launches, "no generated kernel launched"
    assert want.stride() != tuple(want.contiguous().stride()), "the case must test a non-contiguous layout"
    assert same_layout(got, want), f"{name}: strides {got.stride()}, eager's {want.stride()}"
    assert same_layout(fake, want), f"{name}: fake strides {fake.stride()}, eager's {want.stride()}"
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # casts and one add round once, like eager


class AttnCastView(torch.nn.Module):
    """An fp32 attention block whose transposed output is merged by `view` (gpt-fast's form). Under
    precision="bf16" attention runs in bf16 and its output is cast back to fp32 by a generated
    kernel; the scale after the view keeps that cast from being a round trip the cast pass removes."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return y.transpose(1, 2).contiguous().view(B, S, D) * 2


def test_precision_cast_feeds_a_view_on_flysim():
    torch.manual_seed(0)
    m, x = AttnCastView().eval(), torch.randn(2, 8, 64)
    tm = translator.translate(m, (x,), precision="bf16", backend="flysim", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        want, got = m(x), tm(x)
    fams = [c.family for c in tm.last_calls if c.launches]
    assert "attention" in fams and "fused_elementwise" in fams, fams
    assert same_layout(got, want)
    torch.testing.assert_close(got, want, **model_tol("bf16"))  # bf16 attention and projection


def _gptfast():
    from gptfast_model import build

    m = build(n_layer=1)
    return m, (torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0)), torch.arange(8))


def test_gptfast_bf16_without_the_cast_pass_on_flysim(monkeypatch):
    """The decoder that first showed it: with the cast round-trip pass off, the bf16 -> fp32 cast
    after attention stays a kernel in front of the view, and the model runs and matches eager."""
    monkeypatch.setattr(passes, "PIPELINE", [(n, f) for n, f in passes.PIPELINE if not n.startswith("cast_round")])
    m, x = _gptfast()
    with torch.no_grad():
        want = m(*x)
    m, x = _gptfast()  # a fresh cache: the eager call above wrote the user's
    tm = translator.translate(m, x, precision="bf16", backend="flysim", dynamic_shapes=None)
    assert "cast_round_trip" not in tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        got = tm(*x)
    assert any(c.family == "attention" and c.launches for c in tm.last_calls)
    assert any(c.family == "fused_elementwise" and c.launches for c in tm.last_calls)
    torch.testing.assert_close(got, want, **model_tol("bf16"))
