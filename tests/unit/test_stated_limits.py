"""What the attention and softmax rules' docstrings say they do NOT take, checked (issue 25, item 6):
a docstring that names a declined form is a claim, and each claim here runs through translate().

- attention_patterns: "A step in another order (a mask before the soft-cap, a scale on the mask) is
  declined", with "not taken by attention: <reason>" on the chain's rows; "Only what is not such a
  chain (a softmax over router logits @ experts) is NO_MATCH": no attention reason at all.
- attention_decompose: "Not for inputs no FlyDSL op takes (float64): the call then stays whole in
  PyTorch with the kernel's reason" (no bmm / softmax parts).
- attention_softmax: "a stand-alone hand-written softmax is left to the elementwise and reduce
  kernels": test_attention_audit.test_manual_softmax_outside_attention_is_left_alone.

On the reference backend (the matching is what is checked; the kernels have their own tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from translator import translate
from translator.lowerings.attention import PREFIX
from translator.tolerances import model_tol


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qkv(dtype=torch.float32):
    return tuple(_randn(1, 2, 8, 16, seed=i, dtype=dtype) for i in range(3))


def _declined(tm) -> list:
    """The attention reasons on the report's rows (a row's detail names what runs it, then the reason)."""
    return [r.detail[r.detail.index(PREFIX):] for r in tm.report.rows if PREFIX in r.detail]


class MaskBeforeCap(torch.nn.Module):
    def forward(self, q, k, v, mask):
        s = q @ k.transpose(-2, -1) * 0.25 + mask
        s = torch.tanh(s / 5.0) * 5.0
        return torch.softmax(s, -1) @ v


class ScaleOnTheMask(torch.nn.Module):
    def forward(self, q, k, v, mask):
        s = (q @ k.transpose(-2, -1) + mask) * 0.25
        return torch.softmax(s, -1) @ v


class RouterMix(torch.nn.Module):
    """A mixture-of-experts gate: softmax over router logits, then a product with expert outputs."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(16, 4)

    def forward(self, x, experts):
        return torch.softmax(self.router(x), -1).unsqueeze(-2) @ experts


def _check_declined(model, want):
    q, k, v = _qkv()
    mask = _randn(8, 8, seed=9)
    tm = translate(model, (q, k, v, mask), backend="reference")
    assert "attention" not in tm.report.counters, tm.report.counters
    got = _declined(tm)
    assert len(got) == 3 and all(want in d for d in got), got  # on the two products and the softmax
    torch.testing.assert_close(tm(q, k, v, mask), model(q, k, v, mask), **model_tol("fp32", "few_ops"))


def test_a_mask_before_the_soft_cap_is_declined_with_its_reason():
    _check_declined(MaskBeforeCap(), "before the soft-cap")


def test_a_scale_on_the_mask_is_declined_with_its_reason():
    _check_declined(ScaleOnTheMask(), "an additive mask is applied before the scale")


def test_a_softmax_that_is_no_attention_chain_gets_no_attention_reason():
    model, x, experts = RouterMix().eval(), _randn(3, 16), _randn(3, 4, 8, seed=1)
    tm = translate(model, (x, experts), backend="reference")
    assert _declined(tm) == [] and "attention" not in tm.report.counters
    torch.testing.assert_close(tm(x, experts), model(x, experts), **model_tol("fp32", "few_ops"))


class Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_float64_sdpa_stays_whole_with_the_kernels_reason():
    q, k, v = _qkv(torch.float64)
    tm = translate(Sdpa(), (q, k, v), backend="reference")
    (row,) = [r for r in tm.report.rows if r.op == "aten.scaled_dot_product_attention"]
    assert row.where == "pytorch" and row.detail.startswith(PREFIX), row
    assert not any(r.where.startswith("flydsl") for r in tm.report.rows), tm.report.rows  # no bmm / softmax parts
    torch.testing.assert_close(tm(q, k, v), Sdpa()(q, k, v))
