"""Shared test set-up.

This checkout's packages go first on sys.path: the repository root (translator,
translator_kernels, bench, models) and flysim/src (flysim is its own distribution in
./flysim). pytest prepends each test file's folder, and an editable install elsewhere (or
a folder named like a package) would otherwise shadow them; with these first, `import
flysim`, `import translator` and `import translator_kernels` always mean this checkout's.
"""

import os
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
FLYSIM_SRC = str(Path(ROOT) / "flysim" / "src")  # flysim is its own distribution in ./flysim
for p in (FLYSIM_SRC, ROOT):
    if p in sys.path:
        sys.path.remove(p)
    sys.path.insert(0, p)

if not os.environ.get("PYTEST_XDIST_WORKER") and "FLYDSL_TRANSLATOR_ISA_MEMO" not in os.environ:
    # ISA compiles (translator_kernels.isa: a child process each, a Python + torch + FlyDSL start and a
    # compile) are kept for the session in one folder the xdist workers inherit: tests that read the same
    # kernel's ISA compile it once. Fresh per session, so a hit is what a compile of this tree returns.
    import atexit
    import shutil
    import tempfile

    _memo = tempfile.mkdtemp(prefix="flydsl-isa-memo-")
    os.environ["FLYDSL_TRANSLATOR_ISA_MEMO"] = _memo
    atexit.register(shutil.rmtree, _memo, True)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist (`-n N`) the N workers share the machine's cores: one torch thread each,
    # or N workers x torch's default of one thread per core oversubscribe it.
    import torch

    torch.set_num_threads(1)


# --- the executor kernel tests run on (tests/kernels/conftest.py: the `executor` fixture) ---------

def pytest_addoption(parser):
    parser.addoption("--executor", choices=("auto", "flysim", "rocm"), default="auto",
                     help="what runs the kernel tests' FlyDSL kernels: flysim (the interpreter, CPU), rocm (an AMD "
                          "GPU) or auto (rocm when an AMD GPU is present, else flysim)")


def pytest_configure(config):
    config.addinivalue_line("markers", "flysim_only(reason): the test reads what only flysim reports (counters, "
                                       "races, out-of-bounds records); skipped on the rocm executor")
    from executors import choose_executor  # tests/executors.py
    from translator.runtime import rocm_gpu_present

    config.executor = choose_executor(config.getoption("--executor"), rocm_gpu_present())


def pytest_collection_modifyitems(config, items):
    from executors import skip_flysim_only

    skip_flysim_only(items, config.executor)
