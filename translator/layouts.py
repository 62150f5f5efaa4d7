"""Memory layouts of tensors as dim orders: what the stride contract compares and restores.

A dense tensor's layout is its *dim order*: its dims sorted outermost (largest stride) first.
`dim_order` reads it from a (fake or real) tensor; `empty_in_order` (translator_kernels) makes
an output in it. Two layouts are the same when the strides agree on every dim of size > 1: a
dim of size 1 is never stepped over, so its stride changes no address and no view's validity
(torch's own `is_contiguous` ignores it the same way).

Symbolic strides (dynamic shapes) compare by their expression, and sort by the example's
size hint; export specializes sizes 0 and 1, so a hint never ties two dims that could differ.
"""

from __future__ import annotations

import torch

from .graph import size_hint as _hint


def dim_order(t) -> tuple[int, ...] | None:
    """The dims of dense tensor `t` from outermost to innermost (ties by dim index: what
    `empty_in_order` of that order reproduces), or None when `t` is not a tensor or is not dense
    (a broadcast stride 0, gaps between rows)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return None
    shape, stride = [_hint(d) for d in t.shape], [_hint(s) for s in t.stride()]
    order = tuple(sorted(range(t.dim()), key=lambda d: (-stride[d], d)))
    expect = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expect:
            return None
        expect *= shape[d]
    return order


def same_layout(a, b) -> bool:
    """`a` and `b` (tensors) have one shape and the same strides on every dim of size > 1."""
    if tuple(map(str, a.shape)) != tuple(map(str, b.shape)):
        return False
    return all(str(n) == "1" or str(x) == str(y) or _hint(x) == _hint(y)
               for n, x, y in zip(a.shape, a.stride(), b.stride()))


def strides_text(t) -> str:
    return "(" + ", ".join(str(s) for s in t.stride()) + ")"
