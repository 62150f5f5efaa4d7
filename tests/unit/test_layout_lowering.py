"""Data-movement ops through translate(): each lowering's counter fires, the report says a FlyDSL
kernel ran, numerics match eager exactly on flysim; expand / repeat of size-1 dims read by a
generated elementwise kernel fold into its broadcast indexing and a fill into a constant of its
program; an expand or unfold only PyTorch ops read stays a view; shape-only values stay for
fold_shapes; what the kernel cannot take stays in PyTorch with its reason."""

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate

OPS = ["pad", "roll", "repeat", "index_select", "unfold", "zeros_like", "repeat_interleave", "index", "masked_fill",
       "clamp", "clamp_min", "expand"]


class DataMovement(nn.Module):
    def forward(self, x, idx, m):
        a = F.pad(x, (1, 2, 0, -1), value=3.0)
        b = torch.roll(x, shifts=(1, -2), dims=(0, 1))
        c = x.repeat(2, 1, 3)
        e = torch.index_select(x, 1, idx)
        f = x.unfold(1, 2, 3).reshape(4, 4)  # materialized for the reshape (a lone unfold stays a view)
        h = torch.zeros_like(x)
        j = x.repeat_interleave(2, dim=1)
        k = x[idx]
        l = x.masked_fill(m, float("-inf"))
        n = torch.clamp(x, min=x[0], max=x[1] + 1) + torch.clamp_min(x, x[2])
        o = x[:, None].expand(4, 2, 6).reshape(8, 6)  # materialized for the view that follows
        p = x[:1].expand(3, 6).clone()  # the kernel's output is fresh: the clone is dropped
        return a, b, c, e, f, h, j, k, l, n, o, p


def _rows(tm, *names):
    return {r.node: r for r in tm.report.rows if r.node in names}


def test_data_movement_ops_run_on_flydsl_kernels():
    m = DataMovement()
    x, idx = torch.randn(4, 6), torch.tensor([0, 2, 3])
    mask = x > 0.5
    tm = translate(m, (x, idx, mask), backend="flysim")
    c = tm.report.counters
    for name in ("pad", "roll", "repeat", "index_select", "unfold", "fill", "repeat_interleave", "index"):
        assert c.get(f"layout_{name}") == 1, name
    assert c.get("layout_expand") == 2 and c.get("layout_copy_absorbed") == 1
    assert tm.report.verification.passed
    rows = _rows(tm, *OPS)
    assert set(rows) == set(OPS)
    assert all(r.where == "flydsl-kernel" for r in rows.values()), {k: r.detail for k, r in rows.items()}
    assert all("fused_elementwise" in rows[k].detail for k in ("masked_fill", "clamp", "clamp_min"))
    x2, idx2 = torch.randn(4, 6), torch.tensor([3, 3, 1])
    x2[1, 2] = float("nan")  # a NaN value, and a NaN clamp bound: minimum / maximum propagate it as clamp does
    outs = tm(x2, idx2, x2 < 0)
    for got, want in zip(outs, m(x2, idx2, x2 < 0)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    kernels = [r.kernel for r in tm.last_launches]
    assert sum(k.startswith("layout_kernel") for k in kernels) == 10
    with pytest.raises(IndexError, match="index 9 is out of range for a dim of size 6"):
        tm(x2, torch.tensor([0, 9, 1]), x2 < 0)


class Broadcasts(nn.Module):
    def forward(self, x, s, t):
        y = (x * s.expand(4, 6) + t.repeat(4, 1) - s.expand_as(x)) * torch.full_like(x, 0.1)
        return y, torch.cat([x, s.expand(4, 2)], 1), x.unfold(1, 2, 2)  # cat reads the view's strides: no copy


def test_expand_and_repeat_read_by_an_elementwise_kernel_become_broadcast():
    m = Broadcasts()
    x, s, t = torch.randn(4, 6), torch.randn(4, 1), torch.randn(1, 6)
    tm = translate(m, (x, s, t), backend="flysim")
    assert tm.report.counters.get("layout_broadcast_folded") == 3
    assert tm.report.counters.get("layout_fill_folded") == 1  # full_like: a constant of the program
    assert tm.report.counters.get("layout_expand_kept_as_view") == 1
    assert tm.report.counters.get("layout_unfold_kept_as_view") == 1  # returned: eager returns the view too
    assert tm.report.verification.passed
    out = tm(x, s, t)
    assert [r.kernel.split("_")[0] for r in tm.last_launches] == ["fused"]  # one kernel, no copies
    for got, want in zip(out, m(x, s, t)):
        torch.testing.assert_close(got, want, **model_tol("fp32", "few_ops"))
    rows = _rows(tm, "expand", "repeat", "expand_as", "full_like")
    assert len(rows) == 4
    assert all(r.where == "flydsl-kernel" and "fused_elementwise" in r.detail for r in rows.values())
    assert _rows(tm, "expand_1")["expand_1"].where == "pytorch"


class Fallbacks(nn.Module):
    def forward(self, x, ids):
        pos = torch.arange(x.shape[1]).repeat(x.shape[0], 1)  # shape-only: folded at specialization
        r = torch.roll(x, 1)  # flattened roll
        both = x[ids, ids]  # two index tensors
        k = ids.masked_fill(ids > 2, 0)  # int64 elementwise
        return pos, r, both, k


def test_what_stays_in_pytorch_says_why():
    x, ids = torch.randn(4, 5), torch.tensor([0, 3, 1])
    tm = translate(Fallbacks(), (x, ids), backend="flysim")
    assert tm.report.verification.passed
    assert not any(k.startswith("layout_") and k != "layout_broadcast_folded" for k in tm.report.counters)
    rows = _rows(tm, "repeat", "roll", "index", "masked_fill")
    assert rows["repeat"].where == "folded"
    assert rows["roll"].where == "pytorch" and "flattened" in rows["roll"].detail
    assert rows["index"].where == "pytorch" and "2 index tensors" in rows["index"].detail
    assert rows["masked_fill"].where == "pytorch" and "int64" in rows["masked_fill"].detail


class DynamicExpand(nn.Module):
    def forward(self, x, s):
        return x * s.expand(x.shape[0], -1, 6) + 1


def test_an_expand_to_a_traced_size_folds_into_the_elementwise_kernel():
    m = DynamicExpand()
    x, s = torch.randn(3, 5, 6), torch.randn(1, 5, 1)
    tm = translate(m, (x, s), backend="flysim")
    assert tm.report.dynamic_dims and tm.report.counters.get("layout_broadcast_folded") == 1
    row = _rows(tm, "expand")["expand"]
    assert row.where == "flydsl-kernel" and "fused_elementwise" in row.detail
    x2 = torch.randn(7, 5, 6)  # another batch: the same graph, no copy of s
    torch.testing.assert_close(tm(x2, s), m(x2, s), **model_tol("fp32", "few_ops"))
    assert [r.kernel.split("_")[0] for r in tm.last_launches] == ["fused"]
