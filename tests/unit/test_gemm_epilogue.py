"""GEMM epilogue fusion: bias / activation / residual / scale after a gemm fold into it
(counters asserted, no leftover PyTorch node), numerics vs eager on the reference backend and
on flysim (the FlyDSL GEMM's fused epilogue)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate

from small_models import translate_seeded  # noqa: E402
from translator_kernels.program import epilogue, parse

REPO = Path(__file__).resolve().parents[2]


class MLPBlock(nn.Module):
    """ViT / GPT-2 MLP: x + drop(proj(gelu(fc(x))))."""

    def __init__(self, d=64, approximate="none"):
        super().__init__()
        self.fc, self.proj, self.drop, self.approximate = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.Dropout(0.1), approximate

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Conv1DStyle(nn.Module):
    """HF GPT-2 Conv1D: addmm-free form mm(x, W) + b, then relu; and a scaled projection."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 48) * 0.1)
        self.b = nn.Parameter(torch.randn(48))
        self.w2 = nn.Parameter(torch.randn(48, 32) * 0.1)

    def forward(self, x):
        h = torch.relu(torch.mm(x, self.w) + self.b)
        return F.silu(torch.mm(h, self.w2) * 0.5)


def gemm_nodes(tm):
    return [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]


@pytest.mark.parametrize("backend", ["reference", "flysim"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_mlp_block_activation_and_residual(backend, approximate):
    m, x, tm = translate_seeded(lambda: MLPBlock(approximate=approximate), (2, 5, 64), backend=backend)
    c = tm.report.counters
    assert c["epilogue_activation"] == 1 and c["epilogue_residual"] == 1, c
    (fc, proj) = gemm_nodes(tm)
    assert fc.args[5] == epilogue("gelu_tanh" if approximate == "tanh" else "gelu") and proj.args[6] is not None
    ops = [n.target for n in tm.gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.gelu.default not in ops and torch.ops.aten.add.Tensor not in ops
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol())
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_bias_relu_scale_silu(backend):
    m, x, tm = translate_seeded(Conv1DStyle, (7, 64), backend=backend)
    c = tm.report.counters
    assert c["epilogue_bias"] == 1 and c["epilogue_activation"] == 2 and c["epilogue_scale"] == 1, c
    g1, g2 = gemm_nodes(tm)
    assert g1.args[4] is not None and g1.args[5] == epilogue("relu")
    assert g2.args[7] == 0.5 and g2.args[5] == epilogue("silu")
    assert tm.report.verification.passed, tm.report.verification.message
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    rows = {r.op: r.where for r in tm.report.rows}
    assert rows["aten.relu"].startswith("flydsl") and rows["aten.silu"].startswith("flydsl")


def test_scale_after_bias_is_not_folded():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 16)

        def forward(self, x):
            return self.fc(x) * 2.0

    m = M().eval()
    x = torch.randn(3, 32)
    tm = translate(m, (x,), backend="reference")
    assert "epilogue_scale" not in tm.report.counters  # 2 * (xW + b) != (2 * xW) + b
    assert tm.report.counters["epilogue_arith"] == 1  # it is a step of the epilogue program instead
    (g,) = gemm_nodes(tm)
    assert g.args[5] == epilogue("mul(2.0)") and g.args[7] == 1.0
    assert tm.report.verification.passed


class Chain(nn.Module):
    """linear followed by `fn` (ops on the running value with scalar constants)."""

    def __init__(self, fn, d_in=32, d_out=48, bias=True):
        super().__init__()
        self.fc, self.fn = nn.Linear(d_in, d_out, bias=bias), fn

    def forward(self, x):
        return self.fn(self.fc(x))


CHAINS = {  # name -> (chain, epilogue program the gemm must carry, in chain spelling)
    "hardtanh_relu6": (lambda y: F.relu6(F.hardtanh(y * 3.0, -2.0, 2.5)), "mul(3.0);clamp(-2.0,2.5);clamp(0.0,6.0)"),
    "leaky_softplus": (lambda y: F.softplus(F.leaky_relu(y, 0.2), beta=2.0), "leaky_relu(0.2);softplus(2.0,20.0)"),
    "div_sub_tanh": (lambda y: torch.tanh(y / 2.0 - 0.5), "div(2.0);sub(0.5);tanh"),
    "rsub_exp_neg_abs": (lambda y: torch.abs(-torch.exp(1.0 - y)), "rsub(1.0);exp;neg;abs"),
    "hardswish_hardsigmoid": (lambda y: F.hardsigmoid(F.hardswish(y)) + 1.0, "hardswish;hardsigmoid;add(1.0)"),
    "clamp_min_max": (lambda y: torch.clamp_max(torch.clamp_min(torch.sigmoid(y), 0.2), 0.7),
                      "sigmoid;clamp(0.2,None);clamp(None,0.7)"),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_unary_chain_becomes_epilogue_program(name):
    fn, prog = CHAINS[name]
    m, x, tm = translate_seeded(lambda: Chain(fn), (6, 32), backend="reference")
    (g,) = gemm_nodes(tm)
    assert g.args[5] == epilogue(prog), g.args
    left = [n for n in tm.gm.graph.nodes if n.op == "call_function" and getattr(n.target, "namespace", "") == "aten"]
    assert not left, tm.code
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol(check="few_ops"))


def test_chain_stops_at_a_tensor_operand_and_a_second_user():
    """y = sigmoid(fc(x)); y * x2 (tensor) is not a step; a gemm read twice keeps its users."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x, x2):  # fc2 reads another input: linears of one input merge into one GEMM (qkv.py)
            y = torch.sigmoid(self.fc(x)) * x
            z = self.fc2(x2)
            return y + torch.tanh(z) + z

    torch.manual_seed(0)
    m = M().eval()
    x = torch.randn(4, 16)
    tm = translate(m, (x, torch.randn(4, 16)), backend="reference")
    g1, g2 = gemm_nodes(tm)[:2]
    assert g1.args[5] == epilogue("sigmoid") and g2.args[5] is None
    assert tm.report.verification.passed, tm.report.verification.message


def _load_model(stem):
    spec = importlib.util.spec_from_file_location(f"_model_{stem}", REPO / "models" / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("stem,prog,counters", [
    ("gemm_scale_sigmoid_residual", "mul(2.0);sigmoid", {"epilogue_arith": 1, "epilogue_activation": 1,
                                                          "epilogue_residual": 1}),
    ("gemm_gelu_clamp", "gelu;clamp(-0.25,0.75)", {"epilogue_activation": 2}),  # eval dropout computes nothing
])
def test_fusion_models_are_one_kernel_on_flysim(stem, prog, counters):
    """KernelBench-style GEMM + elementwise models: the whole forward is ONE FlyDSL launch."""
    mod = _load_model(stem)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    inputs = mod.get_inputs()
    tm = translate(model, inputs, backend="flysim", name=stem)
    assert tm.report.verification.passed, tm.report.verification.message
    c = tm.report.counters
    assert all(c.get(k) == v for k, v in counters.items()), c
    (g,) = gemm_nodes(tm)
    assert g.args[5] == epilogue(prog)
    torch.manual_seed(1)
    fresh = mod.get_inputs()
    with torch.no_grad():
        out = tm(*fresh)
        torch.testing.assert_close(out, model(*fresh), **model_tol())
    assert len(tm.last_launches) == 1, tm.last_launches
    assert all(r.where == "flydsl-kernel" for r in tm.report.rows if r.op.startswith("aten.")), \
        [(r.op, r.where) for r in tm.report.rows]


FOLD_ANY = {  # name -> (chain after a linear, epilogue ops it must carry): ops the epilogue took only once
    # it shared the elementwise kernels' op table (sqrt, log, erf, sin, cos, pow, reciprocal, ...)
    "sqrt_log_rsqrt": (lambda y: torch.rsqrt(torch.log(torch.sqrt(y * y + 1.0) + 1.0)),
                       ["mul", "const", "add", "sqrt", "const", "add", "log", "rsqrt"]),
    "sin_erf_atan": (lambda y: torch.atan(torch.erf(torch.sin(y) * 2.0) * 3.0),
                     ["sin", "const", "mul", "erf", "const", "mul", "atan"]),
    "pow_reciprocal_expm1": (lambda y: torch.reciprocal(torch.expm1(y.abs()).pow(1.5) + 2.0),
                             ["abs", "expm1", "pow_scalar", "const", "add", "reciprocal"]),
    "cos_log1p_sign": (lambda y: torch.sign(torch.log1p(torch.cos(y) + 1.5) - 0.5) * 3.0,
                       ["cos", "const", "add", "log1p", "const", "sub", "sign", "const", "mul"]),
}


@pytest.mark.parametrize("name", list(FOLD_ANY))
def test_any_elementwise_op_folds_into_the_epilogue_on_flysim(name):
    """Every op the elementwise kernels take folds into the GEMM epilogue: one gemm node carries the
    whole chain (counters moved, no aten op left) and the forward is ONE FlyDSL launch on flysim."""
    fn, ops = FOLD_ANY[name]
    m, x, tm = translate_seeded(lambda: Chain(fn, d_in=32, d_out=48), (5, 32), backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    (g,) = gemm_nodes(tm)
    assert [o for o, _, _ in parse(g.args[5]).ops] == ops, g.args[5]
    c = tm.report.counters
    assert c.get("epilogue_activation", 0) + c.get("epilogue_arith", 0) == sum(o != "const" for o in ops), c
    assert not [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "aten"], tm.code
    torch.manual_seed(1)
    fresh = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(tm(fresh), m(fresh), **model_tol(check="few_ops"))
    assert len(tm.last_launches) == 1, tm.last_launches


class SplitRegion(nn.Module):
    """The region after the gemm also reads other tensors: the gemm takes the part computed from its
    value alone (bias, a where over a comparison, sigmoid), the region keeps the rest and reads it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 48) * 0.2)
        self.b = nn.Parameter(torch.randn(48))

    def forward(self, x, m):
        y = torch.mm(x, self.w) + self.b
        h = torch.sigmoid(torch.where(y > 0, y, y * 0.1))
        return h * m, h  # h is also returned: an output of the region, now the gemm's own value


