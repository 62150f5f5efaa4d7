"""Elementwise partitioning + the fused_elementwise lowering: every test checks the counter
and numerics against eager (reference backend for graph logic; flysim for the kernel)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the flysim package, not the tests/flysim folder of its tests
import flysim  # noqa: E402,F401

from translator.tolerances import op_tol
from translator import translate  # noqa: E402
from bundled_models import load_model  # noqa: E402
from translator.passes.partition import partition  # noqa: E402

FUSED = torch.ops.flydsl.fused_elementwise.default


def fused_nodes(tm):
    return [n for n in tm.gm.graph.nodes if n.target is FUSED]


def check(model, inputs, backend="reference", **kw):
    tm = translate(model.eval(), inputs, backend=backend, **kw)
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        want, got = model(*inputs), tm(*inputs)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(g, w, **op_tol(torch.float32, "fused_elementwise"))
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


class Chain(nn.Module):
    def forward(self, x, y):
        z = torch.sigmoid(x * 2.0) + y
        return F.silu(z) * torch.tanh(z), z  # z is used outside: an extra output


def test_chain_is_one_kernel_with_extra_output():
    tm = check(Chain(), (torch.randn(4, 32), torch.randn(32)))
    assert tm.report.counters["fused_elementwise"] == 1
    assert tm.report.counters["fused_elementwise_ops"] == 6
    (n,) = fused_nodes(tm)
    assert len(n.meta["val"]) == 2


class ThroughReduction(nn.Module):
    def forward(self, x):
        a = torch.exp(x)
        s = a.sum(-1, keepdim=True)  # stays in PyTorch; fusing exp with the mul would make a cycle
        return a * s + 1.0


def test_no_cycle_through_pytorch_op():
    tm = check(ThroughReduction(), (torch.randn(3, 8),))
    assert tm.report.counters["fused_elementwise"] == 2
    ep = torch.export.export(ThroughReduction(), (torch.randn(3, 8),))
    gm = ep.module()
    fusable = {n for n in gm.graph.nodes if n.op == "call_function" and "sum" not in str(n.target)
               and n.target is not torch.ops.aten.sym_size.int}
    for region in partition(gm, fusable):
        names = {str(n.target) for n in region}
        assert not ({"aten.exp.default", "aten.mul.Tensor"} <= names), names


class AfterLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = F.gelu(self.fc(x))
        return h * torch.sigmoid(h) + x  # computed from the GEMM's value alone, plus a residual


def test_region_after_a_gemm_folds_into_its_epilogue():
    tm = check(AfterLinear(), (torch.randn(4, 16),))
    c = tm.report.counters
    assert c["fused_elementwise"] == 1 and c["fused_elementwise_ops"] == 4  # the region partition made
    assert (c["epilogue_activation"], c["epilogue_arith"], c["epilogue_residual"]) == (2, 1, 1), c
    assert fused_nodes(tm) == []  # ... the GEMM's epilogue took whole


class Mixed(nn.Module):
    def forward(self, x, mask, idx):
        y = torch.where(mask, x, torch.full_like(x, -1e4)).to(torch.bfloat16)
        return F.hardswish(y) * 0.5, (idx * 2) + 1  # the int64 chain: a second kernel, exact integer math


def test_bool_cast_and_integer_chain():
    x, mask, idx = torch.randn(2, 5, 7), torch.rand(2, 5, 7) > 0.5, torch.arange(6)
    tm = translate(Mixed().eval(), (x, mask, idx), backend="reference")
    assert tm.report.verification.passed
    assert tm.report.counters["fused_elementwise"] == 2
    assert not [r for r in tm.report.rows if r.where == "pytorch" and r.dtype == "int64" and not r.layout]
    want = Mixed()(x, mask, idx)
    got = tm(x, mask, idx)
    torch.testing.assert_close(got[0].float(), want[0].float(), **op_tol(torch.bfloat16))
    assert torch.equal(got[1], want[1])


class Acts(nn.Module):
    def forward(self, x):
        a = F.elu(x) + F.selu(x) + F.celu(x, 0.5) + F.leaky_relu(x, 0.1) + F.softplus(x, 2.0, 5.0)
        b = F.hardtanh(x, -0.5, 0.5) + F.relu6(x * 4) + F.hardsigmoid(x) + F.mish(x) + F.softsign(x)
        c = torch.clamp(x, min=-1.0) + x.clamp_max(0.3) + torch.rsqrt(x.abs() + 1) + x.pow(2) + torch.log1p(x.abs())
        d = torch.maximum(a, b) - torch.minimum(b, c) / (c.abs() + 1.0) + torch.div(a, 1.7, rounding_mode="floor")
        return F.dropout(d, 0.5, training=False) * (x > 0).float()


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_many_activations_one_kernel(backend):
    tm = check(Acts(), (torch.randn(3, 20),), backend=backend)
    assert tm.report.counters["fused_elementwise"] == 1
    assert tm.report.counters["fused_elementwise_ops"] >= 30


def test_flysim_chain_and_model_bf16():
    tm = check(Chain(), (torch.randn(5, 33), torch.randn(33)), backend="flysim")
    assert tm.report.counters["fused_elementwise"] == 1


def translate_bundled(name):
    m, mod = load_model(name)
    tm = translate(m, tuple(mod.get_inputs()), backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    return tm


def test_llama_block_elementwise_in_flydsl():
    tm = translate_bundled("llama_block")
    assert tm.report.counters["rope_qk"] == 1  # rotate_half neg + rotary mul-add of q and k: one flydsl.rope
    assert tm.report.counters["fused_elementwise"] >= 1  # the SwiGLU gate mul
    left = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert "aten.mul.Tensor" not in left and "aten.add.Tensor" not in left, left


def test_after_conv_batchnorm_inplace_relu_goes_to_flydsl():
    tm = translate_bundled("small_cnn")
    assert len(fused_nodes(tm)) == 2  # conv -> bn -> relu_ (x2)
    assert tm.report.counters["epilogue_activation"] == 1  # linear -> relu_: the GEMM's epilogue
    assert not any("relu" in str(n.target) for n in tm.gm.graph.nodes)


class Rotary(nn.Module):
    """A rotation by per-element angles (position broadcast + x2): angle, sin, cos and mix fuse."""

    def forward(self, x1, x2, pos):
        ang = x2 * 0.5 + pos
        return x1 * torch.cos(ang) - torch.sin(ang) * torch.sin(x1 * 3.0)


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_sin_cos_chain_one_kernel(backend):
    x1, x2, pos = torch.randn(4, 24), torch.randn(4, 24), torch.arange(24, dtype=torch.float32) * 4.1
    tm = check(Rotary(), (x1, x2, pos), backend=backend)  # angles up to ~36 rad
    assert tm.report.counters["fused_elementwise"] == 1
    assert tm.report.counters["fused_elementwise_ops"] == 9
    left = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert not {"aten.sin.default", "aten.cos.default"} & left, left


class Angle(nn.Module):
    """atan of a ratio (a phase / angle feature): one region with the scale and the residual."""

    def forward(self, x, y):
        return torch.atan(y / (x.abs() + 1e-3)) * 2.0 + x


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_atan_region_one_kernel(backend):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 40, generator=g) * 3, torch.randn(4, 40, generator=g) * 3
    tm = check(Angle(), (x, y), backend=backend)
    assert tm.report.counters["fused_elementwise"] == 1 and tm.report.counters["fused_elementwise_ops"] == 6
    left = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert "aten.atan.default" not in left, left
    if backend == "flysim":
        assert len(tm.last_launches) == 1, tm.last_launches  # the FlyDSL kernel ran


class Alphas(nn.Module):
    def forward(self, x):  # rsub.Scalar takes alpha by position, add.Tensor by keyword
        return torch.rsub(x, 2.0, alpha=3) * torch.add(x, 1.5, alpha=2)


def test_alpha_by_position_or_keyword_scales_the_operand():
    tm = check(Alphas(), (torch.randn(4, 32),), backend="flysim")
    assert tm.report.counters["fused_elementwise"] == 1
    assert tm.report.counters["fused_elementwise_ops"] >= 3
