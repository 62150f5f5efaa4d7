"""Integer and bool elementwise regions: int32 / int64 math in the generated kernels, exact.

Pattern tests (the rewrite's counter and numerics, on flysim with the kernel's launch record) for
the integer mask arithmetic models write at run time: position ids from a runtime attention mask
(Llama / Mistral generation, RoBERTa's `create_position_ids_from_input_ids`), `where` with scalar
branches, int64 values past 2**24 (where an fp32 detour would round). A property test draws random
integer DAGs (int32 / int64 inputs, arithmetic, floor division and remainder by a nonzero divisor,
bitwise ops, comparisons, where with a scalar branch, casts) and checks ONE fused kernel, equal to
eager bit for bit. Shape-only integer chains are left to fold_shapes (computed once per shape).
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from translator import translate

FUSED = torch.ops.flydsl.fused_elementwise.default
REDUCED = torch.ops.flydsl.fused_reduce.default


def aten_left(tm, keep=()):
    """Compute ops left in PyTorch (export's metadata asserts on an input are checks, not compute)."""
    keep = ("getitem", "_assert_tensor_metadata") + tuple(keep)
    return [str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function" and "flydsl" not in str(n.target)
            and not any(k in str(n.target) for k in keep)]


def run_flysim(model, inputs, kernels=1):
    tm = translate(model.eval(), inputs, backend="flysim")
    assert tm.report.verification.passed, tm.report.verification
    want, got = model(*inputs), tm(*inputs)
    assert len(tm.last_launches) == kernels, [c.kernel for c in tm.last_launches]
    return tm, want, got


class PositionIds(torch.nn.Module):
    """Llama-style generation with a padded batch: position ids from the runtime attention mask."""

    def forward(self, mask):
        pos = mask.long().cumsum(-1) - 1
        return torch.where(mask == 0, 1, pos)  # == (cumsum - 1).masked_fill(mask == 0, 1)


def test_position_ids_from_runtime_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]])
    tm, want, got = run_flysim(PositionIds(), (mask,))
    assert tm.report.counters["fused_elementwise"] == 1 and tm.report.counters["fused_elementwise_ops"] == 3
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert aten_left(tm, keep=("cumsum",)) == []  # an int64 cumsum stays in PyTorch (scan.py says why)


class RobertaPositions(torch.nn.Module):
    """transformers' create_position_ids_from_input_ids: int32 mask arithmetic, an int64 result."""

    def forward(self, ids, padding_idx: int = 1):
        mask = ids.ne(padding_idx).int()
        incremental = torch.cumsum(mask, dim=1).type_as(mask) * mask
        return incremental.long() + padding_idx


def test_roberta_position_ids_int32_then_int64():
    ids = torch.tensor([[5, 7, 9, 1, 1], [3, 1, 4, 1, 5]])
    tm, want, got = run_flysim(RobertaPositions(), (ids,), kernels=2)  # ne + cast before the cumsum, the rest after
    assert tm.report.counters["fused_elementwise"] == 2
    assert got.dtype == torch.int64 and torch.equal(got, want)


class BigInts(torch.nn.Module):
    def forward(self, x, y):
        return x * 3 + 2**40 - (y // 7), torch.where(x > y, x, -(2**45)), (x % 1000003).to(torch.int32)


def test_int64_exact_past_2_24():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-(2**41), 2**41, (4, 33), generator=g)
    y = torch.randint(-(2**41), 2**41, (33,), generator=g)
    x[0, 0], y[0] = 2**24 + 1, 2**53 + 1  # one more than fp32 / fp64 can hold
    tm, want, got = run_flysim(BigInts(), (x, y), kernels=3)  # three outputs, no shared op: three regions
    assert tm.report.counters["fused_elementwise"] == 3 and not aten_left(tm)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and torch.equal(o, w)


class WhereScalars(torch.nn.Module):
    def forward(self, x, c):
        return torch.where(c, x, 0.0) * 2, torch.where(c, 1.5, -1e4), torch.where(c, 7, x.long())


def test_where_with_scalar_branches_is_a_kernel():
    x, c = torch.randn(3, 17), torch.rand(3, 17) > 0.5
    tm, want, got = run_flysim(WhereScalars(), (x, c), kernels=3)
    assert tm.report.counters["fused_elementwise"] == 3 and not aten_left(tm)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and torch.equal(o, w)


