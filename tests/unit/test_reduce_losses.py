"""Loss functions through their decompositions: each loss becomes fused elementwise +
reduction kernels (counter and kernel count asserted) and matches eager."""

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

import flysim  # noqa: F401
from translator import translate

RED = torch.ops.flydsl.fused_reduce.default
EW = torch.ops.flydsl.fused_elementwise.default


class Loss(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def kernels(tm):
    return sum(1 for n in tm.gm.graph.nodes if n.target in (RED, EW))


def run(fn, inputs, backend="reference"):
    model = Loss(fn).eval()
    tm = translate(model, inputs, backend=backend)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol(check="few_ops"))
    return tm


def xy(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


# (name, fn, inputs, kernels after fusion)
CASES = [
    ("mse", lambda x, y: F.mse_loss(x, y), xy(4, 9), 1),
    ("mse_sum", lambda x, y: F.mse_loss(x, y, reduction="sum"), xy(3, 5, 7), 1),
    ("l1", lambda x, y: F.l1_loss(x, y), xy(6, 10), 1),
    ("smooth_l1", lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), xy(4, 12), 1),
    ("huber_none", lambda x, y: F.huber_loss(x, y, reduction="none", delta=0.7), xy(4, 12), 1),
    ("kl_div", lambda x, y: F.kl_div(x, y, reduction="sum"), (torch.randn(4, 8).log_softmax(-1),
                                                              torch.rand(4, 8).softmax(-1)), 1),
    ("kl_div_log_target", lambda x, y: F.kl_div(x, y, reduction="mean", log_target=True),
     (torch.randn(4, 8), torch.randn(4, 8).log_softmax(-1)), 1),
    ("hinge", lambda x, y: F.hinge_embedding_loss(x, y, margin=0.8),
     (torch.randn(5, 6), torch.randint(0, 2, (5, 6)).float() * 2 - 1), 1),
    ("triplet", lambda a, p, n: F.triplet_margin_loss(a, p, n, margin=0.5), (*xy(6, 16), torch.randn(6, 16)), 3),
]


@pytest.mark.parametrize("name,fn,inputs,n_kernels", CASES, ids=[c[0] for c in CASES])
def test_loss_decomposes_into_fused_kernels(name, fn, inputs, n_kernels):
    tm = run(fn, inputs)
    assert any(k.startswith("loss_") for k in tm.report.counters), tm.report.counters
    assert kernels(tm) == n_kernels, [str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"]


def test_cross_entropy_class_indices_and_ignore_index():
    x = torch.randn(8, 11)
    t = torch.randint(0, 11, (8,))
    t[2] = -100
    tm = run(lambda x, t: F.cross_entropy(x, t), (x, t))
    assert tm.report.counters["loss_cross_entropy"] == 1
    assert tm.report.counters["reduce_logsumexp"] == 1
    run(lambda x, t: F.cross_entropy(x, t, reduction="sum", ignore_index=3), (torch.randn(2, 5, 4),
                                                                              torch.randint(0, 5, (2, 4))))


def test_cross_entropy_probability_targets():
    x = torch.randn(6, 9)
    t = torch.rand(6, 9).softmax(-1)
    tm = run(lambda x, t: F.cross_entropy(x, t), (x, t))
    assert tm.report.counters["loss_cross_entropy"] == 1


def test_unsupported_forms_keep_a_reason():
    model = Loss(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)).eval()
    tm = translate(model, (torch.randn(4, 5), torch.randint(0, 5, (4,))), backend="reference")
    assert tm.report.verification.passed
    assert any("label_smoothing" in r.detail for r in tm.report.rows), [r.detail for r in tm.report.rows]


@pytest.mark.parametrize("name", ["mse", "triplet", "kl_div"])
def test_losses_on_flysim(name):
    _, fn, inputs, n_kernels = next(c for c in CASES if c[0] == name)
    tm = run(fn, inputs, backend="flysim")
    assert kernels(tm) == n_kernels
    assert len(tm.last_launches) == n_kernels, "the FlyDSL kernels did not run"


def test_cross_entropy_on_flysim():
    x, t = torch.randn(8, 40), torch.randint(0, 40, (8,))
    tm = run(lambda x, t: F.cross_entropy(x, t), (x, t), backend="flysim")
    assert len(tm.last_launches) >= 2


def test_large_mse_mean_in_two_stages_on_flysim():
    """A global mean over 76800 elements (> one workgroup's row): one fused_reduce node whose
    kernel runs in two launches (chunk partials, then the partials)."""
    x, y = xy(4, 3, 80, 80, seed=3)
    tm = run(lambda x, y: F.mse_loss(x, y), (x, y), backend="flysim")
    assert kernels(tm) == 1 and tm.report.counters["reduce_prologue_fused"] == 1
    assert len(tm.last_launches) == 2
