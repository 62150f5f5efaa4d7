"""The graph toolbox (translator/graph.py), the normalize pass and the registry's rule API."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import translator.lowerings  # noqa: F401  (fills the registry)
from translator import translate
from translator import registry as R
from translator.graph import (LowerCtx, arg, before, getitem_of, in_order, schema_form, set_args,
                             stable_toposort)
from translator.passes.normalize import normalize

aten = torch.ops.aten


def _graph(fn, *inputs):
    """An exported aten graph of fn and its rewrite context."""
    class M(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    gm = torch.export.export(M(), inputs).module()
    return LowerCtx(gm=gm, arch="gfx942", precision="fp32")


def _call(ctx, target):
    return next(n for n in ctx.gm.graph.nodes if n.op == "call_function" and n.target is target)


# --- arguments by schema ----------------------------------------------------------------------

def test_arg_reads_by_name_whatever_form_the_call_has():
    ctx = _graph(lambda x, w: F.rms_norm(x, [8], w, 1e-3), torch.randn(2, 8), torch.randn(8))
    n = _call(ctx, aten.rms_norm.default)
    assert arg(n, "eps") == 1e-3 and arg(n, "weight") is n.args[2]
    n.args, n.kwargs = n.args[:2], {"eps": 1e-3}  # weight skipped, eps by keyword
    assert arg(n, "eps") == 1e-3 and arg(n, "weight") is None
    assert arg(n, "weight", "default") == "default"


def test_arg_defaults_come_from_the_schema_and_other_overloads_names_read_as_default():
    ctx = _graph(lambda x: torch.div(x, 2.0) + F.gelu(x), torch.randn(4))
    div = next(n for n in ctx.gm.graph.nodes if n.op == "call_function" and n.target._opname == "div")
    assert arg(div, "rounding_mode") is None  # div.Tensor has none; div.Tensor_mode does
    assert arg(_call(ctx, aten.gelu.default), "approximate") == "none"  # the schema's default
    with pytest.raises(KeyError, match="has no argument 'approxmate'"):
        arg(_call(ctx, aten.gelu.default), "approxmate")


def test_normalize_puts_positional_parameters_by_position():
    assert schema_form(aten.rms_norm.default, (1, [8]), {"eps": 1e-3}) == ((1, [8], None, 1e-3), {})
    assert schema_form(aten.add.Tensor, (1, 2), {"alpha": 3}) is None  # alpha is keyword-only: stays
    ctx = _graph(lambda x, w: F.rms_norm(x, [8], w, 1e-3), torch.randn(2, 8), torch.randn(8))
    n = _call(ctx, aten.rms_norm.default)
    x, shape = n.args[:2]
    n.args, n.kwargs = (x, shape), {"eps": 1e-3}
    assert normalize(ctx) == 1
    assert n.args == (x, shape, None, 1e-3) and n.kwargs == {}
    assert normalize(ctx) == 0  # once is enough


def test_set_args_writes_by_name_and_getitem_of_reads_a_getitem():
    ctx = _graph(lambda x, w: F.rms_norm(x, [8], w, 1e-3), torch.randn(2, 8), torch.randn(8))
    n = _call(ctx, aten.rms_norm.default)
    x = arg(n, "input")
    n.args, n.kwargs = (x, [8]), {}
    set_args(n, eps=1e-5)  # a skipped positional parameter before it gets its default
    assert n.args == (x, [8], None, 1e-5) and arg(n, "eps") == 1e-5
    add = ctx.insert(aten.add.Tensor, x, x, after=x)
    set_args(add, alpha=2)  # keyword-only: stays a keyword
    assert add.args == (x, x) and add.kwargs == {"alpha": 2}
    with pytest.raises(KeyError, match="no argument 'epsilon'"):
        set_args(n, epsilon=1.0)
    g = ctx.gm.graph.call_function(operator.getitem, (n, 0))
    assert getitem_of(g) == (n, 0) and getitem_of(n) is None and getitem_of(3) is None


# --- node order, emit, counters ------------------------------------------------------------------

def test_emit_writes_the_flydsl_record_once_and_counts():
    ctx = _graph(lambda x: torch.softmax(x, -1) * 2, torch.randn(3, 5))
    sm = _call(ctx, aten.softmax.int)
    new = ctx.replace(sm, "softmax", "softmax", (sm.args[0], 1, False), [sm])
    assert new.meta["flydsl"] == {"family": "softmax", "lowering": "softmax", "sources": ["softmax"],
                                  "anchor": "softmax"}
    assert ctx.counters == {"softmax": 1} and not any(
        n.target is aten.softmax.int for n in ctx.gm.graph.nodes)
    ctx.count("softmax", 2)
    assert ctx.counters == {"softmax": 3}


def test_emit_of_a_multi_output_op_adds_a_getitem_per_output():
    ctx = _graph(lambda x, r: F.layer_norm(x + r, [8]), torch.randn(2, 8), torch.randn(2, 8))
    add = _call(ctx, aten.add.Tensor)
    new, (s, y) = ctx.emit("add_layer_norm", (add.args[0], add.args[1], [8], None, None, 1e-5),
                           lowering="add_layer_norm", sources=[add], anchor=add, after=add, output_anchors=(add,))
    assert [s.target, y.target] == [operator.getitem, operator.getitem] and s.args == (new, 0)
    assert s.meta["flydsl"]["anchor"] == "add" and s.meta["flydsl"]["sources"] == []
    assert "flydsl" not in y.meta  # no anchor given for the second output
    assert before(new, s) and before(s, y) and in_order([y, s, new]) == [new, s, y]


def test_stable_toposort_moves_only_what_must_move():
    ctx = _graph(lambda x: (x.exp() + 1).relu(), torch.randn(4))
    g = ctx.gm.graph
    exp, add, relu = _call(ctx, aten.exp.default), _call(ctx, aten.add.Tensor), _call(ctx, aten.relu.default)
    exp.prepend(add)  # add now sits before what it reads
    stable_toposort(g)
    g.lint()
    assert in_order([relu, add, exp]) == [exp, add, relu]


# --- the registry ------------------------------------------------------------------------------

def test_a_stage_typo_is_an_error_not_an_idle_rule():
    with pytest.raises(AttributeError):
        R.Stage.CANNONICAL  # noqa: B018
    with pytest.raises(TypeError, match="must be a translator.registry.Stage"):
        R.register_rule(R.Rule("x", "softmax", "canonical", (), lambda n, c: None, lambda n, c: None))
    with pytest.raises(ValueError, match="unknown family"):
        R.register_rule(R.Rule("x", "sofmax", R.Stage.CANONICAL, (), lambda n, c: None, lambda n, c: None))


def test_support_checks_answer_with_a_typed_verdict():
    def rule_with(answer):
        return R.Rule("probe", "softmax", R.Stage.CANONICAL, (), lambda n, c: answer, lambda n, c: None)

    assert R.check(rule_with(None), None, None) == R.SUPPORTED
    assert R.check(rule_with(R.NO_MATCH), None, None) == R.NOT_MATCHED and not R.NOT_MATCHED.matched
    v = R.check(rule_with("K=250 is not a multiple of 8"), None, None)
    assert (v.supported, v.reason, v.matched) == (False, "K=250 is not a multiple of 8", True)
    with pytest.raises(TypeError, match="NO_MATCH"):
        R.check(rule_with(False), None, None)  # a bool is not an answer


def test_the_rewrite_receives_the_match_its_check_found():
    """Match once: the check's match object reaches the rewrite; a Reason lands on the other nodes it names."""
    seen = []
    found = R.Match(a="left", b="right")
    r = R.Rule("probe", "softmax", R.Stage.CANONICAL, (), lambda n, c: found, lambda n, c, m: seen.append(m))
    v = R.check(r, None, None)
    assert v.supported and v.match is found
    r.apply(None, None, v)
    assert seen == [found] and seen[0].a == "left"
    two = R.Rule("probe", "softmax", R.Stage.CANONICAL, (), lambda n, c: None, lambda n, c: seen.append("two"))
    two.apply(None, None, R.check(two, None, None))  # a check that binds nothing: (node, ctx)
    assert seen[-1] == "two" and not R.NO_MATCH
    why = R.Reason("fp64 is not supported", also=("mean", "rsqrt"))
    v = R.check(R.Rule("probe", "softmax", R.Stage.CANONICAL, (), lambda n, c: why, lambda n, c: None), None, None)
    assert (v.supported, v.reason, v.reason.also) == (False, "fp64 is not supported", ("mean", "rsqrt"))


