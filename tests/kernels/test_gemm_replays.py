"""GEMM host entry through per-call replays (translator_kernels.replay) on flysim: a registered tile
reaches the next call (register_config clears the plans), and split-K GEMMs of different shapes
called back to back replay correctly, each launch with ticket counters of its own."""

import torch

import pytest

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import replay
from translator_kernels.gemm import gemm, splitk
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import _OVERRIDES, GemmConfig, choose_config, m_bucket, register_config

ARCH = "gfx942"
TOL = op_tol(torch.float32, "gemm", reduction_length=512, scale=100.0)


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    return a, w, shuffle_weight(w)


@pytest.mark.flysim_only("reads each launch's grid")
def test_register_config_reaches_a_planned_call():
    m, n, k = 5, 128, 64
    a, w, ws = _operands(m, n, k, 0)
    key_args = (m_bucket(m), n, k, torch.float32, ARCH)
    old = choose_config(*key_args)
    new = GemmConfig(16, 64 if old.bn != 64 else 128, 64)
    assert new != old
    replay.clear_replays()
    try:
        with executors.current().run(ARCH) as sim:
            for _ in range(3):  # first sight, plan built, plan replayed
                torch.testing.assert_close(gemm(a, ws, n, k), a @ w.t(), **TOL)
            assert replay.replay_count() >= 1
            before = {r.grid for r in sim.launches}
            register_config(*key_args, new)
            start = len(sim.launches)
            torch.testing.assert_close(gemm(a, ws, n, k), a @ w.t(), **TOL)
            after = [r.grid for r in sim.launches[start:]]
        assert before == {(1, n // old.bn, 1)} and after == [(1, n // new.bn, 1)], (before, after)
    finally:
        _OVERRIDES.pop((m_bucket(m), n, k, "f32", ARCH), None)
        replay.clear_replays()


@pytest.mark.flysim_only("inspects the CPU device's split-K counter pool")
def test_two_split_k_gemms_back_to_back_replay_their_plans():
    """Different shapes, same device, alternating, 3 rounds: the second round builds the plans, the
    third replays them. The pool first holds a small counter array (the first GEMM's regions only):
    the second GEMM drops it and takes a larger one (splitk.take_counters). Each launch, replayed
    or not, takes the pool's array, leaves it zeroed and gives it back, so both stay correct."""
    cases = [(2, 48, 256, GemmConfig(16, 64, 64, 2)), (20, 96, 512, GemmConfig(16, 64, 64, 4))]
    ops = [(_operands(m, n, k, i), n, k, cfg) for i, (m, n, k, cfg) in enumerate(cases)]
    key = (torch.device("cpu"), None)
    saved = splitk._POOL.pop(key, None)
    small = torch.zeros(4, dtype=torch.int32)
    splitk._POOL[key] = [small]
    replay.clear_replays()
    try:
        with executors.current().run(ARCH) as sim:
            for _ in range(3):
                for (a, w, ws), n, k, cfg in ops:
                    torch.testing.assert_close(gemm(a, ws, n, k, _config=cfg), a @ w.t(), **TOL)
                    assert len(splitk._POOL[key]) == 1 and not splitk._POOL[key][0].any()  # zeroed, given back
            assert replay.replay_count() == 2
        assert len(sim.launches) == 6 and splitk._POOL[key][0].numel() >= 4096 and not small.any()
    finally:
        splitk._POOL.pop(key, None)
        if saved is not None:
            splitk._POOL[key] = saved
        replay.clear_replays()
