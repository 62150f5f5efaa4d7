"""Calibration and verification of graphs that write state (issue 30 item 3): the more exact run casts
the state with the run (registered buffers, and state the forward creates with an explicit dtype, as
HF's static cache does), leaves the model's own state as it was, and where it cannot cast the state it
says why in the report; no traceback is printed for a handled case."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from translator import api, translate
from translator.verify import calibrate


class StaticKV(nn.Module):
    """A static KV cache: a registered buffer filled with index_copy_ at the given positions."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 16, 32))
        self.proj = nn.Linear(32, 32)

    def forward(self, x, pos):
        self.k_cache.index_copy_(1, pos, self.proj(x))
        return torch.softmax(x @ self.k_cache.transpose(1, 2), -1) @ self.k_cache


class LazyKV(nn.Module):
    """The cache allocated in forward with an explicit dtype, as HF's StaticCache does on its first call."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x, pos):
        cache = torch.zeros(1, 16, 32, dtype=torch.float32)
        cache.index_copy_(1, pos, self.proj(x))
        return torch.softmax(x @ cache.transpose(1, 2), -1) @ cache


class _Holder:  # state outside any module: the truth run cannot reach it
    def __init__(self):
        self.t = torch.zeros(1, 16, 32)


class HiddenKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.store = _Holder()

    def forward(self, x, pos):
        self.store.t.index_copy_(1, pos, self.proj(x))
        return self.store.t.sum(1) + x.sum(1)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(1, 4, 32), torch.arange(4)


@pytest.mark.parametrize("cls", [StaticKV, LazyKV])
def test_the_fp64_calibration_runs_with_the_state_cast(cls, capfd):
    m = cls()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    tm = translate(m, _inputs(), backend="reference")
    v = tm.report.verification
    assert v.passed, v.message
    assert "not run" in v.calibration, v.calibration  # within the table bound: verify.Calibration skips it
    _errors, note = calibrate(m, _inputs(), api._eager(m, _inputs()))  # the run verification makes when it must
    assert note.startswith("eager fp32 vs eager fp64"), note  # ran, not skipped
    for k, t in m.state_dict().items():
        assert torch.equal(t, before[k]) and t.dtype == before[k].dtype, k  # the model's state as it was
    err = capfd.readouterr().err
    assert "Traceback" not in err and "index_copy_" not in err, err


def test_state_the_run_cannot_cast_is_stated_without_a_traceback(capfd):
    m = HiddenKV()
    tm = translate(m, _inputs(), backend="reference")
    v = tm.report.verification
    assert v.passed, v.message  # the table bound applies
    _errors, note = calibrate(m, _inputs(), api._eager(m, _inputs()))
    assert "eager fp64 run skipped" in note and "index_copy_" in note, note
    assert m.store.t.dtype == torch.float32
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


@pytest.mark.slow  # ~20 s; LazyKV above covers the behaviour (a cache allocated in forward) in the default suite
def test_hf_static_cache_generation_through_torch_compile(capfd):
    from hf_tiny import tiny_llama
    from translator.frontends import compile_backend

    m = tiny_llama()
    ids = torch.randint(0, 100, (1, 6))
    want = m.generate(ids, max_new_tokens=3, cache_implementation="static", do_sample=False)
    compile_backend.reset()
    m.forward = torch.compile(m.forward, backend="flydsl", options={"backend": "reference"})
    try:
        got = m.generate(ids, max_new_tokens=3, cache_implementation="static", do_sample=False)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, want)
    graphs = [g for g in compile_backend.reports() if g.report is not None]
    assert graphs
    for g in graphs:  # the prefill graph allocates the cache in its forward: calibrated all the same
        assert "skipped" not in g.report.verification.calibration, g.report.verification.calibration
    err = capfd.readouterr().err
    assert "Traceback" not in err and "same dtype" not in err, err
