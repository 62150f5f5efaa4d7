"""The README's supported-op table is generated from the registry, and its commands exist."""

from pathlib import Path

from translator.report.ops_table import readme_with_table

ROOT = Path(__file__).resolve().parents[2]


def test_ops_table_is_current():
    text = (ROOT / "README.md").read_text()
    assert readme_with_table(text) == text, "run: .venv/bin/python -m translator.report.ops_table --update-readme"


def test_ci_calls_the_readme_test_command():
    assert "./run test" in (ROOT / "README.md").read_text()
    assert "./run test" in (ROOT / ".ci" / "run").read_text()
