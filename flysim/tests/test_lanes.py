"""DPP and permlane16 swap (ops_lanes.py), checked against the identities FlyDSL's kernels rely on."""

import torch

import flysim
from flysim_kernels import WAVE, build_lane_moves


def test_dpp_controls_and_permlane16_swap():
    X = torch.arange(100, 100 + WAVE, dtype=torch.int32)
    Y = torch.arange(200, 200 + WAVE, dtype=torch.int32)
    Out = torch.zeros(11 * WAVE, dtype=torch.int32)
    with flysim.simulate("gfx950") as sim:
        build_lane_moves()(X, Y, Out)
    assert sim.launches[-1].counters["ops_by_kind"]["rocdl.update.dpp"] == 6
    o = Out.view(11, WAVE)
    lane = torch.arange(WAVE)
    assert torch.equal(o[0], X[lane ^ 1])  # quad_perm 177: xor 1 (FlyDSL's dpp_xor_f32)
    assert torch.equal(o[1], X[lane ^ 2])  # quad_perm 78: xor 2
    assert torch.equal(o[3], X[lane ^ 8])  # row_shr:8 (banks 2-3) then row_shl:8 (banks 0-1): xor 8
    r = lane % 16
    assert torch.equal(o[4], torch.where(r == 0, 0, X[(lane - 1).clamp(min=0)]))  # row_shr:1, bound_ctrl
    row = lane // 16
    bcast = torch.where((row % 2) == 1, X[(row * 16 - 1).clamp(min=0)], -1)  # row_bcast:15, row_mask 0xA
    assert torch.equal(o[5], bcast)
    # permlane16 swap: X's odd rows trade places with Y's even rows
    xs, ys = X.view(4, 16), Y.view(4, 16)
    assert torch.equal(o[6], torch.cat([xs[0], ys[0], xs[2], ys[2]]))
    assert torch.equal(o[7], torch.cat([xs[1], ys[1], xs[3], ys[3]]))
    assert torch.equal(o[8], X[lane ^ 1])  # the intrinsic form FlyDSL's dpp_utils emits
    assert torch.equal(o[9], torch.cat([X[:32], Y[:32]]))  # permlane32 swap: X's upper half <-> Y's lower half
    assert torch.equal(o[10], torch.cat([X[32:], Y[32:]]))
