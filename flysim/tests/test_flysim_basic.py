"""flysim on small kernels of our own: numerics, detectors, counters, arch re-entry."""

import os

import pytest
import torch

import flydsl.expr as fx
import flysim

import flysim_kernels as K


def test_vector_add_masked_tail_counts_bytes():
    n = 1000  # not a multiple of the 64-thread block
    a, b, c = torch.randn(n), torch.randn(n), torch.zeros(n)
    with flysim.simulate(arch="gfx942") as sim:
        K.build_add()(a, b, c, n)
    assert torch.equal(c, a + b)
    rec = sim.launches[-1]
    assert rec.grid == (16, 1, 1) and rec.block == (64, 1, 1)
    assert rec.counters["global_bytes_read"] == 2 * 4 * n
    assert rec.counters["global_bytes_written"] == 4 * n
    assert rec.counters["ops_by_kind"]["scf.if"] == 1
    assert flysim.last_launch() is rec


def test_reentrant_across_archs_and_env_restored():
    before = {k: os.environ.get(k) for k in ("COMPILE_ONLY", "ARCH", "FLYDSL_GPU_ARCH")}
    add = K.build_add()
    for arch in ("gfx942", "gfx950", "gfx942"):
        a, b, c = torch.randn(70), torch.randn(70), torch.zeros(70)
        with flysim.simulate(arch=arch) as sim:
            assert os.environ["FLYDSL_GPU_ARCH"] == arch
            add(a, b, c, 70)
        assert sim.launches[-1].arch == arch
        assert torch.equal(c, a + b)
    assert {k: os.environ.get(k) for k in before} == before


def test_block_reduction_with_shuffles_and_lds():
    rows = 5
    x = torch.randn(rows * 256)
    out = torch.zeros(rows)
    with flysim.simulate() as sim:
        K.build_row_sum()(x, out, rows)
    torch.testing.assert_close(out, x.view(rows, 256).sum(1), rtol=1e-5, atol=1e-5)
    c = sim.launches[-1].counters
    assert c["ops_by_kind"]["gpu.shuffle"] == 6
    assert c["lds_bytes_written"] == rows * 4 * 4  # one f32 per wave
    assert c["warnings"] == []


def test_missing_barrier_is_reported_with_both_lines():
    x, out = torch.randn(256), torch.zeros(1)
    with pytest.raises(flysim.LDSRaceError) as e:
        with flysim.simulate():
            K.build_row_sum(barrier=False)(x, out, 1)
    msg = str(e.value)
    assert msg.count("flysim_kernels.py:") >= 2 and "read after write" in msg
    with flysim.simulate(check_races=False):  # the detector can be switched off
        K.build_row_sum(barrier=False)(x, out, 1)


def test_out_of_bounds_is_reported_with_source_line():
    a, c = torch.randn(100), torch.zeros(100)
    with pytest.raises(flysim.OutOfBoundsError, match=r"flysim_kernels.py:\d+"):
        with flysim.simulate():
            K.build_add(guarded=False)(a, a, c, 100)


@pytest.mark.parametrize("gran", [16, 8])
def test_gfx950_lds_transpose_read(gran):
    """ds_read_tr16_b64 / tr8_b64: lane t of each 16-lane group gets column t of the group's tile."""
    X = torch.randint(-30000, 30000, (256,), dtype=torch.int16, generator=torch.Generator().manual_seed(gran))
    out = torch.zeros_like(X)
    with flysim.simulate(arch="gfx950") as sim:
        K.build_transpose_read(gran)(X, out)
    src = X.view(torch.uint8).view(64, 8) if gran == 8 else X.view(64, 4)
    per = 64 // gran  # elements per lane: element v of lane t is element t + 16v of the group, lane-major
    ref = torch.empty_like(src)
    for lane in range(64):
        g, t = divmod(lane, 16)
        for v in range(per):
            ref[lane, v] = src[16 * g + (t + 16 * v) // per, (t + 16 * v) % per]
    assert torch.equal(out.view(torch.uint8).view(64, 8) if gran == 8 else out.view(64, 4), ref)
    assert sim.launches[-1].counters["lds_bytes_read"] == 64 * 8


def test_inline_asm_compare_and_select():
    """v_cmp_lt_i32 into an SGPR pair + v_cndmask: per-lane select, and the pair read back is the wave's ballot."""
    g = torch.Generator().manual_seed(3)
    X = torch.randint(-10, 10, (128,), dtype=torch.int32, generator=g)
    Y = torch.randint(100, 200, (128,), dtype=torch.int32, generator=g)
    out, mask = torch.zeros_like(X), torch.zeros(128, dtype=torch.int64)
    with flysim.simulate() as sim:
        K.build_asm_select(3)(X, Y, out, mask)
    assert torch.equal(out, torch.where(X < 3, -7, Y))
    for w in range(2):
        bits = sum(1 << j for j in range(64) if X[64 * w + j] < 3)
        ballot = bits - (1 << 64) if bits >= 1 << 63 else bits
        assert (mask[64 * w:64 * w + 64] == ballot).all()
    assert sim.launches[-1].counters["ops_by_kind"]["llvm.inline_asm"] == 1


def test_f32_to_f16_round_toward_zero():
    """v_cvt_pkrtz_f16_f32's conversion: truncation toward zero, both signs, overflow to 65504."""
    from flysim.ops_amd import f32_to_f16_rtz

    ulp = 2.0 ** -10  # fp16 ulp in [1, 2)
    x = torch.tensor([1 + 0.9 * ulp, -(1 + 0.9 * ulp), 1 + 0.4 * ulp, 1.0, 70000.0, -70000.0, 0.0, float("nan"), 1e-8])
    want = torch.tensor([1.0, -1.0, 1.0, 1.0, 65504.0, -65504.0, 0.0, float("nan"), 0.0], dtype=torch.float16)
    got = f32_to_f16_rtz(x)
    assert torch.equal(got[:7], want[:7]) and torch.isnan(got[7]) and got[8] == 0
    r = torch.randn(10000) * 100
    t = f32_to_f16_rtz(r).float()
    assert bool((t.abs() <= r.abs()).all()) and bool(((r - t).abs() <= r.abs() * 2.0 ** -10 + 2.0 ** -24).all())


def test_region_waves_count_each_side_and_iteration_per_wave():
    """count_regions=True: per scf.for the waves that run each iteration, per scf.if the waves
    that run each side; off by default (no counter, nothing to pay)."""
    out = torch.zeros(3 * 128)
    with flysim.simulate(count_regions=True) as sim:
        K.build_counted_loop()(out, 3)
    want = torch.tensor([(b + 1) * (11.0 if t < 64 else 1.0) for b in range(3) for t in range(128)])
    assert torch.equal(out, want)
    regions = sim.launches[-1].counters["region_waves"]
    (loop,) = [v for k, v in regions.items() if k.endswith("scf.for")]
    (branch,) = [v for k, v in regions.items() if k.endswith("scf.if")]
    assert loop == {"iterations": (1 + 2 + 3) * 2}  # 2 waves per workgroup
    assert branch == {"then": 1 + 2 + 3, "else": 1 + 2 + 3}  # wave 0 / wave 1 of each iteration
    assert all("flysim_kernels.py:" in k for k in regions)
    with flysim.simulate() as sim:
        K.build_counted_loop()(out, 3)
    assert "region_waves" not in sim.launches[-1].counters