def test_rules_are_tried_by_priority_then_name():
    names = [r.name for r in R.rules_for(R.Stage.CONSUMER)]
    assert names.index("gemm_epilogue") < names.index("add_layer_norm")  # priority 1 before 0
    zero = [r.name for r in R.rules_for(R.Stage.CANONICAL) if r.priority == 0]
    assert zero == sorted(zero)


def test_every_stage_has_rules_and_regions_come_from_region_rules():
    assert all(R.rules_for(s) for s in R.Stage)
    assert [r.name for r in R.REGION_RULES] == ["fused_elementwise"]
    # no per-node stand-in rule (a DECOMPOSE rule rewrites a form into aten ops that regions then take: rope.py)
    assert not any(r.family == "fused_elementwise" and r.stage is not R.Stage.DECOMPOSE for r in R.RULES)


# --- residual add + norm as a consumer fold ------------------------------------------------------

class ResidualNorm(nn.Module):
    """h = x + r feeds a LayerNorm and is read again: before the norm in graph order, or after it."""

    def __init__(self, read_before):
        super().__init__()
        self.ln, self.read_before = nn.LayerNorm(16), read_before

    def forward(self, x, r):
        h = x + r
        if self.read_before:
            a = torch.tanh(h)  # that reader moves after the fused op
            return self.ln(h) * a
        return self.ln(h) + h


@pytest.mark.parametrize("read_before,precision", [(True, "fp32"), (False, "bf16")])
def test_residual_add_joins_the_norm(read_before, precision):
    torch.manual_seed(0)
    tm = translate(ResidualNorm(read_before).eval(), (torch.randn(2, 3, 16), torch.randn(2, 3, 16)),
                   backend="reference", precision=precision)
    assert tm.report.counters.get("add_layer_norm") == 1, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
