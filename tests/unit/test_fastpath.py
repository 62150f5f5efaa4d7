"""The fast path (translator.runtime.fastpath) against the custom-op path on flysim.

Same outputs bit for bit, the same OpCalls with the same flysim launch records per graph node,
and the fast path really bypasses the custom ops (their bodies are never entered)."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from translator import translate
from translator.registry import FAMILIES
from translator.runtime import fastpath


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x):
        h = F.gelu(self.fc(x)) + x
        return torch.softmax(self.ln(h), -1), h.sum(-1), torch.cumsum(h, -1)


@pytest.fixture(scope="module")
def tm():
    torch.manual_seed(0)
    return translate(Small().eval(), (torch.randn(4, 32),), backend="flysim", verify=False, dynamic_shapes=None)


@pytest.fixture
def custom_op_entries(monkeypatch):
    """Counts entries into the custom ops' bodies (each calls its lowering module's `dispatch`)."""
    count = [0]
    for name in ("gemm", "elementwise", "norm", "softmax", "reduce", "scan"):
        mod = importlib.import_module(f"translator.lowerings.{name}")
        orig = mod.dispatch

        def counted(*args, _orig=orig):
            count[0] += 1
            return _orig(*args)

        monkeypatch.setattr(mod, "dispatch", counted)
    return count


def _records(tm):
    return [(c.family, c.node, [(r.kernel, r.grid, r.block, r.arch, r.counters) for r in c.launches])
            for c in tm.last_calls]


def test_fast_path_matches_custom_op_path(tm, custom_op_entries):
    x = torch.randn(4, 32)
    n = len(tm._flydsl_nodes)
    assert n >= 5, tm.code  # gemm, elementwise, layer_norm, softmax, reduce, scan
    with torch.no_grad():
        assert fastpath.usable(tm.gm, (x,))
        fast = tm(x)
        fast_records, fast_launches = _records(tm), len(tm.last_launches)
        assert custom_op_entries[0] == 0  # no torch.ops.flydsl.* call was made
        assert sum(r.where == "flydsl-kernel" for r in tm.report.rows) >= n  # the report observed the fast calls
        tm.fast_path = False
        try:
            slow = tm(x)
        finally:
            tm.fast_path = True
        assert custom_op_entries[0] == n
    slow_records = _records(tm)
    assert len(fast_records) == n and all(r[2] for r in fast_records)  # every node launched a FlyDSL kernel
    assert fast_records == slow_records
    assert fast_launches == len(tm.last_launches) >= n
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fast_forward_reads_the_graph_modules_state_and_follows_recompile(tm):
    fwd = fastpath.fast_forward(tm.gm)
    assert fwd is fastpath.fast_forward(tm.gm)  # built once
    assert "torch.ops.flydsl" in tm.gm.code and "torch.ops.flydsl" not in fwd.source
    assert "flydsl_gemm(" in fwd.source
    assert list(tm.state_dict()) == list(tm.__dict__["_model"].state_dict())  # the model's: nothing added
    x = torch.randn(4, 32)
    new = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in tm.gm.state_dict().items()}
    old_sd = {k: v for k, v in tm.gm.state_dict().items()}
    tm.backend = "reference"  # plain torch: this test is about which tensors the graph reads
    try:
        tm.gm.load_state_dict(new, assign=True)  # new tensor objects in the graph module
        with torch.no_grad():
            fast = tm(x)
            tm.fast_path = False
            slow = tm(x)
    finally:
        tm.fast_path, tm.backend = True, "flysim"
        tm.gm.load_state_dict(old_sd, assign=True)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    tm.gm.recompile()
    assert fastpath.fast_forward(tm.gm) is not fwd


def test_fast_forward_reads_attributes_as_dicts_and_falls_back(tm):
    """Parameters are read as dict entries at the top (no nn.Module.__getattr__), inputs and outputs
    skip the pytree specs where they are plain, the export guards skip Module.__call__; a module
    whose layout changed after the build (a parameter now a plain attribute) is still read right."""
    src = fastpath.fast_forward(tm.gm).source
    assert "._parameters['weight']" in src and "tree_flatten_spec" not in src and "tree_unflatten" not in src
    assert "_guards_fn" not in src or ".forward(" in src
    x = torch.randn(4, 32)
    ln = tm.gm.ln
    w = ln.weight
    tm.backend = "reference"
    try:
        with torch.no_grad():
            before = tm(x)
            del ln._parameters["weight"]
            ln.weight = w.detach() * 2  # a plain attribute now: the dict read misses, FX's read finds it
            fast = tm(x)
            tm.fast_path = False
            slow = tm(x)
    finally:
        tm.fast_path, tm.backend = True, "flysim"
        del ln.weight
        ln.weight = w
    assert not torch.equal(fast[0], before[0])
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fast_path_not_taken_where_it_could_differ(tm):
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert fastpath.usable(tm.gm, (x,))
    assert not fastpath.usable(tm.gm, (x.requires_grad_(),))  # autograd would record through the custom ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.no_grad(), FakeTensorMode() as mode:
        assert not fastpath.usable(tm.gm, (mode.from_tensor(torch.randn(4, 32)),))


def test_schema_args_fill_defaults_and_keywords():
    op = FAMILIES["softmax"].op.default
    assert fastpath.schema_args(op, (1,), {"dim": -1, "log": False}) == (1, -1, False)
    with pytest.raises(TypeError, match="log"):
        fastpath.schema_args(op, (1, -1), {})


def test_elementwise_plans_once_per_layout(monkeypatch):
    """A repeated call plans nothing; a different base-address alignment gets its own plan."""
    import flysim

    from translator_kernels.codegen import elementwise as ew
    from translator_kernels.program import Program, ref_program

    plans = [0]
    orig = ew.make_geometry

    def counted(*a):
        plans[0] += 1
        return orig(*a)

    monkeypatch.setattr(ew, "make_geometry", counted)
    prog = Program(2, (("gelu", (0,), ()), ("add", (2, 1), ())), ((3, "f32"),)).text()
    x, y = torch.randn(8, 64), torch.randn(64)
    odd = torch.randn(8 * 64 + 1)[1:].view(8, 64)  # base address 4 bytes off: no 128-bit accesses
    with flysim.simulate(arch="gfx942") as sim:
        outs = [ew.fused_elementwise([x, y], prog)[0]]
        first = plans[0]
        outs += [ew.fused_elementwise([x, y], prog)[0] for _ in range(2)]
        assert plans[0] == first  # repeated calls planned nothing
        got_odd = ew.fused_elementwise([odd, y], prog)[0]
        assert plans[0] > first
    assert len(sim.launches) == 4 and all(r.kernel.startswith("fused_elementwise_") for r in sim.launches)
    assert sim.launches[0].kernel != sim.launches[3].kernel  # the unaligned call runs its own kernel
    for got in outs:
        torch.testing.assert_close(got, ref_program([x, y], prog)[0])
    torch.testing.assert_close(got_odd, ref_program([odd, y], prog)[0])


def test_elementwise_bad_input_still_raises_after_a_good_call():
    import flysim

    from translator_kernels.errors import KernelInputError
    from translator_kernels.codegen.elementwise import fused_elementwise
    from translator_kernels.program import Program

    prog = Program(1, (("neg", (0,), ()),), ((1, "f32"),)).text()
    with flysim.simulate(arch="gfx942"):
        fused_elementwise([torch.randn(4, 8)], prog)
        with pytest.raises(KernelInputError, match="dtype"):
            fused_elementwise([torch.randn(4, 8, dtype=torch.float64)], prog)


def test_arch_follows_the_active_backend():
    import flysim

    from translator_kernels import launch

    for arch in ("gfx950", "gfx942", "gfx950"):
        with flysim.simulate(arch=arch):
            assert launch.arch() == arch


def test_reduce_and_scan_validate_once_per_layout(monkeypatch):
    import flysim

    from translator_kernels.codegen import reduce as red
    from translator_kernels.codegen import scan as sc
    from translator_kernels.program import Program

    seen = {"prepare": 0, "validate": 0}
    for mod, name in ((red, "prepare"), (sc, "_validate")):
        orig = getattr(mod, name)

        def counted(*a, _orig=orig, _name=name.strip("_")):
            seen[_name] += 1
            return _orig(*a)

        monkeypatch.setattr(mod, name, counted)
    ident = Program(1, (), ((0, "f32"),)).text()
    x = torch.randn(8, 48)
    with flysim.simulate(arch="gfx942") as sim:
        sums = [red.fused_reduce([x], ident, "sum", [-1], False)[0]]
        scans = [sc.scan([x], ident, "cumsum", -1)]
        first = dict(seen)  # 1 each, or 0 where an earlier test in this process saw the layout
        sums += [red.fused_reduce([x], ident, "sum", [-1], False)[0] for _ in range(2)]
        scans += [sc.scan([x], ident, "cumsum", -1) for _ in range(2)]
    assert seen == first and max(first.values()) <= 1
    assert len(sim.launches) == 6
    for s, c in zip(sums, scans):
        torch.testing.assert_close(s, x.sum(-1))
        torch.testing.assert_close(c, x.cumsum(-1))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_custom_op_body_is_dispatch_in_schema_order(name):
    """The contract the fast path relies on: flydsl::<name>(*args) == dispatch(name, *args)."""
    from translator import runtime

    fam = FAMILIES[name]
    assert fam.sample_inputs is not None, f"flydsl.{name} registers no sample inputs (the registry tests need them)"
    args = fam.sample_inputs(torch.float32)
    with runtime.use_backend("reference", "gfx942") as st:
        want = fam.op(*args)
        got = fastpath.caller(name)(*fastpath.schema_args(fam.op.default, args, {}))
    assert [c.family for c in st.calls] == [name, name]
    for a, b in zip(*(x if isinstance(x, (list, tuple)) else [x] for x in (want, got))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
