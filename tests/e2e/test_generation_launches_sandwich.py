"""Gemma's sandwich norms (norm_sandwich.py): a post-norm of a sublayer's output, the residual add and the next
pre-norm as one `norm_add_rms_norm` launch; OLMo2's post-norm and residual add (no pre-norm) as one `norm_add`.
Written by hand as Gemma / OLMo2 write their blocks; a sum only the next norm reads (Gemma's last layer before
the final norm) is the same launch, its sum unread. Near misses keep their form: the post-norm also read
elsewhere, a final norm of a view of the sum (the post-norm and add then one `norm_add`), a residual that broadcasts. Each: the
counter, the FlyDSL nodes (reference) or the recorded launch (flysim), eager's numbers. The HF models' counts:
tests/e2e/test_generation_launches.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import translator
from translator.tolerances import model_tol


class Sandwich(torch.nn.Module):
    """h = r + post(x); return (h, pre(h)). form "gemma"; "leak": post(x) also returned; "no_stream": only pre(h)
    returned (h read by the pre-norm alone: a final norm); "final_view": as no_stream, the norm reads a view of h;
    "olmo2": h alone (no pre-norm); "broadcast": h alone with r of one row broadcast over x's."""

    def __init__(self, form="gemma", n=64):
        super().__init__()
        self.form = form
        self.w0, self.w1 = torch.nn.Parameter(torch.randn(n)), torch.nn.Parameter(torch.randn(n))

    def forward(self, x, r):
        p = F.rms_norm(x, (x.shape[-1],), self.w0, 1e-6)
        h = r + p
        y = F.rms_norm(h if self.form != "final_view" else h.view(-1, x.shape[-1]), (x.shape[-1],), self.w1, 1e-6)
        if self.form == "leak":
            return h, y, p
        if self.form in ("olmo2", "broadcast"):
            return h
        return y if self.form in ("no_stream", "final_view") else (h, y)


def _flydsl_nodes(tm):
    return [str(n.target).split(".")[1] for n in tm.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("flydsl.")]


@pytest.mark.parametrize("form,nodes", [("gemma", ["norm_add_rms_norm"]), ("leak", ["rms_norm", "add_rms_norm"]),
                                        ("no_stream", ["norm_add_rms_norm"]), ("final_view", ["norm_add", "rms_norm"]),
                                        ("olmo2", ["norm_add"]),
                                        ("broadcast", ["rms_norm", "fused_elementwise"])])
def test_post_norm_add_and_pre_norm_fold_only_in_the_sandwich_form(form, nodes):
    torch.manual_seed(0)
    model, x = Sandwich(form).eval(), torch.randn(2, 3, 64)
    r = torch.randn(64) if form == "broadcast" else torch.randn(2, 3, 64)
    tm = translator.translate(model, (x, r), backend="reference")
    assert tm.report.counters.get("norm_sandwich") == (1 if form in ("gemma", "no_stream") else None), \
        tm.report.counters
    assert tm.report.counters.get("norm_add") == (1 if form in ("final_view", "olmo2") else None), tm.report.counters
    assert _flydsl_nodes(tm) == nodes, _flydsl_nodes(tm)
    with torch.no_grad():
        got, want = tm(x, r), model(x, r)
    single = form in ("no_stream", "final_view", "olmo2", "broadcast")
    for g, w in zip(*(([got], [want]) if single else (got, want))):
        assert g.stride() == w.stride()
        torch.testing.assert_close(g, w, **model_tol())


@pytest.mark.parametrize("form,family", [("olmo2", "norm_add"), ("no_stream", "norm_add_rms_norm")])
def test_flysim_post_norm_and_add_is_one_launch(form, family):
    """OLMo2's post-norm and add; Gemma's last layer: its post-feedforward norm, the add and the model's final norm
    (the sum read by that norm alone)."""
    torch.manual_seed(0)
    model, x, r = Sandwich(form).eval(), torch.randn(2, 3, 64), torch.randn(2, 3, 64)
    tm = translator.translate(model, (x, r), backend="flysim")
    with torch.no_grad():
        got, want = tm(x, r), model(x, r)
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [(family, 1)], tm.last_calls
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, **model_tol())


def test_flysim_sandwich_norm_is_one_launch():
    torch.manual_seed(0)
    model, x, r = Sandwich().eval(), torch.randn(2, 3, 64), torch.randn(2, 3, 64)
    tm = translator.translate(model, (x, r), backend="flysim")
    with torch.no_grad():
        got, want = tm(x, r), model(x, r)
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [("norm_add_rms_norm", 1)], tm.last_calls
    assert [ln.kernel.split("_kernel")[0] for ln in tm.last_launches] == ["row_norm"]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol())

