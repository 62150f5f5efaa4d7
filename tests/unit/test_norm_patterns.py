"""Norm patterns -> the norm family's FlyDSL ops: each form as a small module is rewritten
(counter, the expected flydsl op, none of the hand-written arithmetic left) and matches eager
on the reference backend; one small case per pattern also runs our FlyDSL kernels on flysim.
Forms that must stay in PyTorch carry a precise reason in the report."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from models import llama_block
from translator import translate
from translator.registry import Stage, rules_for

TOL = {dt: model_tol(dt)["atol"] for dt in (torch.float32, torch.bfloat16, torch.float16)}
PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def flydsl_ops(tm):
    return sorted(n.target._opname for n in tm.gm.graph.nodes
                  if n.op == "call_function" and getattr(n.target, "namespace", "") == "flydsl")


NORM_OPS = {"rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "group_norm"}


def norm_nodes(tm):
    return [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"
            and n.target._opname in NORM_OPS]


def aten_ops(tm):
    return {n.target._opname for n in tm.gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", "") == "aten"}


def check(model, inputs, counter, ops, backend="reference", gone=("rsqrt", "sqrt", "mean", "var", "pow")):
    model.eval()
    dt = inputs[0].dtype
    tm = translate(model, inputs, backend=backend, precision=PRECISION.get(dt, "fp32"))
    assert tm.report.counters.get(counter, 0) >= 1, tm.report.counters
    assert tm.report.backend == backend
    have = flydsl_ops(tm)  # other ops may be fused too (e.g. elementwise chains around the norm)
    assert all(have.count(o) == ops.count(o) for o in ops), have
    assert not aten_ops(tm) & set(gone), aten_ops(tm)
    assert tm.report.verification.passed, tm.report.verification.message
    torch.manual_seed(3)
    fresh = [torch.randn_like(x) if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        want, got = model(*fresh), tm(*fresh)
    tol = TOL[dt]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
    return tm


def reason_of(tm, op):
    """The reason the report gives for the pattern not taking its `op` node(s) (which then stay in
    PyTorch, or run on another FlyDSL op such as a reduction, with the reason appended)."""
    rows = [r for r in tm.report.rows if r.op == op and "_norm" in r.detail]
    assert rows, [(r.op, r.where, r.detail) for r in tm.report.rows]
    return rows[0].detail.split("not taken by ")[-1]


def param(*shape, dtype=torch.float32):
    return nn.Parameter(1 + 0.3 * torch.randn(*shape).to(dtype))


# --- hand-written RMSNorm ------------------------------------------------------------------------

class LlamaRMSNorm(llama_block.LlamaRMSNorm):
    """transformers/models/llama/modeling_llama.py (also Mistral, Qwen2), the bundled Llama
    block's norm, with a weight of `dtype` away from 1."""

    def __init__(self, n, eps=1e-6, dtype=torch.float32):
        super().__init__(n, eps)
        self.weight = param(n, dtype=dtype)


class WeightBeforeCast(LlamaRMSNorm):
    """Weight applied in fp32, then cast back (InternLM / some Qwen forks)."""

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight * h).to(x.dtype)


class MetaLlamaRMSNorm(LlamaRMSNorm):
    """meta-llama/llama model.py: `self._norm(x.float()).type_as(x) * self.weight`."""

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).type_as(x) * self.weight


class SqrtDivRMSNorm(LlamaRMSNorm):
    """`x / torch.sqrt(mean(x*x) + eps) * w` (tutorials, older repos)."""

    def forward(self, x):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


class T5LayerNorm(LlamaRMSNorm):
    """transformers T5LayerNorm: statistics of the upcast input, the multiply on the input itself."""

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class GemmaRMSNorm(LlamaRMSNorm):
    """transformers GemmaRMSNorm: weight stored as an offset from 1, computed in the graph."""

    def forward(self, x):
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (out * (1.0 + self.weight.float())).type_as(x)


class NoWeightRMS(nn.Module):
    def forward(self, x):
        return x * (x.pow(2).mean(dim=-1, keepdim=True) + 1e-5).rsqrt()


