"""translate() and translated modules from several threads: every call succeeds with the
same results as alone (translate calls are serialized; kernel execution takes one lock)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from translator.tolerances import model_tol

from translator import translate


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return torch.softmax(self.lin(x), -1) * 2.0


def _in_threads(fn, n):
    results, old = {}, sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so interleavings actually happen

    def run(i):
        try:
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 — reported by the assertion below
            results[i] = e

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "a thread hung"
    finally:
        sys.setswitchinterval(old)
    errors = {i: f"{type(r).__name__}: {r}" for i, r in results.items() if isinstance(r, Exception)}
    assert not errors, errors
    return results


def test_translate_from_three_threads():
    torch.manual_seed(0)
    models = [Block() for _ in range(3)]
    x = torch.randn(4, 32)
    tms = _in_threads(lambda i: translate(models[i], (x,), backend="reference"), 3)
    for i, tm in tms.items():
        assert tm.report.verification.passed, tm.report.verification.message
        assert tm.report.counters.get("linear") == 1
        torch.testing.assert_close(tm(x), models[i](x), **model_tol(check="few_ops"))


@pytest.mark.parametrize("backend", ["flysim"])
def test_translated_module_called_from_threads(backend):
    m = Block()
    tm = translate(m, (torch.randn(4, 32),), backend=backend)
    xs = [torch.randn(4, 32) for _ in range(4)]

    def call(i):
        out = [tm(xs[i]) for _ in range(2)]
        return out, list(tm.last_launches)

    for i, (outs, _launches) in _in_threads(call, 4).items():
        for o in outs:
            torch.testing.assert_close(o, m(xs[i]), **model_tol(check="few_ops"))
    tm(xs[0])
    assert len(tm.last_launches) >= 2  # gemm + the fused softmax-scale region ran as FlyDSL kernels
