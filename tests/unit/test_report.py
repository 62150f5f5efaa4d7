"""The report tells what ran: rows from recorded launches, built from the final graph,
with our own FLOP and byte model and a per-launch view."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import translator
import translator.lowerings  # noqa: F401  (fills the registry)
from translator.registry import FAMILIES
from translator.report import cost
from translator.report.html import render_html
from translator_kernels.arch import gpu


class Mlp(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return torch.softmax(self.ln(F.relu(self.fc(x))), -1)


@pytest.fixture(scope="module")
def flysim_mlp():
    torch.manual_seed(0)
    m = Mlp().eval()
    x = torch.randn(4, 32)
    return m, x, translator.translate(m, (x,), backend="flysim")


def test_kernel_rows_come_from_recorded_launches(flysim_mlp):
    _, _, tm = flysim_mlp
    r = tm.report
    assert r.verification.passed
    fly = [row for row in r.rows if row.where.startswith("flydsl")]
    assert fly and all(row.where == "flydsl-kernel" for row in fly), [(row.node, row.where) for row in fly]
    assert not r.without_launch()
    assert set(r.launches) == set(r.ops) == {c.node for c in tm.last_calls}
    assert len(tm.last_launches) == sum(len(c.launches) for c in tm.last_calls) >= len(r.ops)
    for row in fly:  # each row names the kernel its op launched
        assert any(k["kernel"] in row.detail for k in r.launches[row.flydsl_node])


def test_a_flydsl_op_that_launches_nothing_is_not_reported_as_a_kernel(monkeypatch):
    """The audit's experiment: make flysim quietly run the torch reference. The rows must say so."""
    fam = FAMILIES["softmax"]
    monkeypatch.setattr(fam, "kernel", fam.reference)
    m = nn.Softmax(-1)
    tm = translator.translate(m, (torch.randn(4, 16),), backend="flysim")
    (row,) = [row for row in tm.report.rows if row.flydsl_node]
    assert row.where == "flydsl-reference" and "no kernel launch recorded" in row.detail
    assert tm.last_launches == [] and tm.report.without_launch() == [row.flydsl_node]
    assert tm.report.summary()["flydsl_kernel_nodes"] == 0 and tm.report.kernel_view() == []


def test_rows_wait_for_a_call_when_verification_is_off():
    tm = translator.translate(nn.Softmax(-1), (torch.randn(4, 16),), backend="flysim", verify=False)
    (row,) = [row for row in tm.report.rows if row.flydsl_node]
    assert row.where == "flydsl-op" and not tm.report.launches
    tm(torch.randn(4, 16))
    assert row.where == "flydsl-kernel" and tm.report.launches[row.flydsl_node]


def test_reference_backend_never_reports_a_kernel():
    tm = translator.translate(Mlp().eval(), (torch.randn(4, 32),), backend="reference")
    wheres = {row.where for row in tm.report.rows if row.flydsl_node}
    assert wheres == {"flydsl-reference"} and tm.last_launches == []


class Losses(nn.Module):
    def forward(self, x, y, t):
        dead = x * 3  # noqa: F841 — dead code: removed, never "in PyTorch"
        loss = F.cross_entropy(x, t) + F.smooth_l1_loss(x, y) + F.kl_div(x.log_softmax(-1), y, reduction="sum")
        return loss + torch.cumsum(x, 1).sum() + (x.T @ y).sum()


def test_losses_scans_dead_nodes_and_views_are_attributed_from_the_final_graph():
    x, y, t = torch.randn(8, 8), torch.randn(8, 8), torch.randint(0, 8, (8,))
    tm = translator.translate(Losses(), (x, y, t), backend="reference", dynamic_shapes=None)
    rows = {r.op: r for r in tm.report.rows if not r.origin}
    for op in ("aten.cross_entropy_loss", "aten.smooth_l1_loss", "aten.kl_div", "aten.cumsum"):
        assert rows[op].where == "flydsl-reference", (op, rows[op].detail)
        assert rows[op].detail.startswith(("flydsl.fused_reduce", "flydsl.scan")), rows[op].detail
    dead = next(r for r in tm.report.rows if r.node == "mul")
    assert dead.where == "removed" and "dead code" in dead.detail
    assert rows["aten.numpy_T"].layout and rows["aten.numpy_T"].flops == 0
    # the captured cross_entropy's decomposition is spread over several FlyDSL ops; each says so
    ce_parts = [n for n, op in tm.report.ops.items() if any("cross_entropy_loss" in s for s in op["sources"])]
    assert len(ce_parts) >= 2
    # what the decomposition left in PyTorch has its own row, naming where it came from
    left = [r for r in tm.report.rows if r.origin == "cross_entropy_loss" and not r.layout]
    assert left and all(r.where == "pytorch" for r in left)
    assert not [r for r in tm.report.fallbacks() if r.detail.startswith("no FlyDSL lowering")]


def test_flop_and_byte_model_counts_elementwise_norm_softmax_and_reductions():
    class Rows(nn.Module):
        def forward(self, x):
            return torch.softmax(F.layer_norm(torch.relu(x) * 2.0, (64,)), -1).sum(-1)

    x = torch.randn(16, 64)
    tm = translator.translate(Rows(), (x,), backend="reference")
    s = tm.report.summary()
    n = x.numel()
    # relu 1 + mul 1 + layer_norm 7 + softmax 5 per element, then the sum 1 per input element
    assert s["flops_total"] == n * (1 + 1 + 7 + 5 + 1)
    assert s["flydsl_flop_share"] == 1.0 and s["flydsl_byte_share"] == 1.0 and s["flydsl_kernel_flop_share"] == 0.0
    assert s["bytes_total"] == 4 * (n + n) * 4 + 4 * (n + 16)  # four n->n ops, then n -> 16


