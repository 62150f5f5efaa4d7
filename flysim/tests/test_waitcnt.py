"""s_waitcnt lgkmcnt before a bare s_barrier (docs/flysim.md, "s_waitcnt").

gpu.barrier carries a workgroup fence (the backend waits for every LDS access before it); a
bare s_barrier (rocdl.s.barrier, inline asm) does not, and gfx942 / gfx950 insert no wait
before it, so a kernel that uses one must retire its LDS stores (s_waitcnt lgkmcnt(0)) first,
as FlyDSL's dual-wave attention, SWA and conv3d kernels do. flysim executes a store at issue,
so a missing wait would give the right value: with check_waits ("lgkmcnt" or True) it is
reported as a race instead."""

import pytest
import torch

import flysim
from flysim.errors import LDSRaceError
from repro_kernels import build_lds_exchange


@pytest.mark.parametrize("sync", ["gpu", "wait", "asm_wait"])
def test_retired_stores_are_ordered_by_the_barrier(sync):
    X = torch.arange(128, dtype=torch.int32) * 3
    Out = torch.zeros(128, dtype=torch.int32)
    with flysim.simulate("gfx950", check_waits=True):
        build_lds_exchange(sync)(X, Out)
    assert torch.equal(Out, X.roll(64))


@pytest.mark.parametrize("sync", ["bare", "asm_bare"])
def test_missing_lgkmcnt_wait_before_bare_barrier_is_a_race(sync):
    X = torch.arange(128, dtype=torch.int32)
    Out = torch.zeros(128, dtype=torch.int32)
    with pytest.raises(LDSRaceError, match=r"missing s_waitcnt lgkmcnt\): wave 0 reads LDS byte 256 .* wave 1"):
        with flysim.simulate("gfx942", check_waits="lgkmcnt"):
            build_lds_exchange(sync)(X, Out)
