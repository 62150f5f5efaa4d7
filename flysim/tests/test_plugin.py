"""flysim.pytest_plugin on GPU-style tests of ours (plugin_cases/): one category per test, the report."""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_plugin_categorizes_gpu_style_tests(tmp_path):
    report = tmp_path / "report.md"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), env_path()]))
    cmd = [sys.executable, "-m", "pytest", "-p", "flysim.pytest_plugin", "-p", "no:cacheprovider", "-q",
           "-o", "python_files=*_cases.py", "--rootdir", str(HERE / "plugin_cases"), "--flysim-arch", "gfx942",
           "--flysim-max-lanes", "65536", "--flysim-report", str(report), str(HERE / "plugin_cases" / "gpu_style_cases.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert (tmp_path / "report.md.json").exists(), out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "report.md.json").read_text())
    got = {k.split("::")[-1]: v for k, v in data["results"].items()}
    assert got["test_double_passes"]["category"] == "passed" and got["test_double_passes"]["launches"] == 1, out.stdout
    timed = got["test_timed_double_passes"]  # 24 launches under torch.profiler without the plugin's stubs
    assert timed["category"] == "passed" and timed["launches"] == 1, (timed, out.stdout[-3000:])
    fail = got["test_wrong_reference_fails"]
    assert fail["category"] == "failed" and "Greatest absolute difference" in fail["detail"], fail
    assert got["test_cube_root_unsupported"] == {**got["test_cube_root_unsupported"], "category": "unsupported",
                                                  "detail": "math.cbrt"}
    assert got["test_large_launch_over_cap"]["category"] == "over cap"
    assert got["test_wmma_needs_rdna4"]["category"] == "not applicable"
    # speed line: lane-ops per second of simulation; DOUBLE, run by four tests (each in its own
    # simulate session), is decoded once
    assert got["test_double_passes"]["lane_ops"] > 1000 and data["lane_ops"] >= 2 * got["test_double_passes"]["lane_ops"]
    assert data["programs_decoded"] == 1, data
    table = report.read_text()
    assert "lane-ops/s" in table and "1 programs decoded" in table, table
    assert "| **total** | 2 | 0 | 1 | 1 | 1 | 1 | 0 | 0 | 0 |" in table, table


def env_path():
    return os.environ.get("PYTHONPATH", "")