def test_model_flops_per_op_table():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    assert cost.model_flops(torch.ops.aten.add.Tensor, [a, b], a + b) == 32
    assert cost.model_flops(torch.ops.aten.sum.dim_IntList, [a, [1]], a.sum(1)) == 32
    assert cost.model_flops(torch.ops.aten.var.correction, [a, [1]], a.var(1)) == 96
    assert cost.model_flops(torch.ops.aten.permute.default, [a, [1, 0]], a.T) == 0
    assert cost.is_view(torch.ops.aten.numpy_T.default) and not cost.is_view(torch.ops.aten.clone.default)
    t = cost.kernel_time(2e12, 1e9, "bf16", "gfx942")
    # MI300X: AMD's measured Max-Achievable FLOPs (708 TFLOPS bf16), not the 1307 TFLOPS peak; MI355X: no published
    # figure, the dense peak
    assert t["bound"] == "compute" and t["t"] == pytest.approx(2e12 / 708e12)
    assert gpu("gfx942").achievable_flops("bf16") < 0.55 * gpu("gfx942").peak_flops("bf16")
    t950 = cost.kernel_time(2e12, 1e9, "bf16", "gfx950")
    assert t950["t"] == pytest.approx(2e12 / gpu("gfx950").peak_flops("bf16"))


def test_kernel_view_one_row_per_launch_sorted_by_model_time(flysim_mlp):
    _, _, tm = flysim_mlp
    kv = tm.report.kernel_view()
    assert len(kv) == len(tm.last_launches)
    times = [k["MI300X us (MODEL)"] for k in kv]
    assert times == sorted(times, reverse=True) and all(t > 0 for t in times)
    gemm = next(k for k in kv if k["op"] == "flydsl.gemm")
    assert gemm["flops"] == 2 * 4 * 32 * 32 + 4 * 32  # the linear (FlopCounter: 2MNK), plus the relu it absorbed
    assert gemm["intensity"] == pytest.approx(gemm["flops"] / gemm["bytes"], rel=1e-2)
    assert gemm["MI355X us (MODEL)"] < gemm["MI300X us (MODEL)"]
    md = tm.report.to_markdown()
    assert "FlyDSL launches (times are a MODEL" in md and "calibration: fit on" in md and gemm["kernel"] in md


def test_html_shows_launch_chart_beside_pytorch_list(flysim_mlp):
    _, _, tm = flysim_mlp
    html = render_html(tm.report)
    assert "FlyDSL launches, by modeled time" in html and "What stays in PyTorch" in html
    for k in tm.report.kernel_view():
        assert k["kernel"] in html and k["node"] in html


BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def test_launch_chart_renders_in_headless_chromium(flysim_mlp, tmp_path):
    exe = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    assert exe, "no headless Chromium: ./run setup installs chromium-headless-shell"
    page = tmp_path / "report.html"
    page.write_text(render_html(flysim_mlp[2].report), encoding="utf-8")
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(common + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<rect") >= len(flysim_mlp[2].report.kernel_view()) + 1
    assert "roofline MODEL" in dom.stdout


def test_saved_report_keeps_launch_evidence(flysim_mlp, tmp_path):
    _, x, tm = flysim_mlp
    translator.save(tm, tmp_path / "m.pt2")
    back = translator.load(tmp_path / "m.pt2", backend="reference")
    assert back.report.launches == tm.report.launches and back.report.kernel_view() == tm.report.kernel_view()
    flysim_back = translator.load(tmp_path / "m.pt2", backend="flysim")  # calls after loading are evidence too
    flysim_back.report.launches.clear()
    flysim_back(x)
    assert set(flysim_back.report.launches) == set(tm.report.ops) and not flysim_back.report.without_launch()


def test_terminal_render_lists_the_launches(flysim_mlp):
    import io

    from rich.console import Console

    buf = io.StringIO()
    flysim_mlp[2].report.render(Console(file=buf, width=200))
    text = buf.getvalue()
    assert "FlyDSL launches" in text and all(k["kernel"] in text for k in flysim_mlp[2].report.kernel_view())
    assert "of bytes in FlyDSL ops" in text


def test_load_of_a_report_with_removed_nodes(tmp_path):
    class Dead(nn.Module):
        def forward(self, x):
            unused = x * 3  # noqa: F841 — a dead node: its row says "removed"
            return torch.softmax(x, -1)

    x = torch.randn(4, 16)
    tm = translator.translate(Dead(), (x,), backend="reference")
    assert [r.where for r in tm.report.rows if r.op == "aten.mul"] == ["removed"]
    translator.save(tm, tmp_path / "d.pt2")
    back = translator.load(tmp_path / "d.pt2", backend="auto")  # auto reads the families from the rows
    assert [r.where for r in back.report.rows] == [r.where for r in tm.report.rows]
    torch.testing.assert_close(back(x), torch.softmax(x, -1))
    want = "flydsl-kernel" if back.backend == "flysim" else "flydsl-reference"  # the new call is the evidence
    assert [r.where for r in back.report.rows] == ["removed", want]
