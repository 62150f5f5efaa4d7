"""flyc.compile under flysim: FlyDSL's CompiledFunction calling convention, no re-trace, and
the launch FlyDSL performs inside compile() when it is given live tensors is never skipped."""

import pytest
import torch

import flydsl.compiler as flyc
import flysim
from flydsl.compiler import jit_function as JF

import flysim_kernels as K


@pytest.fixture
def traces(monkeypatch):
    count = [0]
    orig = JF.JitFunction._trace

    def counting(self, *a, **k):
        count[0] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(JF.JitFunction, "_trace", counting)
    return count


def test_first_launch_inside_compile_runs(traces):
    """FlyDSL's own gfx950 GEMM launches this way: compile(launcher, *live) is the first launch."""
    add = K.build_add()
    a, b, c = torch.randn(300), torch.randn(300), torch.zeros(300)
    with flysim.simulate(arch="gfx942") as sim:
        fn = flyc.compile(add, a, b, c, 300)
        assert torch.equal(c, a + b), "the launch inside flyc.compile was skipped"
        assert len(sim.launches) == 1 and sim.launches[0].grid == (5, 1, 1)
        a2, b2, c2 = torch.randn(1000), torch.randn(1000), torch.zeros(1000)
        fn(a2, b2, c2, 1000, None)  # CompiledFunction convention: every parameter, stream last
    assert torch.equal(c2, a2 + b2)
    assert len(sim.launches) == 2 and sim.launches[1].grid == (16, 1, 1)
    assert traces[0] == 1  # the call interpreted the compiled program; nothing was traced again


def test_placeholders_compile_without_launching_and_reuse_across_sessions(traces):
    add = K.build_add()
    meta = torch.empty(64, device="meta")
    with flysim.simulate(arch="gfx950") as sim:
        fn = flyc.compile(add, meta, meta, meta, 64, None)
        assert sim.launches == []
    for n in (64, 200):
        a, b, c = torch.randn(n), torch.randn(n), torch.zeros(n)
        with flysim.simulate(arch="gfx950") as sim:
            fn(a, b, c, n, None)
        assert torch.equal(c, a + b) and sim.launches[-1].arch == "gfx950"
    assert traces[0] == 1


def test_compiled_function_refuses_what_it_cannot_run():
    add = K.build_add()
    meta = torch.empty(64, device="meta")
    with flysim.simulate(arch="gfx942"):
        fn = flyc.compile(add, meta, meta, meta, 64, None)
        with pytest.raises(flysim.SimulationError, match="meta tensors"):
            fn(meta, meta, meta, 64, None)
    x = torch.zeros(64)
    with pytest.raises(flysim.SimulationError, match="only inside flysim.simulate"):
        fn(x, x, x, 64, None)
    with flysim.simulate(arch="gfx950"), pytest.raises(flysim.SimulationError, match="compiled for gfx942"):
        fn(x, x, x, 64, None)


def test_direct_launcher_call_still_runs():
    add = K.build_add()
    a, b, c = torch.randn(70), torch.randn(70), torch.zeros(70)
    with flysim.simulate(arch="gfx942") as sim:
        add(a, b, c, 70)
    assert torch.equal(c, a + b) and len(sim.launches) == 1


def test_program_is_decoded_once_across_launches(monkeypatch):
    """Launches of one compiled kernel reuse its decoded program (decoding is per artifact, arch, device)."""
    from flysim import launch as L

    made = []
    real = L.Program.__init__

    def counting(self, *a, **k):
        made.append(a[2] if len(a) > 2 else k.get("arch"))
        real(self, *a, **k)

    monkeypatch.setattr(L.Program, "__init__", counting)
    add = K.build_add()
    a, b = torch.randn(300), torch.randn(300)
    with flysim.simulate("gfx942") as sim:
        for _ in range(3):
            c = torch.zeros(300)
            add(a, b, c, 300)
            torch.testing.assert_close(c, a + b)
    assert len(sim.launches) == 3 and made == ["gfx942"]
