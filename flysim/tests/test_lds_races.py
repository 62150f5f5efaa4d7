"""Race detection judges outcomes: stores of the value a byte already holds are benign.

Reproduces FlyDSL's moe_sorting_kernel.py oneshot path (the LDSRaceError the plugin reported at
its lines 408 / 411: lanes with no expert of every wave read and rewrite cumsum[0] = 0 in one
barrier interval) with a kernel of ours (repro_kernels.build_count_rewrite)."""

import pytest
import torch

import flysim
from flysim.errors import LDSRaceError
from repro_kernels import build_count_rewrite, build_past_lds, build_same_op_store


def test_dump_slot_rewritten_with_its_value_is_not_a_race():
    X = torch.arange(1, 9, dtype=torch.int32)
    Out = torch.full((9,), -1, dtype=torch.int32)
    with flysim.simulate("gfx950", check_races=True) as sim:
        build_count_rewrite()(X, Out)
    assert Out.tolist() == [0] + (2 * X).tolist()
    assert any("benign LDS race" in w for w in sim.launches[-1].warnings)


def test_dump_slot_rewritten_with_another_value_is_a_race():
    X = torch.arange(1, 9, dtype=torch.int32)
    Out = torch.zeros(9, dtype=torch.int32)
    with pytest.raises(LDSRaceError, match=r"write after read\): wave 0 touches LDS byte 0 .* wave 3"):
        with flysim.simulate("gfx950", check_races=True):
            build_count_rewrite(spare=5)(X, Out)


def test_one_store_instruction_of_several_waves():
    Out = torch.zeros(256, dtype=torch.int32)
    with flysim.simulate("gfx942", check_races=True):
        build_same_op_store(by_wave=False)(Out)
    assert bool((Out == 7).all())
    with pytest.raises(LDSRaceError, match=r"waves 0 and 3 store different values to LDS byte 0"):
        with flysim.simulate("gfx942", check_races=True):
            build_same_op_store(by_wave=True)(Out)


def test_lds_access_past_the_allocation_reads_zero_and_drops_stores():
    """FlyDSL's moe_sorting oneshot kernel reads cumdup[tid + 1] for all 256 lanes and keeps it
    only for tid < E (line 448): lanes past the LDS do nothing, as on the hardware, and are counted."""
    X = torch.arange(100, 228, dtype=torch.int32)
    Out = torch.zeros(128, dtype=torch.int32)
    with flysim.simulate("gfx950", check_races=True) as sim:
        build_past_lds(n=16)(X, Out)
    assert Out.tolist() == X[:16].tolist() + [-1] * 112
    rec = sim.launches[-1]
    assert rec.counters["oob_lds_accesses"] == 2 * 112  # the store and the load of lanes 16..127
    assert any("past the 64-byte LDS" in w for w in rec.warnings)
