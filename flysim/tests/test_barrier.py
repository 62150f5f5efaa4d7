"""Barriers as CDNA has them: arrival counting per workgroup, whatever the program point (waves.py)."""

import pytest
import torch

import flysim
from flysim.errors import LDSRaceError
from flysim_kernels import build_phase_shift, WAVE

ITERS = 4


def _expected(X):
    x = X.view(ITERS, 2, 2 * WAVE)
    g0 = x[: ITERS - 1, 1].sum(0)  # group 0 reads group 1's previous iteration
    g1 = x[:, 0].sum(0)  # group 1 reads group 0's same iteration
    return torch.cat([g0, g1])


def test_phase_shifted_wave_groups_match_and_are_race_free():
    X = torch.randn(ITERS * 4 * WAVE)
    Out = torch.zeros(4 * WAVE)
    with flysim.simulate("gfx950", check_races=True) as sim:
        build_phase_shift(ITERS)(X, Out)
    rec = sim.launches[-1]
    assert rec.counters["wave_split"]  # the first barrier split the workgroup: per-wave schedule
    torch.testing.assert_close(Out, 1 + _expected(X), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", ["race", "missing_barrier"])
def test_seeded_fault_in_phase_shifted_kernel_is_caught(seed):
    X = torch.randn(ITERS * 4 * WAVE)
    Out = torch.zeros(4 * WAVE)
    with pytest.raises(LDSRaceError, match="LDS race"):
        with flysim.simulate("gfx950", check_races=True):
            build_phase_shift(ITERS, seed=seed)(X, Out)


def test_split_run_restores_memory_it_wrote_in_lockstep():
    """The lockstep attempt (which wrote Out += 1) is undone before the split run; two launches add twice."""
    X = torch.randn(ITERS * 4 * WAVE)
    Out = torch.zeros(4 * WAVE)
    with flysim.simulate("gfx942", check_races=False):
        build_phase_shift(ITERS)(X, Out)
        build_phase_shift(ITERS)(X, Out)
    torch.testing.assert_close(Out, 2 * (1 + _expected(X)), rtol=1e-6, atol=1e-6)


def test_barrier_reached_by_part_of_a_wave_is_an_error():
    X = torch.randn(ITERS * 4 * WAVE)
    Out = torch.zeros(4 * WAVE)
    with pytest.raises(LDSRaceError, match="within a wave: only 32 of the 64 lanes of wave 0 of workgroup 0"):
        with flysim.simulate("gfx950"):
            build_phase_shift(ITERS, seed="lane_split")(X, Out)
