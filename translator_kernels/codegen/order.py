"""Eager's output layout of a pointwise op, for the generated elementwise kernels (docs/strides.md).

A light module (torch only): the custom op's fake implementation and reference in
translator/lowerings/elementwise.py use it without importing FlyDSL, and the kernel's host entry
uses the same function, so fake, reference and kernel agree on every output's strides.
"""

from __future__ import annotations

from torch._prims_common import compute_elementwise_output_logical_to_physical_perm as _perm


def output_order(inputs, shape) -> tuple[int, ...] | None:
    """The dims of a pointwise op's output over `inputs` (broadcast to `shape`) from outermost to
    innermost, as eager lays it out (TensorIterator's rule: contiguous when every input is, else the
    order the inputs' strides give, the first input deciding ties); None for contiguous. Works on
    fake tensors too (the custom op's fake implementation calls it)."""
    if len(shape) < 2 or all(t.is_contiguous() for t in inputs):
        return None
    order, _ = _perm(*[t.expand(shape) for t in inputs])
    return None if list(order) == list(range(len(shape))) else tuple(order)


def in_order(inputs, order):
    """`inputs` viewed so that the output of the permuted problem is contiguous (no copy)."""
    nd = len(order)
    return [t[(None,) * (nd - t.dim())].permute(order) for t in inputs]


def restore_order(outs, order):
    """The permuted problem's contiguous outputs viewed back in the logical dim order."""
    inv = [order.index(d) for d in range(len(order))]
    return [o.permute(inv) for o in outs]
