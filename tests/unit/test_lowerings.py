"""Each canonical lowering: the rewrite fired (counter + flydsl node in the graph) and the
translated module matches eager on the reference backend."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate
from translator_kernels.gemm.preshuffle import shuffle_weight


def flydsl_ops(tm):
    return sorted(n.target._opname for n in tm.gm.graph.nodes
                  if n.op == "call_function" and getattr(n.target, "namespace", "") == "flydsl")


def check(model, inputs, counter, ops, **kw):
    torch.manual_seed(0)
    model.eval()
    tm = translate(model, inputs, backend="reference", **kw)
    assert tm.report.counters.get(counter, 0) >= 1, tm.report.counters
    assert all(o in flydsl_ops(tm) for o in ops), flydsl_ops(tm)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs), model(*inputs), **model_tol())
    return tm


class Fn(nn.Module):
    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            setattr(self, k, nn.Parameter(v))

    def forward(self, *xs):
        return self.fn(self, *xs)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    m = nn.Sequential(nn.Linear(40, 24, bias=bias))
    tm = check(m, (torch.randn(3, 5, 40),), "linear", ["gemm"])
    # the weight is stored preshuffled (padded to 32 x 64), and the reference computes from that copy
    ws = [b for name, b in tm.gm.named_buffers() if name.startswith("_flydsl_w")]
    assert len(ws) == 1 and ws[0].shape == (32, 64)
    torch.testing.assert_close(ws[0], shuffle_weight(m[0].weight.detach()))


def test_addmm_with_transposed_weight():
    m = Fn(lambda s, x: torch.addmm(s.b, x, s.w.t()), w=torch.randn(24, 40), b=torch.randn(24))
    check(m, (torch.randn(7, 40),), "addmm", ["gemm"])


def test_mm_parameter_and_activation():
    m = Fn(lambda s, x, y: torch.mm(x, s.w) + torch.mm(x, y), w=torch.randn(40, 24))
    tm = check(m, (torch.randn(7, 40), torch.randn(40, 24)), "mm", ["bmm", "gemm"])
    assert tm.report.counters["mm"] == 2


@pytest.mark.parametrize("shape_a,shape_b", [((5, 16), (16, 9)), ((2, 5, 16), (2, 16, 9)),
                                             ((2, 3, 5, 16), (2, 3, 16, 9)), ((2, 3, 5, 16), (16, 9))])
def test_matmul_activations(shape_a, shape_b):
    m = Fn(lambda s, a, b: a @ b)
    check(m, (torch.randn(shape_a), torch.randn(shape_b)), "matmul", ["bmm"])


def test_matmul_parameter_becomes_gemm():
    m = Fn(lambda s, x: x @ s.w, w=torch.randn(16, 12))
    check(m, (torch.randn(2, 5, 16),), "matmul", ["gemm"])


def test_bmm():
    m = Fn(lambda s, a, b: torch.bmm(a, b))
    check(m, (torch.randn(3, 5, 16), torch.randn(3, 16, 7)), "bmm", ["bmm"])


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_any_dim(dim):
    check(Fn(lambda s, x: torch.softmax(x, dim)), (torch.randn(4, 6, 33),), "softmax", ["softmax"])


def test_log_softmax():
    check(Fn(lambda s, x: F.log_softmax(x, -1)), (torch.randn(4, 33),), "log_softmax", ["softmax"])


def test_softmax_with_dtype_upcast():
    m = Fn(lambda s, x: torch.softmax(x, -1, dtype=torch.float32))
    x = torch.randn(4, 33).to(torch.bfloat16)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.counters["softmax"] == 1
    assert tm(x).dtype == torch.float32
    torch.testing.assert_close(tm(x), m(x))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    check(nn.LayerNorm(48, elementwise_affine=affine), (torch.randn(3, 5, 48),), "layer_norm", ["layer_norm"])


def test_rms_norm():
    check(nn.RMSNorm(48, eps=1e-6), (torch.randn(3, 5, 48),), "rms_norm", ["rms_norm"])


def test_rms_norm_default_eps():
    check(Fn(lambda s, x: F.rms_norm(x, (48,), s.w), w=torch.randn(48)), (torch.randn(3, 48),), "rms_norm", ["rms_norm"])


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "float_mask", "gqa", "scale"])
def test_sdpa(kind):
    q = torch.randn(2, 4, 9, 32)
    kv = torch.randn(2, 4 if kind != "gqa" else 2, 11 if kind in ("bool_mask", "float_mask") else 9, 32)
    mask = {"bool_mask": torch.rand(9, 11) > 0.3, "float_mask": torch.randn(2, 1, 9, 11)}.get(kind)
    kwargs = {"causal": dict(is_causal=True), "gqa": dict(enable_gqa=True, is_causal=True),
              "scale": dict(scale=0.3)}.get(kind, {})
    if mask is not None:
        m = Fn(lambda s, q, k, v, mk: F.scaled_dot_product_attention(q, k, v, attn_mask=mk, **kwargs))
        check(m, (q, kv, kv.clone(), mask), "sdpa", ["attention"])
    else:
        m = Fn(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs))
        check(m, (q, kv, kv.clone()), "sdpa", ["attention"])


def test_sdpa_dropout_is_decomposed_with_reason():
    """The kernel declines training-mode dropout: bmm and softmax run on FlyDSL, the dropout in PyTorch."""
    m = Fn(lambda s, q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5))
    q = torch.randn(1, 2, 4, 32)
    tm = translate(m, (q,), backend="reference", verify=False)
    (row,) = [r for r in tm.report.rows if r.op == "aten.scaled_dot_product_attention"]
    assert "not taken by attention: dropout_p=0.5" in row.detail, row.detail
    assert tm.report.counters.get("sdpa_decomposed") == 1 and "aten.dropout.default(" in tm.code


def test_conv_pool_batchnorm_kept_by_design():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5))
    tm = check(m, (torch.randn(2, 3, 8, 8),), "linear", ["gemm"])
    kept = {r.op: r.detail for r in tm.report.rows if r.where == "pytorch"}
    assert any("conv" in op for op in kept)
    assert all(d == "kept in PyTorch by design" for op, d in kept.items() if "conv" in op or "pool" in op or "batch_norm" in op)


def test_integer_matmul_stays_with_precise_reason():
    m = Fn(lambda s, a, b: a @ b)
    tm = translate(m, (torch.randint(0, 5, (4, 8)), torch.randint(0, 5, (8, 3))), backend="reference")
    (row,) = [r for r in tm.report.rows if r.op == "aten.matmul"]
    assert row.where == "pytorch" and "int64 is not supported" in row.detail
    assert tm.report.verification.passed
