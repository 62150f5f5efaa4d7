"""A fault inside a split-K GEMM launch stays in that call (issue 24, item 1).

The split-K kernel (translator_kernels/gemm/splitk.py) counts tickets in int32 counters that a
completed launch leaves at zero. A launch that stops after drawing tickets and before the last
arriver's reset leaves them non-zero; if a later launch used the same counters, no workgroup of
it would draw the last ticket and its output would never be written (garbage, up to 1.7e38 in
the audit). Here flysim raises right after the ticket atomics ran (all tickets drawn, no reset),
first on a direct call and then on a per-call replay's replay, and every later split-K GEMM, of
another shape (another module's) and of the same one, must equal torch.
"""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import flysim
import flysim.ops_atomic
from translator.tolerances import op_tol
from translator_kernels import replay
from translator_kernels.gemm import gemm, splitk
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import GemmConfig

ARCH = "gfx942"
TOL = op_tol(torch.float32, "gemm", reduction_length=512, scale=10.0)
CPU = torch.device("cpu")
pytestmark = pytest.mark.flysim_only("injects its faults into flysim's atomics")


def _case(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(m, k, generator=g) / k**0.5, torch.randn(n, k, generator=g)
    return a, w, shuffle_weight(w)


A_CFG, B_CFG = GemmConfig(16, 64, 64, split=4), GemmConfig(16, 16, 128, split=2, kw=4)


def _faulty_atomics(monkeypatch, exc):
    """flysim's atomics run, then raise: the tickets are drawn, no workgroup reaches its reset."""
    real = flysim.ops_atomic.serialize
    hits = []

    def serialize(*args, **kwargs):
        out = real(*args, **kwargs)
        hits.append(1)
        raise exc("fault injected after the split-K tickets were drawn")

    monkeypatch.setattr(flysim.ops_atomic, "serialize", serialize)
    return hits


@pytest.mark.parametrize("exc", [flysim.SimulationError, KeyboardInterrupt])
@pytest.mark.parametrize("when", ["first call", "plan replay"])
def test_a_fault_between_ticket_and_reset_stays_in_its_call(monkeypatch, exc, when):
    a, w, ws = _case(4, 64, 512, 0)
    b, wb, wsb = _case(6, 80, 256, 1)  # another module's GEMM: other shape, other config
    replay.clear_replays()
    try:
        with executors.current().run(ARCH):
            for _ in range(3 if when == "plan replay" else 0):  # first sight, plan built, replayed
                torch.testing.assert_close(gemm(a, ws, 64, 512, _config=A_CFG), a @ w.T, **TOL)
            with monkeypatch.context() as mp:
                hits = _faulty_atomics(mp, exc)
                with pytest.raises(exc, match="fault injected"):
                    gemm(a, ws, 64, 512, _config=A_CFG)
                assert hits
            for _ in range(3):  # the other GEMM, then the faulted one again: direct, built, replayed
                torch.testing.assert_close(gemm(b, wsb, 80, 256, _config=B_CFG), b @ wb.T, **TOL)
                torch.testing.assert_close(gemm(a, ws, 64, 512, _config=A_CFG), a @ w.T, **TOL)
        assert all(not c.any() for c in splitk._POOL.get((CPU, None), []))  # only clean arrays were given back
    finally:
        replay.clear_replays()


def test_counters_belong_to_one_launch_at_a_time():
    """Two launches in flight (two threads, or a launch that raised and never gave its array back)
    never hold the same counters; an array given back is handed out again; a CUDA (HIP) device's
    pool is its stream's, so launches on two streams never share an array."""
    first = splitk.take_counters(CPU, 64)
    second = splitk.take_counters(CPU, 64)
    assert first is not second and first.numel() >= 64 and not first.any() and not second.any()
    splitk.give_back(second)
    assert splitk.take_counters(CPU, 64) is second
    assert splitk.take_counters(CPU, 10 * splitk.MIN_COUNTERS).numel() >= 10 * splitk.MIN_COUNTERS


def test_pool_is_keyed_by_stream(monkeypatch):
    streams = iter([11, 22])

    class Stream:
        def __init__(self):
            self.cuda_stream = next(streams)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    gpu = torch.device("cuda", 0)
    assert splitk._pool_key(gpu) != splitk._pool_key(gpu)  # stream 11, then stream 22
    assert splitk._pool_key(CPU) == (CPU, None)
