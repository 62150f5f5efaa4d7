"""The small ops new model families left in PyTorch (issue 27 item 5): each lowered, with its
launches on flysim and numerics, or kept with the reason pinned here.

- `aten.square` (Qwen3 / OLMoE norms write `x.square()`), `torch.multiply` (mul's alias, kept by
  name in the export) and `aten.isnan` (HF mask code) join fused elementwise regions.
- `a & b` of bool masks (`aten.__and__`) was refused as an in-place op ("__and__" ends in "_").
- Meta-style RoPE through `view_as_complex` (complex multiplication) is lowered by the rope rules.
- Resampling (`upsample_nearest2d`, `upsample_bilinear2d`) is kept in PyTorch by design.
- `copy_` into recurrent state becomes flydsl.cache_write, and writes the state's one storage
  in place.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import flysim  # noqa: F401  (the flysim backend)
from translator import translate
from translator.tolerances import model_tol

FUSED = torch.ops.flydsl.fused_elementwise.default


def pytorch_rows(tm):
    return [(r.op, r.detail) for r in tm.report.rows if r.where == "pytorch" and not r.layout]


def run_flysim(model, inputs):
    tm = translate(model.eval(), inputs, backend="flysim")
    v = tm.report.verification
    assert v.passed, v.message
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol(check="few_ops"))
    assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


class SmallOps(nn.Module):
    def forward(self, x, y, mask):
        m = mask & (x > 0)  # __and__ of bool masks, m read twice
        s = torch.square(x) + x.square() * torch.multiply(x, y) + x.multiply(2.0)
        s = torch.where(torch.isnan(s), torch.zeros_like(s), s)
        return torch.where(m, s, -s) + m.float()


def test_square_multiply_isnan_and_join_a_fused_kernel():
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    x[0, 0] = float("nan")
    mask = torch.rand(4, 32) > 0.5
    tm = run_flysim(SmallOps(), (x, y, mask))
    assert pytorch_rows(tm) == []
    assert any(n.target is FUSED for n in tm.gm.graph.nodes)
    assert tm.report.counters["fused_elementwise_ops"] >= 8


class IntSquare(nn.Module):
    def forward(self, i):
        return torch.square(i) + torch.multiply(i, 3)


def test_integer_square_and_multiply_are_exact():
    i = torch.tensor([[3, -70000, 2 ** 20 + 1, 5]], dtype=torch.int64)
    tm = translate(IntSquare().eval(), (i,), backend="reference")
    assert pytorch_rows(tm) == []
    assert torch.equal(tm(i), IntSquare()(i))


class MetaRope(nn.Module):
    """Meta's Llama reference: apply_rotary_emb through view_as_complex (re-typed)."""

    def __init__(self, dim=16, seq=8):
        super().__init__()
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        f = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(f), f))

    def forward(self, xq):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        fc = self.freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
        return torch.view_as_real(xq_ * fc).flatten(3).type_as(xq)


def test_complex_rope_multiplication_is_lowered():
    tm = run_flysim(MetaRope(), (torch.randn(2, 8, 2, 16),))
    assert pytorch_rows(tm) == []
    assert not any("complex" in str(n.target) or "view_as" in str(n.target) for n in tm.gm.graph.nodes
                   if n.op == "call_function")


class Resample(nn.Module):
    def forward(self, x):
        up = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return torch.relu(up) + F.interpolate(x, scale_factor=2, mode="nearest")


def test_upsampling_is_kept_in_pytorch_by_design():
    tm = translate(Resample().eval(), (torch.randn(1, 2, 4, 4),), backend="reference")
    assert tm.report.verification.passed
    kept = dict(pytorch_rows(tm))
    assert kept == {"aten.upsample_bilinear2d": "kept in PyTorch by design",
                    "aten.upsample_nearest2d": "kept in PyTorch by design"}


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("state", torch.zeros(2, 8))

    def forward(self, x):
        h = torch.tanh(self.lin(x) + self.state)
        self.state.copy_(h)
        return h


def test_copy_into_recurrent_state_is_a_cache_write_in_place():
    import copy

    torch.manual_seed(0)
    m = Recurrent().eval()
    eager = copy.deepcopy(m)
    x = torch.randn(2, 8)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.verification.passed
    assert pytorch_rows(tm) == []  # copy_ into the state: flydsl.cache_write (the layout family's scatter)
    assert tm.report.summary()["flydsl_ops"].get("flydsl.cache_write") == 1
    state = tm.gm.get_buffer("state")
    ptr = state.data_ptr()
    with torch.no_grad():
        h1, h2 = tm(x), tm(x)  # the second call reads the state the first wrote
        torch.testing.assert_close(h1, eager(x), **model_tol(check="few_ops"))
        torch.testing.assert_close(h2, eager(x), **model_tol(check="few_ops"))
    assert state.data_ptr() == ptr and tm.gm.get_buffer("state") is state  # one storage, written in place
    torch.testing.assert_close(state, h2)
