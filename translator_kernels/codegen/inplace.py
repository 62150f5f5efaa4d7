"""In-place elementwise writes: the generated elementwise kernel with its output stored into its first input.

`elementwise_into(dst, inputs, program)` runs a per-element program (translator_kernels.program) on
``[dst, *inputs]`` and stores its one output into `dst` itself: ``buf.add_(x)``, ``n.add_(1)``,
``acc.mul_(0.9)``, ``buf.fill_(v)``, ``buf.copy_(x)`` with a cast. It is the kernel of
translator.codegen.elementwise (same generated source, same launcher cache), called with `dst`'s
flat storage as both input 0 and output 0, so no output is allocated and nothing is copied back.

Why reading and writing one buffer is safe: `dst` is contiguous and has the broadcast shape, so each
thread loads its own vector of `dst` at the flat index it then stores to; no thread reads an element
another thread writes. The other inputs are read with their own strides and broadcasts (a scalar
operand is splat). An input that partly overlaps `dst` (``buf[1:].add_(buf[:-1])``) is refused by
eager torch itself, so such a graph never reaches here.

Refused with KernelInputError (the lowering's support check keeps such graphs in PyTorch first):
`dst` not contiguous (a strided view of state: its element order is not the flat order the kernel
writes), a broadcast shape other than `dst`'s, a program with other than one output, or an output
dtype other than `dst`'s.
"""

from __future__ import annotations

import math

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.codegen.elementwise import MAX_LAYOUTS, _Layout, _launch_for, _layout_key, flat_inputs, prepare
from translator_kernels.codegen.host import note_use
from translator_kernels.errors import KernelInputError
from translator_kernels.program import TORCH

_PLANS: dict = {}  # (program, per tensor (shape, strides, dtype, device)) -> _Layout


def _plan(dst, inputs, program) -> _Layout:
    if not isinstance(dst, torch.Tensor):
        raise KernelInputError(f"elementwise_: dst must be a torch.Tensor, got {type(dst).__name__}")
    prog, _, _, _, _ = prepare(inputs, program)  # validates the inputs against the program
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    what = f"elementwise_ into {tuple(dst.shape)} {str(dst.dtype).replace('torch.', '')}"
    if len(prog.out) != 1:
        raise KernelInputError(f"{what}: the program has {len(prog.out)} outputs; an in-place write stores one")
    if TORCH[prog.out[0][1]] != dst.dtype:
        raise KernelInputError(f"{what}: the program's output is {prog.out[0][1]}; it must be dst's dtype")
    if shape != tuple(dst.shape):
        raise KernelInputError(f"{what}: the operands broadcast to {shape}, not dst's shape (an in-place op "
                               "cannot grow its destination)")
    if not dst.is_contiguous():
        raise KernelInputError(f"{what}: dst has strides {tuple(dst.stride())}; the in-place kernel writes a "
                               "contiguous tensor (write a strided view with PyTorch, or make the state contiguous)")
    return _Layout(prog, shape, math.prod(shape), None)


@kr.replayed
def elementwise_into(dst: torch.Tensor, inputs, program) -> None:
    """`dst` = program(dst, *inputs), in place (module notes). Returns nothing."""
    tensors = [dst, *inputs]
    key = _layout_key(tensors, program)
    lay = _PLANS.get(key) if key is not None else None
    if lay is None:
        lay = _plan(dst, tensors, program)  # a bad call raises here, never cached
        if key is not None:
            if len(_PLANS) >= MAX_LAYOUTS:
                _PLANS.clear()
            _PLANS[key] = lay
    if lay.numel == 0:
        return None
    flat_in, strides = flat_inputs(tensors)
    flat_out = [flat_in[0]]  # dst's own storage (contiguous: flat_inputs gave its flat view, not a copy)
    launch, name = _launch_for(lay, tensors, flat_in, flat_out, strides)
    note_use(name)
    kl.call(launch, *flat_in, *flat_out)
    return None
