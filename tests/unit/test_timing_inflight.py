"""The bytes in flight of a kernel without a hot loop (timing.features, `_Outstanding`): the vmcnt counter simulated
through the straight-line code, the largest load batch outstanding at a wait that must retire a load. Before, the
loads before the first vmcnt wait: a bias / split-K prologue's 1 KiB, not the K steps' batch behind it."""

from translator_kernels import timing

# a loop-free kernel: a 1 KiB bias load waited on alone, then a batch of four 1 KiB K-tile loads retired two at a
# time by staggered waits, a store retired by a wait that needs no load, then a last 512-byte load
STRAIGHT = """\t.text
k:
\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen
\ts_waitcnt vmcnt(0)
\tbuffer_load_dwordx4 v[8:11], v4, s[0:3], 0 offen lds
\tbuffer_load_dwordx4 v[8:11], v4, s[0:3], 0 offen offset:16 lds
\tbuffer_load_dwordx4 v[8:11], v4, s[0:3], 0 offen offset:32 lds
\tbuffer_load_dwordx4 v[8:11], v4, s[0:3], 0 offen offset:48 lds
\ts_waitcnt vmcnt(2)
\tv_mfma_f32_16x16x32_bf16 v[12:15], v[0:3], v[0:3], 0
\ts_waitcnt vmcnt(0)
\tbuffer_store_dwordx4 v[12:15], v4, s[4:7], 0 offen
\ts_waitcnt vmcnt(0)
\tbuffer_load_dwordx2 v[0:1], v4, s[0:3], 0 offen
\ts_waitcnt vmcnt(0)
\ts_endpgm
amdhsa.kernels:
  - .agpr_count:    0
    .max_flat_workgroup_size: 64
    .name:           k
    .vgpr_count:     16
"""


def test_a_loop_free_kernel_has_its_largest_waited_batch_in_flight():
    f = timing.features(STRAIGHT, "gfx950")
    assert not f.has_loop
    # the old rule: 1 KiB (the bias load, before the first vmcnt wait); the new: the four K-tile loads (4 KiB), which
    # the wave has outstanding when vmcnt(2) makes it wait for the first two
    assert f.inflight_bytes == 4 * 1024
    assert f.straight_bytes == 5 * 1024 + 512 and f.straight_trips == 3  # bias, batch, last load


def test_waits_that_retire_no_load_do_not_count():
    o = timing._Outstanding()
    for mn, rest, c in (("buffer_store_dwordx4", "", "vmem_store"), ("buffer_load_dwordx4", "", "vmem_load"),
                        ("s_waitcnt", " vmcnt(1)", "wait")):
        o.step(mn, rest, c)
    assert o.peak == 0  # vmcnt(1) retired the store only: the load is still in flight, nothing waited on it
    o.step("s_waitcnt", " vmcnt(0)", "wait")
    assert o.peak == 1024


def test_a_loop_kernel_keeps_its_loop_bytes():
    # the rule is the loop-free kernels': a hot loop's bytes per iteration stay what t_mem counts for a loop kernel
    text = STRAIGHT.replace("\ts_endpgm", ".LBB0_1:\n\tglobal_load_dwordx4 v[0:3], v[4:5], off\n\ts_waitcnt vmcnt(0)\n"
                            "\tv_mfma_f32_16x16x32_bf16 v[12:15], v[0:3], v[0:3], 0\n\ts_cbranch_scc1 .LBB0_1\n\ts_endpgm")
    f = timing.features(text, "gfx950")
    assert f.has_loop and f.inflight_bytes == 1024


def test_a_ring_of_k_tiles_keeps_its_steady_batch_in_flight():
    # an LDS ring of 4 stages: the prologue issues 3 K tiles, each iteration issues one more and waits for the oldest
    # (vmcnt(3)), so 4 tiles are outstanding at every wait while an iteration loads one (the MODEL's bytes in flight:
    # the steady-state batch, `_steady_batch`, not the 1 KiB one iteration issues)
    load = "\tbuffer_load_dwordx4 v[8:11], v4, s[0:3], 0 offen lds\n"
    text = STRAIGHT.replace("\ts_endpgm", load * 3 + ".LBB0_1:\n" + load + "\ts_waitcnt vmcnt(3)\n"
                            "\tv_mfma_f32_16x16x32_bf16 v[12:15], v[0:3], v[0:3], 0\n\ts_cbranch_scc1 .LBB0_1\n\ts_endpgm")
    f = timing.features(text, "gfx950")
    assert f.has_loop and f.inflight_bytes == 4 * 1024
