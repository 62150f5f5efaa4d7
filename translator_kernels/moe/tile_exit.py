"""Early exit of the grouped GEMM's tiles past the real rows (gemm/kernel.py, `grouped=True`).

The permuted buffer is sized for the worst case (grouped.capacity), so the grid covers more row tiles
than the routing fills. The align kernel (permute.py) writes the tile map with -1 for every tile at or
past the real padded row total, on the device: no host read, so the launch stays capturable. A
workgroup reads its tile's expert (one int32 load, made wave-uniform) and runs the rest of its body
only where that expert is >= 0: a tail tile issues no A or W load, no MFMA and no store.

How: `begin(expert)` opens an `scf.if` right after the load, with an empty body; the kernel traces the
rest of its body as usual, after it in the same block; `end(gate)`, called as the kernel's last
statement, moves every operation traced after the `if` into its body. So the kernel's code stays one
straight-line body and the branch is two calls. The branch is uniform (a readfirstlane value): barriers
inside it are reached by all the workgroup's waves or by none.

Split-K (gemm/splitk.py): the skip depends only on the M tile, so every split of a tail tile skips,
none draws a ticket, and the tile's counters stay zero for the next launch (the launch still leaves its
counter array all zero). The output rows of a tail tile are not written (nor are the gathered rows, permute.py):
nothing uses them (the un-permute reads only the slots of real pairs; the next GEMM skips the same tiles; the
fp8 path's per-token quantize runs over them, row by row, and its rows there go unread too).
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import scf
from flydsl.expr import rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm.common import _raw

PAST_TOTAL = -1  # the tile map's entry for a tile at or past the real padded row total


def uniform(v):
    """An int32 that every lane holds the same value of, as a scalar (readfirstlane)."""
    return fx.Int32(rocdl.readfirstlane(T.i32, _raw(v)))


def begin(expert):
    """Open the tile's body: an `scf.if expert >= 0` whose body `end` fills. Returns the gate for `end`."""
    if_op = scf.IfOp(_raw(expert >= 0), has_else=False)
    with ir.InsertionPoint(if_op.then_block):
        term = scf.YieldOp([])
    return if_op, term


def end(gate) -> None:
    """Move every operation traced after `begin`'s `if`, in its block, into the `if`'s body."""
    if_op, term = gate
    ops = list(if_op.operation.block.operations)
    start = next(i for i, op in enumerate(ops) if op.operation == if_op.operation) + 1
    for op in ops[start:]:
        op.operation.move_before(term.operation)