@pytest.mark.parametrize("cls", [LlamaRMSNorm, WeightBeforeCast, MetaLlamaRMSNorm, SqrtDivRMSNorm, T5LayerNorm,
                                 GemmaRMSNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_handwritten_rms_norm(cls, dtype):
    m = cls(64, dtype=dtype)
    tm = check(m, (torch.randn(2, 5, 64).to(dtype),), "rms_norm_handwritten", ["rms_norm"])
    (node,) = norm_nodes(tm)
    assert node.args[0].op == "placeholder", "the kernel reads the input in its own dtype (upcast undone)"
    assert node.args[2] is not None, "the weight multiply is fused"


def test_handwritten_rms_norm_no_weight():
    tm = check(NoWeightRMS(), (torch.randn(3, 40),), "rms_norm_handwritten", ["rms_norm"])
    assert "mul" not in aten_ops(tm)


def test_wider_weight_after_the_cast_stays_a_multiply():
    """bf16 activations, fp32 weight: eager rounds to bf16 before the fp32 multiply, so the kernel
    stops at that rounding (its output is the bf16 value eager computes) and the multiply stays."""
    m = LlamaRMSNorm(32)  # fp32 weight
    x = torch.randn(4, 32).to(torch.bfloat16)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.counters.get("rms_norm_handwritten") == 1
    (node,) = norm_nodes(tm)
    assert node.args[2] is None and node.args[0].op == "placeholder"
    assert tm.report.verification.passed, tm.report.verification.message


# --- hand-written LayerNorm ----------------------------------------------------------------------

class HandLN(nn.Module):
    def __init__(self, n, form, affine=True):
        super().__init__()
        self.form = form
        if affine:
            self.weight, self.bias = param(n), nn.Parameter(0.3 * torch.randn(n))
        else:
            self.weight = self.bias = None

    def forward(self, x):
        if self.form == "var":  # x.var(unbiased=False) and sqrt division
            mu = x.mean(-1, keepdim=True)
            y = (x - mu) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        elif self.form == "mean_sq":  # ConvNeXt channels_last style: mean of squared deviations
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            y = (x - u) / torch.sqrt(s + 1e-6)
        elif self.form == "var_mean":  # torch.var_mean(correction=0), rsqrt multiply
            var, mu = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
            y = (x - mu) * torch.rsqrt(var + 1e-5)
        else:  # "correction": x.var(correction=0), fp32 upcast and cast back
            xf = x.float()
            mu = xf.mean(-1, keepdim=True)
            y = ((xf - mu) * (xf.var(-1, keepdim=True, correction=0) + 1e-5).rsqrt()).type_as(x)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y


@pytest.mark.parametrize("form", ["var", "mean_sq", "var_mean", "correction"])
@pytest.mark.parametrize("affine", [True, False])
def test_handwritten_layer_norm(form, affine):
    tm = check(HandLN(48, form, affine), (torch.randn(2, 7, 48),), "layer_norm_handwritten", ["layer_norm"],
               gone=("rsqrt", "sqrt", "mean", "var", "var_mean", "pow", "sub", "div", "add"))
    (node,) = norm_nodes(tm)
    assert (node.args[2] is not None) == affine and (node.args[3] is not None) == affine


def test_handwritten_layer_norm_bf16_upcast():
    check(HandLN(48, "correction"), (torch.randn(6, 48).to(torch.bfloat16),), "layer_norm_handwritten",
          ["layer_norm"])


def test_mean_used_elsewhere_is_kept_and_the_norm_still_lowers():
    class M(HandLN):
        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            y = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias
            return y, mu

    tm = check(M(32, None), (torch.randn(5, 32),), "layer_norm_handwritten", ["layer_norm"], gone=("rsqrt", "sqrt"))
    # still computed for the second output: in PyTorch or as a FlyDSL reduction
    assert "mean" in aten_ops(tm) or any(r.op == "aten.mean" and r.where != "pytorch" for r in tm.report.rows)


def test_norm_over_two_trailing_dims():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = param(6, 8)

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * self.weight

    tm = check(M(), (torch.randn(3, 6, 8),), "rms_norm_handwritten", ["rms_norm"])
    (node,) = norm_nodes(tm)
    assert node.args[1] == [6, 8]


# --- residual add + norm -------------------------------------------------------------------------

class PreNormBlock(nn.Module):
    """residual = h; h = norm(h); ...; h = residual + h — the sum feeds the norm and the next add.
    The branch is an elementwise op here (not a linear), so the add is not a GEMM epilogue's."""

    def __init__(self, n, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x, branch):
        h = x + torch.tanh(branch)
        residual = h
        h = self.norm(h)
        return residual + 0.5 * h


def _fused(tm, op):
    (node,) = [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"
               and n.target._opname == op]
    gets = sorted(u.args[1] for u in node.users)
    assert gets == [0, 1], "the graph reads both results through getitem"
    assert all(u.target.__name__ == "getitem" for u in node.users)
    return node


@pytest.mark.parametrize("norm,op", [
    (lambda n: nn.LayerNorm(n), "add_layer_norm"),
    (lambda n: nn.RMSNorm(n, eps=1e-6), "add_rms_norm"),
    (lambda n: LlamaRMSNorm(n), "add_rms_norm"),
    (lambda n: HandLN(n, "var"), "add_layer_norm"),
], ids=["nn.LayerNorm", "nn.RMSNorm", "LlamaRMSNorm", "hand-written LayerNorm"])
def test_residual_add_used_later_becomes_add_norm(norm, op):
    block = PreNormBlock(40, norm(40))
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.2 * torch.randn_like(p))
    tm = check(block, (torch.randn(2, 3, 40), torch.randn(2, 3, 40)), op, [op])
    node = _fused(tm, op)
    assert node.args[0].op == "placeholder" and node.args[1].op == "call_function"  # x, tanh(branch)
    (s,) = [u for u in node.users if u.args[1] == 0]
    assert s.users, "the sum (residual stream) is read after the norm"
    feeds = [n for n in tm.gm.graph.nodes if n.target is torch.ops.aten.add.Tensor and node in n.all_input_nodes]
    assert not feeds


def test_residual_add_used_only_by_the_norm_stays_a_plain_norm():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)

        def forward(self, x, r):  # BERT: LayerNorm(hidden_states + input_tensor)
            return self.ln(x + r)

    tm = check(M(), (torch.randn(4, 32), torch.randn(4, 32)), "layer_norm", ["layer_norm"])
    assert "add_layer_norm" not in tm.report.counters


