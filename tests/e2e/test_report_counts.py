"""What the report says ran equals what flysim recorded.

The report's kernel counts, its per-kernel view, its per-row "FlyDSL kernel launched" claims and
its per-family op counts are checked against flysim's launch records of the same forward. The
rewrite counters count every region a pass made, also those a later pass folded whole into
another kernel (an elementwise region that became a GEMM epilogue): those are reported apart, as
absorbed, never as kernels of their own. Before, a model whose every elementwise region became
an epilogue listed `fused_elementwise ×6` and no absorbed count.
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch
import torch.nn as nn

from translator import translate


def check_claims_against_launches(tm):
    """Every claim of tm.report about kernels equals the launches flysim recorded in tm's last call."""
    rep, records = tm.report, tm.last_launches
    assert records, "flysim recorded no launch"
    recorded = Counter(r.kernel for r in records)
    assert Counter(k["kernel"] for recs in rep.launches.values() for k in recs) == recorded
    s = rep.summary()
    assert s["flydsl_launches"] == len(records)
    assert f"{len(records)} kernel launches recorded" in rep.to_markdown()
    assert Counter(k["kernel"] for k in rep.kernel_view()) == recorded
    by_node = {c.node: c.launches for c in tm.last_calls}
    assert sum(len(v) for v in by_node.values()) == len(records)
    # the family counts name the ops that launched, one row each in the report's ops
    assert Counter(f"flydsl.{rep.ops[n]['family']}" for n, recs in by_node.items() if recs) == Counter(s["flydsl_ops"])
    for r in rep.rows:
        if r.where == "flydsl-kernel":
            names = {getattr(x, "kernel", None) for x in by_node[r.flydsl_node]}
            assert names and all(n in r.detail for n in names), (r.node, r.detail, names)
    # a rewrite's region folded whole into another kernel is reported absorbed, not as a kernel
    for family, n in s["flydsl_ops"].items():
        fam = family.removeprefix("flydsl.")
        if fam in rep.counters:  # the lowering named like its family (fused_elementwise, layer_norm)
            assert rep.counters[fam] - rep.counters.get(f"absorbed_{fam}", 0) == n, (fam, rep.counters)
    return s


class EpilogueAndRegion(nn.Module):
    """x @ W + residual (an elementwise region absorbed into the GEMM's epilogue) and an
    elementwise region of its own (it follows a reduction's input, not the GEMM)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x, y):
        h = self.fc(x) + x
        return h, torch.sigmoid(y) * y + 1.0


def test_absorbed_region_is_not_reported_as_a_kernel():
    torch.manual_seed(0)
    tm = translate(EpilogueAndRegion().eval(), (torch.randn(4, 32), torch.randn(4, 32)), backend="flysim")
    assert tm.report.verification.passed
    s = check_claims_against_launches(tm)
    assert tm.report.counters["fused_elementwise"] == 2 and tm.report.counters["epilogue_residual"] == 1
    assert s["flydsl_absorbed"] == {"flydsl.fused_elementwise": 1}
    assert s["flydsl_ops"] == {"flydsl.gemm": 1, "flydsl.fused_elementwise": 1}
    assert "folded whole into another FlyDSL kernel" in tm.report.to_markdown()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mini_gpt", "llama_block"])
def test_model_report_matches_flysim_launches(name):
    mod = importlib.import_module(f"models.{name}")
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    inputs = mod.get_inputs()
    tm = translate(model, tuple(inputs), backend="flysim", name=name)
    assert tm.report.verification.passed
    with torch.no_grad():
        tm(*inputs)
    check_claims_against_launches(tm)
