"""The report's cost model (translator.report.cost): every op that does arithmetic has FLOPs and
bytes (grouped GEMMs, FFT, recurrent layers, triu / tril), every aten op of the model zoo and the
HF audit falls under a rule, a data-dependent size is named and bounded, and a graph with
functional collectives says what share of its rank's FLOPs and bytes they are."""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from translator import translate
from translator.capture import capture
from translator.report import cost

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]


def _costs(model, *inputs):
    gm = capture(model.eval(), tuple(inputs), None).gm
    return gm, cost.measure(gm, list(inputs))


def _by_op(gm, costs, name):
    return [costs[n.name] for n in gm.graph.nodes if n.op == "call_function" and cost.short_name(n.target) == name]


def test_grouped_mm_counts_every_expert_gemm():
    a = torch.randn(10, 16)
    w = torch.randn(3, 16, 24)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    out = aten._grouped_mm(a.bfloat16(), w.bfloat16(), offs)
    assert cost.model_flops(aten._grouped_mm.default, (a, w, offs), out) == 2 * 10 * 16 * 24
    assert cost.cost_class(aten._grouped_mm.default) == "grouped_mm"


def test_transformers_grouped_mm_fallback_is_costed():
    pytest.importorskip("transformers.integrations.moe")
    op = torch.ops.transformers.grouped_mm_fallback.default
    a, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    offs = torch.tensor([2, 6])
    assert cost.model_flops(op, (a, w, offs), op(a, w, offs)) == 2 * 6 * 8 * 4


def test_fft_and_recurrent_layers_have_flops():
    class F(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x, dim=-1).abs()

    gm, c = _costs(F(), torch.randn(4, 64))
    (fft,) = _by_op(gm, c, "_fft_r2c") + _by_op(gm, c, "fft_rfft")
    assert fft[0] == int(5 * 4 * 33 * math.log2(64)) and fft[1] > 0

    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    gm, c = _costs(lstm, torch.randn(2, 5, 8))
    (lc,) = _by_op(gm, c, "lstm")
    tokens, weights = 2 * 5, 4 * 16 * 8 + 4 * 16 * 16
    assert lc[0] >= 2 * tokens * weights, lc
    gru = torch.nn.GRU(8, 16)
    gm, c = _costs(gru, torch.randn(5, 2, 8))
    (gc,) = _by_op(gm, c, "gru")
    assert gc[0] >= 2 * 10 * (3 * 16 * 8 + 3 * 16 * 16)


def test_triu_is_a_masking_op_not_layout():
    from translator.report.rows import is_layout

    assert not is_layout(aten.triu.default) and cost.cost_class(aten.triu.default) == "masking"

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.triu(x) * 2

    tm = translate(M(), (torch.randn(8, 8),), backend="reference")
    (row,) = [r for r in tm.report.rows if r.op.endswith("triu")]
    assert not row.layout and row.flops == 64 and row.bytes == 2 * 64 * 4


def test_data_dependent_size_is_named_and_bounded():
    class M(torch.nn.Module):
        def forward(self, x):
            return x[x > 0].sum() + 1

    x = torch.randn(64)
    tm = translate(M(), (x,), backend="reference")
    rows = [r for r in tm.report.rows if "data-dependent" in r.shapes]
    assert rows, [r.shapes for r in tm.report.rows]
    assert any("<= 64" in r.shapes for r in rows), [r.shapes for r in rows]  # bounded by x's 64 elements
    assert tm.report.to_markdown() and tm.report.headline()
    idx = [r for r in tm.report.rows if r.op.endswith("index") and "data-dependent" in r.shapes]
    # costed at the example inputs' run: x (fp32), the bool mask, and the selected elements
    assert idx and idx[0].bytes == 64 * 4 + 64 + int((x > 0).sum()) * 4, idx