def test_gemm_takes_the_part_of_a_region_computed_from_its_value_on_flysim():
    torch.manual_seed(0)
    m = SplitRegion().eval()
    x, mask = torch.randn(6, 32), torch.randn(6, 48)
    tm = translate(m, (x, mask), backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    c = tm.report.counters
    assert (c["epilogue_bias"], c["epilogue_activation"], c["epilogue_arith"]) == (1, 3, 1), c  # gt, where, sigmoid; mul
    (g, f) = gemm_nodes(tm)
    assert g.args[4] is not None and [o for o, _, _ in parse(g.args[5]).ops] == ["const", "gt", "const", "mul",
                                                                                 "where", "sigmoid"]
    assert g in f.args[0]  # the region reads the gemm's (now sigmoid) value
    assert [o for o, _, _ in parse(f.args[1]).ops] == ["mul"] and len(f.meta["val"]) == 1
    torch.manual_seed(1)
    fresh = (torch.randn(6, 32), torch.randn(6, 48))
    with torch.no_grad():
        for got, want in zip(tm(*fresh), m(*fresh)):
            torch.testing.assert_close(got, want, **model_tol(check="few_ops"))
    assert len(tm.last_launches) == 2, tm.last_launches  # the gemm and the multiply


class GPT2Residual(nn.Module):
    """GPT-2 block tail: x = x + drop(c_proj(h)); the sum feeds the next LayerNorm and is read later."""

    def __init__(self, d=32):
        super().__init__()
        self.c_proj, self.drop, self.ln = nn.Linear(d, d), nn.Dropout(0.1), nn.LayerNorm(d)

    def forward(self, x, h):
        x = x + self.drop(self.c_proj(h))
        return self.ln(x) + x


def test_residual_through_eval_dropout_goes_to_the_gemm_not_the_norm():
    """The norm does not claim an add whose other side is a lone GEMM behind an eval dropout: the
    dropout and the add join a region that the GEMM's epilogue takes (a lone dropout left behind
    would stay in PyTorch)."""
    torch.manual_seed(0)
    m = GPT2Residual().eval()
    inputs = (torch.randn(2, 3, 32), torch.randn(2, 3, 32))
    tm = translate(m, inputs, backend="reference")
    c = tm.report.counters
    assert c.get("epilogue_residual") == 1 and "add_layer_norm" not in c, c
    rows = [(r.op, r.where) for r in tm.report.rows if r.op in ("aten.dropout", "aten.add")]
    assert len(rows) == 3 and all(where != "pytorch" for _, where in rows), rows
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs), m(*inputs), **model_tol(check="few_ops"))
