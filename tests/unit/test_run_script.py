"""./run's setup says which torch it installs, and it is true where torch comes from a local wheel (this
workplace's machines: pip's find-links hold 2.13.0+cpu) and where it comes from the package registry (a
developer's machine: PyPI's Linux x86_64 wheel is the CUDA build, several GB). Before, the line always said
"torch==2.13.0 (CPU)", "a ~190 MB wheel". `./run torch-plan` prints the line setup prints; pip's find-links
are set through PIP_FIND_LINKS, which pip reads too."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _plan(links: str) -> str:
    env = dict(os.environ, PIP_FIND_LINKS=links)
    return subprocess.run(["bash", str(ROOT / "run"), "torch-plan"], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _python3_tag() -> str:
    out = subprocess.run(["python3", "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def test_a_local_wheel_is_named_with_its_build_and_size(tmp_path):
    tag = _python3_tag()
    whl = tmp_path / f"torch-2.13.0+cpu-cp{tag}-cp{tag}-manylinux_2_28_x86_64.whl"
    whl.write_bytes(b"\0" * (3 * 1048576))
    plan = _plan(f"{tmp_path / 'missing'} file://{tmp_path}")  # pip's form: folders or file:// URLs, several
    assert plan.startswith("torch==2.13.0 (cpu build, the wheel at ") and str(whl) in plan, plan
    assert "a 3 MB file on this machine" in plan, plan


def test_the_registry_build_is_named_where_no_wheel_is_local(tmp_path):
    (tmp_path / f"torch-2.12.0+cpu-cp{_python3_tag()}-none-any.whl").write_bytes(b"")  # another version
    plan = _plan(str(tmp_path))
    assert plan.startswith("torch==2.13.0 from the package registry"), plan
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert "CUDA build" in plan and "several GB" in plan and "CPU" not in plan, plan


def test_setup_prints_the_plan():
    text = (ROOT / "run").read_text()
    assert 'plan=$(torch_plan)' in text and 'pip_long "${plan%%|*}" "${plan#*|}" install "$TORCH_PIN"' in text
    assert "(CPU)" not in text  # the label that was wrong on a machine without the local wheel


def test_the_readme_says_what_setup_installs():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "torch 2.13.0 CPU" not in text  # true only where pip is pointed at the CPU wheel
    assert "`./run torch-plan` says which build" in text
