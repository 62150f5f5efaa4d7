"""Fixtures of the kernel tests."""

import os
from pathlib import Path

import pytest

import executors  # tests/executors.py

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def without_translator(tmp_path_factory):
    """Environment for a subprocess in which `import translator` fails: what the kernel library emits
    (check scripts) must run with the kernel library, FlyDSL and torch alone."""
    block = tmp_path_factory.mktemp("no_translator")
    (block / "translator").mkdir()
    (block / "translator" / "__init__.py").write_text(
        'raise ImportError("kernel library code imported translator (it must run without it)")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(ROOT), str(ROOT / "flysim" / "src")])
    return env


@pytest.fixture(scope="session")
def compiled_isa():
    """compiled_isa(jobs, name, arch) -> the translator_kernels.isa.Compiled of jobs[name].

    `jobs` maps names to translator_kernels.isa jobs (entry, args, kwargs). The first request for
    an arch compiles ALL of them in one child process (a child costs a start of Python, torch and
    FlyDSL, most of a small kernel's compile time); the results are kept for the session, so tests
    that assert different things about the same kernels compile them once. A failed compile raises
    its IsaCompileError in the tests that ask for that job."""
    from translator_kernels.isa import compile_many

    done: dict = {}

    def get(jobs: dict, name: str, arch: str):
        key = (arch, repr(sorted(jobs.items())))
        if key not in done:
            done[key] = dict(zip(jobs, compile_many(list(jobs.values()), arch)))
        if isinstance(done[key][name], Exception):
            raise done[key][name]
        return done[key][name]

    return get


@pytest.fixture(scope="session")
def gemm_isa(compiled_isa):
    """gemm_isa(name, arch) -> the translator_kernels.isa.Compiled of gemm_isa_jobs.jobs(arch)[name]:
    every GEMM ISA job of the kernel tests compiles in the first request's child for that arch."""
    import gemm_isa_jobs  # this folder's helper module (on sys.path as the tests' folder)

    return lambda name, arch: compiled_isa(gemm_isa_jobs.jobs(arch), name, arch)



@pytest.fixture(autouse=True)
def executor(request):
    """The session's executor (tests/conftest.py: --executor), also what `executors.current()` returns to
    a module's helpers (a test's run_kernel need not pass it along)."""
    ex = executors.Executor(request.config.executor)
    executors.ACTIVE[:] = [ex]
    yield ex
    executors.ACTIVE.clear()
