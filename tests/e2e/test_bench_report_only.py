"""python -m bench.report --only CMD: reruns one command's section and keeps the others as they were."""

import pytest

from bench import report


def test_only_reruns_one_section_and_keeps_the_rest(tmp_path, monkeypatch):
    page = tmp_path / "B.md"
    page.write_text("# Benchmarks\n\nold header\n\n## `python -m bench.calibration` (exit 0, 1 s)\n\nold calibration\n\n"
                    "## `python -m bench.calibration --gemm-tables` (exit 0, 9 s)\n\nkept gemm table\n")
    ran = []

    class Done:
        returncode, stdout, stderr = 0, "## Fresh\n\nnew calibration", ""

    monkeypatch.setattr(report.subprocess, "run", lambda cmd, **kw: ran.append(cmd[1:]) or Done)
    monkeypatch.setattr(report, "machine", lambda: "test machine")
    assert report.main(["--out", str(page), "--only", "python -m bench.calibration"]) == 0
    text = page.read_text()
    assert ran == [["-m", "bench.calibration"]]
    assert "new calibration" in text and "### Fresh" in text and "old calibration" not in text
    assert "kept gemm table" in text and "old header" not in text and report._calibration() in text
    assert "## `python -m bench.kernels` (not run)" in text


@pytest.mark.parametrize("env_src, cmd, want", [
    (None, "python -m bench.rocm", "$FLYDSL_SRC set."),
    (None, "python -m bench.kernels", "$FLYDSL_SRC set (the sections rerun by --only: not given)."),
    ("/src", "python -m bench.kernels", "$FLYDSL_SRC set.")])
def test_only_keeps_the_headers_flydsl_source_note(tmp_path, monkeypatch, env_src, cmd, want):
    """The kept sections were made with $FLYDSL_SRC set: --only without it does not rewrite the note to
    'not given'; a rerun section that reads the source says what it had beside it."""
    page = tmp_path / "B.md"
    page.write_text("# Benchmarks\n\nGenerated on a day; machine: m. FlyDSL source for the side-by-side: $FLYDSL_SRC "
                    "set.\nRows labelled MODEL ...\n\n## `python -m bench.rocm` (exit 0, 1 s)\n\nold\n")

    class Done:
        returncode, stdout, stderr = 0, "new", ""

    monkeypatch.setattr(report.subprocess, "run", lambda cmd, **kw: Done)
    monkeypatch.setattr(report, "machine", lambda: "test machine")
    if env_src:
        monkeypatch.setenv("FLYDSL_SRC", env_src)
    else:
        monkeypatch.delenv("FLYDSL_SRC", raising=False)
    assert report.main(["--out", str(page), "--only", cmd]) == 0
    head = page.read_text().split("\n## ", 1)[0]
    assert "FlyDSL source for the side-by-side: " + want in head


def test_only_refuses_a_command_the_page_does_not_run(tmp_path):
    with pytest.raises(SystemExit):
        report.main(["--out", str(tmp_path / "B.md"), "--only", "python -m bench.nothing"])
