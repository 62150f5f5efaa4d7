"""docs/adding-an-op.md cannot drift: its commands run, and the files and tests it names exist.

- `python -m <module> <flags>`: the regenerate command runs (exit 0) and writes what the README
  test wants; every other module command must resolve to a module with a `__main__` block that
  reads each flag it is given.
- `pytest <file> -k <expr>`: runs, selects at least one test, and every selected test passes.
- every `tests/...py`, `translator/...py`, `translator_kernels/...py` path and `test_<name>` it names
  exists.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-an-op.md"
TEXT = DOC.read_text()
COMMANDS = sorted(set(re.findall(r"`((?:python -m|pytest) [^`]+)`", TEXT)))
MODULES = [c for c in COMMANDS if c.startswith("python -m")]


def test_the_doc_has_commands():
    assert any("ops_table --update-readme" in c for c in MODULES) and any(c.startswith("pytest") for c in COMMANDS)


@pytest.mark.parametrize("command", MODULES)
def test_module_commands_name_a_runnable_module_and_its_flags(command):
    module, *args = command.split()[2:]
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{command}: no module {module}"
    src = Path(spec.origin).read_text()
    assert re.search(r'^if __name__ == "__main__":', src, re.M), f"{command}: {module} has no __main__ block"
    for flag in (a for a in args if a.startswith("--")):
        assert flag in src, f"{command}: {module} does not read {flag} (the command would silently do nothing)"


def test_the_regenerate_command_rewrites_the_readme_table():
    from translator.report.ops_table import readme_with_table

    readme = ROOT / "README.md"
    before = readme.read_text()
    command = next(c for c in MODULES if "--update-readme" in c)
    try:
        r = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "updated" in r.stdout and readme.read_text() == readme_with_table(before)
    finally:
        readme.write_text(before)  # the README test (tests/e2e/test_readme.py) judges whether it was current


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("pytest")])
def test_pytest_commands_run_and_pass(command):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        *command.split()[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    ran = re.search(r"(\d+) passed", r.stdout)
    assert r.returncode == 0 and ran and int(ran.group(1)) >= 1, \
        f"{command} runs no passing test:\n{r.stdout[-1500:]}{r.stderr[-1500:]}"


def test_named_files_and_tests_exist():
    paths = set(re.findall(r"\b((?:tests|translator|translator_kernels)/[\w/]+\.py)", TEXT))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == [], f"docs/adding-an-op.md names files that do not exist: {missing}"
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    names = set(re.findall(r"\b(test_\w+)(?:\[|`|\b)", TEXT)) - {p.rsplit("/", 1)[-1][:-3] for p in paths}
    gone = sorted(n for n in names if f"def {n}(" not in sources)
    assert gone == [], f"docs/adding-an-op.md names tests that do not exist: {gone}"