def test_hand_written_moe_loop_reports_without_crash():
    class MoE(torch.nn.Module):
        def __init__(self, d=16, e=4):
            super().__init__()
            self.router = torch.nn.Linear(d, e)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(e))

        def forward(self, x):
            w, idx = self.router(x).softmax(-1).topk(2, -1)
            out = torch.zeros_like(x)
            for e, ex in enumerate(self.experts):
                tok, slot = torch.where(idx == e)
                out.index_add_(0, tok, ex(x[tok]) * w[tok, slot, None])
            return out

    torch.manual_seed(0)
    tm = translate(MoE().eval(), (torch.randn(12, 16),), backend="reference")
    s = tm.report.summary()
    assert s["flops_total"] > 0 and "data-dependent" in tm.report.to_markdown()


# ---- every aten op of the model zoo and the HF audit falls under a cost rule ------------------------
def _zoo():
    sys.path.insert(0, str(ROOT / "models"))
    for f in sorted((ROOT / "models").glob("*.py")):
        if f.name.startswith("_"):
            continue
        mod = importlib.import_module(f.stem)
        torch.manual_seed(0)
        yield f.stem, mod.Model(*mod.get_init_inputs()), tuple(mod.get_inputs())


def _uncosted(model, inputs) -> set:
    if hasattr(getattr(model, "config", None), "use_cache"):
        model.config.use_cache = False  # a cache object in the output is not what is costed here
    gm = capture(model.eval(), tuple(inputs), None).gm
    return {str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and cost.cost_class(n.target) == "uncosted"}


def test_every_model_zoo_op_is_costed():
    bad = {name: u for name, m, x in _zoo() if (u := _uncosted(m, x))}
    assert not bad, f"ops with no cost rule (add one to translator.report.cost): {bad}"


def _hf_cases(cases):
    pytest.importorskip("transformers")
    from translator_kernels.measure.hf_cases import audit_case

    for c in cases:
        try:
            yield c, *audit_case(c)
        except (AttributeError, ImportError):  # a family this transformers lacks
            continue


def test_hf_moe_ops_are_costed():
    bad = {c: u for c, m, x in _hf_cases(["mixtral", "qwen2_moe", "llama"]) if (u := _uncosted(m, x))}
    assert not bad, bad


@pytest.mark.slow
def test_every_hf_audit_op_is_costed():
    from translator_kernels.measure.hf_cases import AUDIT, FAMILIES

    bad = {}
    for c, m, x in _hf_cases([*FAMILIES, *AUDIT]):
        try:
            u = _uncosted(m, x)
        except Exception as e:  # noqa: BLE001 - a capture failure is the audit's business, not the cost model's
            print(f"{c}: capture failed ({type(e).__name__})")
            continue
        if u:
            bad[c] = u
    assert not bad, bad


# ---- functional collectives: a rank's share ------------------------------------------------------
def test_rank_share_of_collectives(tmp_path):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    store = dist.FileStore(os.path.join(tmp_path, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        class TP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(32, 32, bias=False)

            def forward(self, x):
                return fc.all_reduce(self.lin(x), "sum", dist.group.WORLD)

        tm = translate(TP().eval(), (torch.randn(4, 32),), backend="reference", verify=False)
        # translate's eager run waited its collective (else torch warns of it when the process ends)
        assert torch._C._distributed_c10d._get_work_registry_size() == 0
        s = tm.report.summary()
        assert s["rank"] == 0 and s["world_size"] == 1
        assert s["collective_ops"] >= 1 and 0 < s["collective_byte_share"] < 1
        assert s["collective_flops"] == 4 * 32
        assert "rank 0/1 holds" in tm.report.headline() and "collectives" in tm.report.to_markdown()
    finally:
        dist.destroy_process_group()


def test_fp32_headline_says_what_bf16_would_change():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    tm = translate(model, (torch.randn(8, 64),), backend="reference")
    what = tm.report.precision_what_if()
    assert "precision='bf16' would take" in what and "MI300X" in what and "MODEL" in what
    assert what in tm.report.headline() and what in tm.report.to_markdown()
    tm16 = translate(model, (torch.randn(8, 64),), backend="reference", precision="bf16")
    assert tm16.report.precision_what_if() == ""