def test_broadcast_add_is_not_a_residual():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)

        def forward(self, tok, pos):  # tok_emb + pos_emb, then ln, and the sum is used later
            h = tok + pos
            return self.ln(h) + h

    tm = check(M(), (torch.randn(2, 4, 32), torch.randn(4, 32)), "layer_norm", ["layer_norm"])
    assert "add_layer_norm" not in tm.report.counters


def test_residual_of_a_linear_is_left_to_the_gemm_epilogue():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(32, 32)
            self.norm = LlamaRMSNorm(32)

        def forward(self, x, a):
            h = x + self.proj(a)  # Llama: residual + o_proj(attn)
            return h + self.norm(h)

    m = M().eval()
    tm = translate(m, (torch.randn(3, 32), torch.randn(3, 32)), backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    if any(r.name == "gemm_epilogue" for r in rules_for(Stage.CONSUMER)):
        assert tm.report.counters.get("rms_norm_handwritten") == 1 and "add_rms_norm" not in tm.report.counters
        assert tm.report.counters.get("epilogue_residual") == 1, tm.report.counters
    else:  # no epilogue to take it: add + norm does
        assert tm.report.counters.get("add_rms_norm") == 1, tm.report.counters


# --- GroupNorm / InstanceNorm --------------------------------------------------------------------

class Convish(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.inorm_plain = nn.InstanceNorm1d(8)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.3 * torch.randn_like(p))

    def forward(self, x):
        return self.gn(x), self.inorm(x), self.inorm_plain(x.flatten(2)), F.group_norm(x, 2, eps=1e-3)


def test_group_and_instance_norm():
    tm = check(Convish(), (torch.randn(2, 8, 3, 5),), "group_norm", ["group_norm"] * 4,
               gone=("group_norm", "instance_norm"))
    assert tm.report.counters["group_norm"] == 2 and tm.report.counters["instance_norm"] == 2


def test_native_group_norm():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = param(6), nn.Parameter(torch.randn(6))

        def forward(self, x):
            return torch.ops.aten.native_group_norm(x, self.w, self.b, 2, 6, 20, 3, 1e-5)[0]

    check(M(), (torch.randn(2, 6, 4, 5),), "group_norm", ["group_norm"], gone=("native_group_norm",))


def test_instance_norm_with_running_stats_stays_with_reason():
    m = nn.InstanceNorm2d(4, track_running_stats=True).eval()
    tm = translate(m, (torch.randn(2, 4, 3, 3),), backend="reference")
    assert "running statistics" in reason_of(tm, "aten.instance_norm")


# --- what stays in PyTorch, and why --------------------------------------------------------------

def test_float64_rms_norm_stays_with_reason():
    m = LlamaRMSNorm(16).double()
    tm = translate(m, (torch.randn(3, 16, dtype=torch.float64),), backend="reference")
    assert not norm_nodes(tm)
    assert "float64" in reason_of(tm, "aten.mean")


def test_integer_weight_stays_with_reason():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.arange(1, 17))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale

    tm = translate(M(), (torch.randn(3, 16),), backend="reference")
    assert not norm_nodes(tm)
    assert "weight dtype int64" in reason_of(tm, "aten.mean")


