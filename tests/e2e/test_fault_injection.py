"""Fault injection across a translated model's forward (issue 24, Evidence): a fault stays in the call.

flysim raises at a random point of a random launch of a forward (before or after one of the
interpreter's block executions: the kernel body, an scf.if branch, a loop body), as a simulation
error, a device-style RuntimeError or a Ctrl-C (KeyboardInterrupt). After each fault, the next
forward must give the bits of a forward that never saw a fault, and eager's values. The model is
small and made of what keeps process-wide kernel state: two split-K GEMMs (per-launch ticket
counters), a plain GEMM, a fused elementwise epilogue, LayerNorm and softmax, each through its
per-call replay (built on the second call, replayed after). The default suite injects 6 faults (about 20 s);
`-m slow` injects 100.
"""

import random

import pytest
import torch

import flysim
import flysim.program
import translator
from translator.tolerances import model_tol
from translator_kernels.gemm import choose_config, m_bucket

FAULTS = (flysim.SimulationError, RuntimeError, KeyboardInterrupt)


class SplitKBlock(torch.nn.Module):
    """x[4, 512] -> softmax(head(down(LN(gelu(up(x)))) + x)): up and head are split-K shapes."""

    def __init__(self):
        super().__init__()
        self.up, self.norm = torch.nn.Linear(512, 64), torch.nn.LayerNorm(64)
        self.down, self.head = torch.nn.Linear(64, 512), torch.nn.Linear(512, 32)

    def forward(self, x):
        h = self.down(self.norm(torch.nn.functional.gelu(self.up(x)))) + x
        return torch.softmax(self.head(h), dim=-1)


class _Injector:
    """Patches flysim's block executor; `arm(n, after, exc)` raises exc at the n-th block execution
    from now (after running that block when `after`)."""

    def __init__(self, monkeypatch):
        self.count, self.at, self.after, self.exc, self.fired = 0, None, False, None, 0
        real = flysim.program.Exec.run
        inj = self

        def run(ex, fns):
            inj.count += 1
            if inj.count != inj.at:
                return real(ex, fns)
            inj.at = None
            inj.fired += 1
            if inj.after:
                real(ex, fns)
            raise inj.exc(f"injected fault in kernel {ex.kernel}")

        monkeypatch.setattr(flysim.program.Exec, "run", run)

    def arm(self, n, after, exc):
        self.at, self.after, self.exc = self.count + n, after, exc


@pytest.fixture(scope="module")
def translated():
    torch.manual_seed(0)
    model = SplitKBlock().eval()
    x = torch.randn(4, 512)
    tm = translator.translate(model, (x,), backend="flysim", dynamic_shapes=None)
    assert tm.report.summary()["flydsl_ops"]["flydsl.gemm"] == 3
    assert [choose_config(m_bucket(4), n, k, torch.float32, "gfx942").split for n, k in ((64, 512), (32, 512))] \
        == [2, 2]  # the two split-K GEMMs of the model
    with torch.no_grad():
        eager = model(x)
    return tm, x, eager


def _inject(translated, monkeypatch, faults, seed):
    tm, x, eager = translated
    clean = tm(x)
    torch.testing.assert_close(clean, eager, **model_tol())
    inj = _Injector(monkeypatch)
    tm(x)
    per_forward = inj.count
    assert per_forward >= 5  # at least one block per launch
    rng = random.Random(seed)
    for i in range(faults):
        exc = FAULTS[i % len(FAULTS)]
        inj.arm(rng.randrange(1, per_forward + 1), rng.random() < 0.5, exc)
        with pytest.raises(exc, match="injected fault"):
            tm(x)
        assert inj.fired == i + 1
        got = tm(x)  # the next forward: as if no fault had happened
        assert torch.equal(got, clean), f"fault {i} ({exc.__name__}) changed the next forward"
    torch.testing.assert_close(tm(x), eager, **model_tol())


@torch.no_grad()  # inference: the fast forward (translator.runtime.fastpath)
def test_faults_in_random_launches_stay_in_their_forward(translated, monkeypatch):
    _inject(translated, monkeypatch, 6, seed=24)


@pytest.mark.slow
@torch.no_grad()
def test_a_hundred_faults_stay_in_their_forward(translated, monkeypatch):
    _inject(translated, monkeypatch, 100, seed=2400)
