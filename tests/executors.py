"""What runs a kernel test's FlyDSL kernels: flysim (the interpreter, on the CPU) or rocm (an AMD GPU).

Chosen once per session (tests/conftest.py: `--executor`, flysim by default, rocm where an AMD GPU is
present: `choose_executor`) and handed out by the `executor` fixture (tests/kernels/conftest.py), which also makes it
`current()` for a test module's helpers. A test is the same code on both up to the launch: it builds
inputs on the CPU, `put`s them where the executor reads them, runs the kernel inside `run(arch)`,
and asserts on `launches` and on its outputs (back on the CPU):

    with executors.current().run(arch) as ex:
        out = softmax(ex.put(x), log=False)
    assert len(ex.launches) == 1
    torch.testing.assert_close(out.cpu(), ...)

A test that reads what only flysim reports (counters, races, grids) carries `@pytest.mark.flysim_only(why)`;
a numeric test that also checks a counter where one exists does so under `if ex.counts:`.
"""

from __future__ import annotations

import contextlib

import pytest

ACTIVE: list = []


def choose_executor(asked: str, gpu_present: bool) -> str:
    """flysim by default, rocm where an AMD GPU is present; asking for rocm without one is a usage error
    (one line at session start), not a crash in the first kernel test."""
    if asked == "rocm" and not gpu_present:
        raise pytest.UsageError("--executor rocm needs an AMD GPU (a ROCm build of torch that sees a device); "
                                "none is present here: run with --executor flysim (the default without a GPU)")
    if asked == "auto":
        return "rocm" if gpu_present else "flysim"
    return asked


def skip_flysim_only(items, executor: str) -> list:
    """On an executor other than flysim, skip the tests marked flysim_only, each with its reason;
    returns the skipped ones."""
    skipped = []
    for item in items if executor != "flysim" else ():
        mark = item.get_closest_marker("flysim_only")
        if mark is not None:
            why = mark.args[0] if mark.args else "flysim only"
            item.add_marker(pytest.mark.skip(reason=f"flysim only ({why}); executor is {executor}"))
            skipped.append(item)
    return skipped


class Executor:
    def __init__(self, name: str):
        self.name = name
        self.device = "cuda" if name == "rocm" else "cpu"
        self.launches: list = []
        self.sim = None  # the flysim session (flysim only)

    @property
    def counts(self) -> bool:
        """True where launch records carry counters (flysim's LaunchRecord; rocm records the kernel only)."""
        return self.name == "flysim"

    def put(self, t):
        return t.to(self.device) if hasattr(t, "to") else t

    @contextlib.contextmanager
    def run(self, arch: str, **flysim_options):
        """`flysim_options` (count_regions=True...) go to flysim.simulate: only a flysim_only test passes them."""
        if self.name == "flysim":
            import flysim

            with flysim.simulate(arch=arch, **flysim_options) as sim:
                self.launches, self.sim = sim.launches, sim
                yield self
            return
        if flysim_options:
            raise pytest.UsageError(f"flysim options {sorted(flysim_options)} on the {self.name} executor: mark the test "
                                    "@pytest.mark.flysim_only(why)")
        from translator_kernels.arch import device_arch
        from translator_kernels.launch import launch_log

        here = device_arch()
        if here != arch:
            pytest.skip(f"the GPU here is {here}; this case is for {arch}")
        with launch_log([]) as launches:
            self.launches = launches
            yield self


def current() -> Executor:
    """The executor of the running test (set by the `executor` fixture)."""
    if not ACTIVE:
        raise RuntimeError("no executor: kernel tests take it from the `executor` fixture (tests/kernels/conftest.py)")
    return ACTIVE[0]
