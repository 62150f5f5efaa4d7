"""Minimal reproduction of an upstream FlyDSL bug that flysim catches (docs/flysim.md, "Upstream findings").

Upstream's preshuffle GEMM (kernels/gemm/preshuffle_gemm.py at 11c4174d) reads the per-row A
scale of its 8-bit epilogue as vec4 buffer loads through a ``max_size=True`` descriptor
(num_records 0xFFFFFFFF). For a ragged M the last M tile reads scale floats past row M: memory
outside the tensor, which flysim reports as OutOfBoundsError (its
test_v2_preshuffle_c_store_oob[fp8|int8], M=33, tile_m=32). The kernel here has the same read
(repro_row_scale.py); bounding the descriptor to the tensor is the fix.
"""

import pytest
import torch

import flysim
from flysim.errors import OutOfBoundsError

from repro_row_scale import N, TILE_M, build_row_scale


def _run(bounded, m, guard_rows=0):
    torch.manual_seed(0)
    x = torch.randn(m, N)
    scale = torch.rand(m) + 0.5
    out_alloc = torch.full((m + guard_rows, N), -8192.0)
    with flysim.simulate("gfx950") as sim:
        build_row_scale(bounded)(x.view(-1), scale, out_alloc[:m].view(-1), m)
    return x, scale, out_alloc, sim.launches[-1]


def test_unbounded_scale_descriptor_reads_past_row_m():
    """M = 17, 16-row tiles: block 1 reads its 4 scale groups at bytes 64..127 of a 68-byte tensor.
    The first (rows 16..19) straddles the end; flysim stops at it, the upstream failure's shape."""
    with pytest.raises(OutOfBoundsError, match=r"load of 16 bytes .* \(lane 64\) is outside every argument tensor"):
        _run(bounded=False, m=17)


def test_unbounded_scale_descriptor_passes_when_m_is_a_tile_multiple():
    """The same kernel is silent for M a multiple of the tile: why only ragged-M tests expose it."""
    x, scale, out, rec = _run(bounded=False, m=2 * TILE_M)
    assert torch.equal(out, x * scale[:, None])
    assert rec.counters["oob_buffer_accesses"] == 0


def test_bounded_scale_descriptor_fixes_it():
    """num_records = 4 M (make_buffer_tensor(..., max_size=False)): dwords past row M read 0, per
    component, so row 16 still gets its scale from the straddling vec4; rows >= M are dropped by
    the bounded Out descriptor and the guard rows keep their sentinel."""
    m = 17
    x, scale, out, rec = _run(bounded=True, m=m, guard_rows=TILE_M - 1)
    assert torch.equal(out[:m], x * scale[:, None])
    assert bool((out[m:] == -8192.0).all())
    # block 1 (rows 16..31): 15 rows x 16 columns of X loads and of Out stores past M, and the
    # 64 lanes whose scale vec4 has a dword past M (16 straddling row 16, 48 wholly past).
    assert rec.counters["oob_buffer_accesses"] == 15 * N * 2 + 64
