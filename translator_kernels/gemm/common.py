"""Constants and small trace-time helpers shared by the GEMM kernel (kernel.py) and its device
helpers (splitk.py: split-K and wave-part sums; cstore.py: 128-bit C stores), so that those
modules import this one instead of each other."""

from flydsl._mlir import ir
from flydsl.expr.typing import T, as_ir_value

WAVES = 4
THREADS = 64 * WAVES
OOB = 0x7FFFFFF0  # byte offset past every descriptor we build (tensors are < 2 GiB)


def _raw(v):
    return v if isinstance(v, ir.Value) else as_ir_value(v)


def _v4i32():
    return T.vec(4, T.i32)


def _v4f32():
    return T.vec(4, T.f32)
