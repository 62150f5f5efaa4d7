"""The report as a new user reads it: one capture line that says each fact once, a terminal table
that fits the terminal's width (op names whole), and a legend for the * of dynamic dims."""

from __future__ import annotations

import pytest

from translator.report import Report, Row
from translator.report.names import DYNAMIC_DIM

DYN = "2*x16*x128 -> 2*x16*x128"


def report(shapes=DYN, capture="torch.export (dynamic dims)", dims=((0, 0), (0, 1)), n=6, big=True) -> Report:
    """Six rows; `big`: an op name of 33 characters and FLOPs of 14 (else mini_gpt's: 16 and 9)."""
    rows = [Row(f"linear_{i}", ("aten.scaled_dot_product_attention" if big else "aten.layer_norm") if i == 2
                else "aten.linear", shapes, "float32",
                "pytorch" if i % 2 else "flydsl-kernel",
                "flydsl.gemm [linear] — FlyDSL kernel launched: gemm_fp32_m128_n128_k32_bias_relu_epilogue"
                if i % 2 == 0 else "stays in PyTorch: K=250 is not a multiple of 8 (bf16 needs 16-byte rows)",
                flops=(12_884_901_888 if big else 1_048_576) * (i + 1)) for i in range(n)]
    return Report("model", "gfx942", "flysim", "requested", "fp32", capture, [], rows=rows,
                  dynamic_dims=[tuple(d) for d in dims])


def rendered(capsys, monkeypatch, r: Report, columns: int) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))  # shutil.get_terminal_size reads it first
    r.render()
    return capsys.readouterr().out.splitlines()


def test_the_capture_line_says_each_fact_once():
    r = report()
    assert r.capture_line() == "torch.export; dynamic dims: input 0 dim 0, input 0 dim 1 (marked * in shapes)"
    (line,) = [ln for ln in r.to_markdown().splitlines() if ln.startswith("- capture:")]
    assert line == f"- capture: {r.capture_line()}" and line.count("dynamic dims") == 1
    assert report(capture="torch.export (static)", dims=()).capture_line() == "torch.export (static)"
    assert report(dims=()).capture_line() == \
        "torch.export; dynamic dims asked for, none kept (every size fixed at its example value)"


def test_the_dynamic_dim_mark():
    assert DYNAMIC_DIM.search("2*x16*x128") and DYNAMIC_DIM.search("(4, 8*) -> 8*")
    assert not DYNAMIC_DIM.search("2x16x128 -> 2x16x128") and not DYNAMIC_DIM.search("2*s0x16 -> 2*s0x16")


@pytest.mark.parametrize("shapes,legend", [(DYN, True), ("2x16x128 -> 2x16x128", False), ("2*s0x16", False)])
def test_the_legend_only_under_a_dynamic_dim(capsys, monkeypatch, shapes, legend):
    out = rendered(capsys, monkeypatch, report(shapes), 120)
    lines = [ln for ln in out if ln.startswith("* after a size")]
    assert len(lines) == legend, out
    if legend:
        assert lines[0] == "* after a size: a dynamic dim (input 0 dim 0, input 0 dim 1), shown at its example size"


@pytest.mark.parametrize("columns,big", [(80, False), (100, True), (150, True)])
def test_the_table_fits_the_terminal_with_whole_op_names(capsys, monkeypatch, columns, big):
    out = rendered(capsys, monkeypatch, report(big=big), columns)
    assert max(map(len, out)) <= columns, [ln for ln in out if len(ln) > columns]
    text = "\n".join(out)
    assert text.count("aten.scaled_dot_product_attention" if big else "aten.layer_norm") == 1
    assert text.count("aten.linear") == 5 and "flydsl-kernel" in text  # op names and places whole
    assert ("12,884,901,888" if big else "1,048,576") in text
    # a narrow terminal reads the dtype beside the shapes, and no node names (report.md has them)
    assert ("dtype" in out[1]) == ("node" in out[1]) == (columns >= 150), out[1]
    assert text.count("float32") == 6  # in its column, or after the shapes


def test_a_terminal_too_narrow_keeps_the_op_names_readable(capsys, monkeypatch):
    out = rendered(capsys, monkeypatch, report(), 30)
    table = out[:out.index(next(ln for ln in out if ln.startswith("* after")))]
    assert "aten.scaled_dot_product_attention" in "\n".join(table)
    assert 30 < max(map(len, table)) <= 100  # drawn at the narrowest width that reads, no wider