def test_channels_first_norm_stays_with_reason():
    class ConvNeXtLN(nn.Module):  # ConvNeXt LayerNorm, data_format="channels_first"
        def __init__(self):
            super().__init__()
            self.weight, self.bias = param(8), nn.Parameter(torch.zeros(8))

        def forward(self, x):
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + 1e-6)
            return self.weight[:, None, None] * x + self.bias[:, None, None]

    tm = translate(ConvNeXtLN(), (torch.randn(2, 8, 4, 4),), backend="reference")
    assert not norm_nodes(tm)
    r = reason_of(tm, "aten.mean")
    assert "dim(s) [1] of a 4-D tensor" in r and "trailing dims" in r, r


def test_unbiased_variance_stays_with_reason():
    class M(nn.Module):
        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5)

    tm = translate(M(), (torch.randn(3, 16),), backend="reference")
    assert not norm_nodes(tm)
    assert "correction=1 (unbiased)" in reason_of(tm, "aten.var")


def test_variance_used_outside_stays_with_reason():
    class M(nn.Module):
        def forward(self, x):
            v = x.pow(2).mean(-1, keepdim=True) + 1e-6
            return x * torch.rsqrt(v), v

    tm = translate(M(), (torch.randn(3, 16),), backend="reference")
    assert not norm_nodes(tm)
    assert "also used outside" in reason_of(tm, "aten.mean")


# --- the same patterns on our FlyDSL kernels (flysim) --------------------------------------------

@pytest.mark.parametrize("model,inputs,counter,ops", [
    (LlamaRMSNorm(48, dtype=torch.bfloat16), (torch.randn(3, 48).to(torch.bfloat16),), "rms_norm_handwritten",
     ["rms_norm"]),
    (SqrtDivRMSNorm(33), (torch.randn(2, 33),), "rms_norm_handwritten", ["rms_norm"]),
    (HandLN(40, "var_mean"), (torch.randn(3, 40),), "layer_norm_handwritten", ["layer_norm"]),
    (PreNormBlock(24, LlamaRMSNorm(24)), (torch.randn(3, 24), torch.randn(3, 24)), "add_rms_norm",
     ["add_rms_norm"]),
    (PreNormBlock(24, nn.LayerNorm(24)), (torch.randn(3, 24), torch.randn(3, 24)), "add_layer_norm",
     ["add_layer_norm"]),
    (Convish(), (torch.randn(2, 8, 3, 5),), "group_norm", ["group_norm"] * 4),
], ids=["llama-rms-bf16", "sqrt-div-rms", "var_mean-ln", "add-rms-handwritten", "add-layer_norm", "group-instance"])
def test_patterns_on_flysim(model, inputs, counter, ops):
    tm = check(model, inputs, counter, ops, backend="flysim", gone=())
    assert all(r.where == "flydsl-kernel" for r in tm.report.rows if r.where != "pytorch")
