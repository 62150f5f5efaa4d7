"""In-place ops are functionalized before matching (counter + numerics), and left alone where
the mutation is observable (numerics)."""

import pytest
import torch
import torch.nn as nn

from translator import translate


def flydsl_ops(tm):
    return [n.target._opname for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]


class InplaceResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc(x)
        h += x                      # aten.add_: a residual the GEMM epilogue takes
        y = h.clone()
        y.mul_(0.5)                 # aten.mul_
        z = torch.zeros_like(x)
        z.copy_(y)                  # aten.copy_
        return torch.relu(z).detach_()


def test_inplace_ops_become_out_of_place_and_fuse():
    torch.manual_seed(0)
    m = InplaceResidual().eval()
    x = torch.randn(4, 32)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.counters.get("functionalize", 0) >= 4
    code = tm.gm.code
    assert not any(op in code for op in ("add_", "mul_", "copy_", "detach_")), code
    # the residual add_ folds into the GEMM epilogue; mul_ and relu (after the residual) fuse into one kernel
    assert flydsl_ops(tm) == ["gemm", "fused_elementwise"], code
    gemm = next(n for n in tm.gm.graph.nodes if getattr(n.target, "_opname", "") == "gemm")
    assert gemm.args[6] is not None  # the residual operand
    torch.testing.assert_close(tm(x), m(x))


def test_inplace_ops_on_flysim():
    torch.manual_seed(0)
    m = InplaceResidual().eval()
    x = torch.randn(4, 32)
    tm = translate(m, (x,), backend="flysim")
    assert tm.report.counters.get("functionalize", 0) >= 4 and tm.report.verification.passed
    tm(x)
    assert len(tm.last_launches) == 2  # the gemm and the fused elementwise kernel


class ObservedMutation(nn.Module):
    def forward(self, x):
        h = x * 2
        v = h.view(-1)              # a view taken before the mutation sees it
        h.add_(1.0)
        return v * 3


def test_observable_mutation_is_left_alone():
    m = ObservedMutation().eval()
    x = torch.randn(4, 8)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.counters.get("functionalize", 0) == 0
    torch.testing.assert_close(tm(x), m(x))


class MutationThroughAView(nn.Module):
    def __init__(self, read_base_after):
        super().__init__()
        self.read_base_after = read_base_after

    def forward(self, x):
        h = x * 2
        v = h.view(2, -1)
        v.add_(1.0)                 # writes through to h
        return h * 3 if self.read_base_after else v * 3


def test_inplace_on_a_view_is_functionalized_only_where_the_base_is_not_read_after():
    x = torch.randn(4, 8)
    m = MutationThroughAView(read_base_after=False).eval()
    tm = translate(m, (x,), backend="reference")
    assert tm.report.counters.get("functionalize", 0) == 1 and "add_" not in tm.code
    torch.testing.assert_close(tm(x), m(x))
    # the base is read after the write through its view: the write stays in place (flydsl.elementwise_ on the view)
    tm = translate(MutationThroughAView(read_base_after=True).eval(), (x,), backend="reference")
    assert tm.report.counters.get("functionalize", 0) == 0 and tm.report.counters.get("inplace_add_") == 1


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_regions_do_not_span_a_write_through_a_view(backend):
    """x * 2 and h * 3 must not fuse across `v.add_(1)`: the FX edge of h * 3 is to h, not to
    the write, and one fused kernel would compute h * 3 from the unwritten h (off by 3)."""
    x = torch.randn(4, 8)
    m = MutationThroughAView(read_base_after=True).eval()
    tm = translate(m, (x,), backend=backend)
    assert flydsl_ops(tm) == ["fused_elementwise", "elementwise_", "fused_elementwise"], tm.code  # the write between
    torch.testing.assert_close(tm(x), m(x))
    if backend == "flysim":
        assert len(tm.last_launches) == 3


class WriteBetweenUnrelatedOps(nn.Module):
    def forward(self, x, y):
        a = x + 1                   # reads x before the write
        x.view(-1).mul_(2.0)        # a graph input written through a view
        return a * 5, y * 3 + (x - 1)


def test_region_reading_a_written_input_stays_on_its_side_of_the_write():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    m = WriteBetweenUnrelatedOps().eval()
    want = m(x.clone(), y)
    x2 = x.clone()
    tm = translate(m, (x.clone(), y), backend="reference", verify=False)
    got = tm(x2, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x2, x * 2)
