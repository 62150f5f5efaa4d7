"""Which executor the kernel tests run on (tests/conftest.py, tests/executors.py).

Nothing here runs the rocm executor (no AMD GPU on these machines): the choice is tested, and a
request for rocm without a GPU ends the session at its start with one line that says what to do.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import executors  # noqa: E402
from executors import choose_executor  # noqa: E402


@pytest.mark.parametrize("asked,gpu,got", [("auto", False, "flysim"), ("auto", True, "rocm"),
                                           ("flysim", True, "flysim"), ("flysim", False, "flysim"),
                                           ("rocm", True, "rocm")])
def test_flysim_by_default_rocm_where_a_gpu_is(asked, gpu, got):
    assert choose_executor(asked, gpu) == got


def test_rocm_without_a_gpu_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="--executor rocm needs an AMD GPU.*--executor flysim"):
        choose_executor("rocm", False)


def test_asking_for_rocm_here_stops_the_session_with_one_line():
    r = subprocess.run([sys.executable, "-m", "pytest", "--executor", "rocm", "-q", "-p", "no:cacheprovider",
                        "tests/kernels/test_softmax.py", "-k", "rejects"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]  # pytest's usage error, no test ran
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert err == ["ERROR: --executor rocm needs an AMD GPU (a ROCm build of torch that sees a device); none is "
                   "present here: run with --executor flysim (the default without a GPU)"]
    assert "Traceback" not in r.stdout + r.stderr


def test_the_flysim_executor_runs_a_kernel_and_records_its_launch():
    import torch

    from translator.tolerances import op_tol
    from translator_kernels.rows.softmax import softmax

    ex = executors.Executor("flysim")
    x = torch.randn(3, 64)
    with ex.run("gfx942") as on:
        out = softmax(on.put(x), log=False)
    assert len(ex.launches) == 1 and ex.device == "cpu"
    torch.testing.assert_close(out, torch.softmax(x, -1), **op_tol(torch.float32, "softmax"))


def test_the_rocm_executor_moves_inputs_to_the_gpu():
    assert executors.Executor("rocm").device == "cuda" and executors.Executor("flysim").device == "cpu"


def test_kernel_tests_take_the_executor_from_the_fixture():
    """No kernel test opens flysim itself (flysim.simulate): each runs its kernels in
    `executors.current().run(arch)`, and a test that reads what only flysim reports (counters, grids,
    injected faults) carries @pytest.mark.flysim_only(why) or checks counters under `if ex.counts:`."""
    opening = {p.name for p in (ROOT / "tests" / "kernels").glob("test_*.py") if "flysim.simulate(" in p.read_text()}
    assert opening == set(), "take the executor from the fixture (tests/executors.py)"


def test_flysim_options_are_refused_on_rocm():
    """flysim.simulate's options (count_regions...) reach flysim only; on rocm they name the marker to add."""
    ex = executors.Executor("rocm")
    with pytest.raises(pytest.UsageError, match="flysim_only"):
        with ex.run("gfx942", count_regions=True):
            pass
    assert executors.Executor("flysim").counts and not ex.counts


class _Item:
    def __init__(self, *marks):
        self.marks, self.added = list(marks), []

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, m):
        self.added.append(m.mark)


def test_flysim_only_tests_are_skipped_on_rocm_with_their_reason():
    counters, plain = _Item(pytest.mark.flysim_only("reads MFMA counters").mark), _Item()
    assert executors.skip_flysim_only([counters, plain], "flysim") == [] and not counters.added
    assert executors.skip_flysim_only([counters, plain], "rocm") == [counters] and not plain.added
    (skip,) = counters.added
    assert skip.name == "skip" and skip.kwargs["reason"] == "flysim only (reads MFMA counters); executor is rocm"