class ShapeOnly(torch.nn.Module):
    def forward(self, x):
        pos = torch.ones_like(x, dtype=torch.long).cumsum(-1) - 1  # depends on x's shape only
        return x + torch.where(pos % 2 == 0, pos, -pos).float()


def test_shape_only_integer_chain_is_folded_not_a_kernel():
    x = torch.randn(2, 9)
    tm, want, got = run_flysim(ShapeOnly(), (x,))
    assert tm.report.counters["fold_shapes"] >= 4  # cumsum, sub, remainder, eq, neg, where, cast
    assert tm.report.counters["fused_elementwise"] == 1 and tm.report.counters["fused_elementwise_ops"] == 1
    torch.testing.assert_close(got, want)


class IntPrologue(torch.nn.Module):
    def forward(self, ids):
        return ((ids * 2 + 1) % 5).float().sum(-1)


def test_integer_region_folds_into_a_reduction_prologue():
    ids = torch.randint(-1000, 1000, (4, 64))
    tm, want, got = run_flysim(IntPrologue(), (ids,))
    assert tm.report.counters["reduce_prologue_fused"] == 1 and not aten_left(tm)
    assert [n.target for n in tm.gm.graph.nodes if "flydsl" in str(n.target)] == [REDUCED]
    assert torch.equal(got, want)


# --- random integer DAGs ----------------------------------------------------------------------

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
    "floordiv": lambda a, b: a // (b.abs() + 1), "remainder": lambda a, b: a % (b.abs() + 1),
    "trunc_div": lambda a, b: torch.div(a, b.abs() + 1, rounding_mode="trunc"),
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
    "where_lt": lambda a, b: torch.where(a < b, a, 7), "where_ne": lambda a, b: torch.where(a != b, -3, b),
    "ge_cast": lambda a, b: (a >= b).to(a.dtype) + b, "min_other": lambda a, b: torch.min(a, b),
}
UNARY = {"neg": torch.neg, "abs": torch.abs, "not": torch.bitwise_not, "scale": lambda a: a * 3 - 5,
         "to_i32": lambda a: (a - 1).to(torch.int32), "to_i64": lambda a: (a + 1).to(torch.int64),
         "clamp": lambda a: a.clamp(-1000, 2**20), "mod_scalar": lambda a: a % 17,
         "float_round_trip": lambda a: (a.clamp(-(2**20), 2**20).float() * 0.5).to(a.dtype)}


@st.composite
def int_dags(draw):
    n_in = draw(st.integers(1, 3))
    dtypes = [draw(st.sampled_from([torch.int32, torch.int64])) for _ in range(n_in)]
    steps, n_vals = [], n_in
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(UNARY))), (draw(st.integers(0, n_vals - 1)),)))
        else:
            steps.append((draw(st.sampled_from(sorted(BINARY))),
                          (draw(st.integers(0, n_vals - 1)), draw(st.integers(0, n_vals - 1)))))
        n_vals += 1
    return dtypes, steps, draw(st.sampled_from([(7,), (3, 5), (2, 1, 33)])), draw(st.integers(0, 2**31 - 1))


class IntDag(torch.nn.Module):
    def __init__(self, steps, n_in):
        super().__init__()
        self.steps, self.n_in = steps, n_in

    def forward(self, *xs):
        vals, used = list(xs), set()
        for name, args in self.steps:
            vals.append((UNARY.get(name) or BINARY[name])(*[vals[a] for a in args]))
            used.update(args)
        leaves = [v for i, v in enumerate(vals) if i >= self.n_in and i not in used]
        out = leaves[0]
        for v in leaves[1:]:
            out = out + v
        return out


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(int_dags())
def test_random_integer_dags_flysim(case):
    dtypes, steps, shape, seed = case
    g = torch.Generator().manual_seed(seed)
    big = {torch.int32: 2**30, torch.int64: 2**40}
    xs = tuple(torch.randint(-big[dt], big[dt], shape, generator=g, dtype=torch.int64).to(dt) for dt in dtypes)
    model = IntDag(steps, len(xs))
    tm = translate(model.eval(), xs, backend="flysim", verify=False, dynamic_shapes=None)
    assert [n.target for n in tm.gm.graph.nodes if "flydsl" in str(n.target)] == [FUSED], (steps, dtypes)
    assert not aten_left(tm), (steps, aten_left(tm))
    want, got = model(*xs), tm(*xs)
    assert len(tm.last_launches) == 1
    assert got.dtype == want.dtype and torch.equal(got, want), (steps, dtypes, (got != want).sum())
