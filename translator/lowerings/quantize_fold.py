"""An elementwise kernel that feeds an fp8 GEMM joins the per-token quantize: `flydsl.quantize_fp8_program`.

The fp8 linear after an elementwise region reads ``q, s = flydsl.quantize_fp8(fused_elementwise(...))``.
In a Llama MLP under precision="fp8" whose gate and up stay two fp8 GEMMs (gated_fp8.GATED = False, or one of them
kept bf16; by default they are one fp8 gated GEMM, and here only a cast of its output joins the quantize)::

    h = F.silu(self.gate_proj(x)) * self.up_proj(x)     # a fused_elementwise region
    y = self.down_proj(h)                               # quantize_fp8(h) + gemm_fp8

A CONSUMER rule folds the region into the quantize as its prologue, as fold.py does for a reduction:
the quantize kernel (translator_kernels.gemm.quantize.quantize_program) loads the region's inputs,
runs its per-element program, rounds the value to the dtype the region would have stored, and
quantizes the row. One launch where there were two; h never goes to memory. Bit-exact to the two
kernels (the same device functions, the same rounding). In an fp32 model the region is the bf16 -> fp32 -> bf16
round trip of a bf16 producer's output (the attention's, the fp8 gated GEMM's): the quantize reads that output.

Taken: a region with one output, read only by this quantize, whose inputs (at most 4, fp32 / bf16 /
fp16) all have the output's shape (no broadcast operand). A norm before the quantize goes to the norm
(norm_fp8.py) first. Not done: a GEMM epilogue writing fp8 (o_proj's input is the attention output,
whose producer is the attention kernel; down_proj's is the fp8 gated GEMM, whose epilogue cannot see a row's
|max| across its N tiles).
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.program import evaluate, parse

from ..graph import arg, dtype_of, getitem_of, shape_of, users
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from . import elementwise, fp8_mode  # noqa: F401  (register the ops folded here)

Q = torch.ops.flydsl.quantize_fp8.default
FE = torch.ops.flydsl.fused_elementwise.default
MAX_INPUTS = 4
_FLOAT = set(FLOAT_NAMES.values())


@torch.library.custom_op("flydsl::quantize_fp8_program", mutates_args=())
def quantize_fp8_program(inputs: List[torch.Tensor], program: str, fmt: str) -> Tuple[torch.Tensor, torch.Tensor]:
    return dispatch("quantize_fp8_program", inputs, program, fmt)


@quantize_fp8_program.register_fake
def _(inputs, program, fmt):
    x = inputs[0]
    return x.new_empty(x.shape, dtype=getattr(torch, fmt)), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def ref_quantize_fp8_program(inputs, program, fmt):
    from translator_kernels.program import TORCH

    prog = parse(program)
    (j, dt), = prog.out
    return fp8_mode.ref_quantize_fp8(evaluate(prog, list(inputs))[j].to(TORCH[dt]), fmt)


def kernel_quantize_fp8_program(inputs, program, fmt):
    from translator_kernels import launch as kl
    from translator_kernels.gemm.fp8 import fp8_format
    from translator_kernels.gemm.quantize import quantize_program

    return quantize_program(list(inputs), program, fp8_format(getattr(torch, fmt), kl.arch()))


_SAMPLE = '{"n":2,"ops":[["silu",[0],[]],["mul",[2,1],[]]],"out":[[3,"f32"]]}'
register_family(OpFamily(
    name="quantize_fp8_program", description="a per-element program of its inputs, quantized per row to fp8 "
                                             "(the elementwise kernel and the quantize in one launch)",
    reference=ref_quantize_fp8_program, kernel=kernel_quantize_fp8_program,
    kernel_entry="translator_kernels.gemm.quantize:quantize_program",
    sample_inputs=lambda dt: ([torch.randn(6, 48).to(dt), torch.randn(6, 48).to(dt)], _SAMPLE, "float8_e4m3fnuz"),
    tolerance_overrides={torch.float32: (1e-4, 1e-4, "its values feed gemm_fp8, whose fp32 sums run in MFMA order")},
))


def quantize_prologue_supported(node, ctx):
    x = arg(node, "x")
    g = getitem_of(x)
    if g is None or g[0].target is not FE or users(x) != [node] or len(users(g[0])) != 1:
        return NO_MATCH
    f = g[0]
    prog, ins = parse(arg(f, "program")), list(arg(f, "inputs"))
    if len(prog.out) != 1 or prog.out[0][1] not in _FLOAT:
        return NO_MATCH
    # not taken (the region stays its own kernel, which is no fallback: NO_MATCH, not a reason): more inputs
    # than the kernel takes, a non-float input, a broadcast operand
    if len(ins) > MAX_INPUTS or any(dtype_of(a) not in (torch.float32, torch.bfloat16, torch.float16) for a in ins) \
            or any(list(shape_of(a) or ()) != list(shape_of(x) or ()) for a in ins):
        return NO_MATCH
    return Match(g=x, f=f)


@rule(Stage.CONSUMER, Q, family="quantize_fp8_program", supported=quantize_prologue_supported,
      name="quantize_prologue", doc="quantize_fp8(elementwise region) -> one kernel: the program, then the "
                                    "per-token fp8 quantize (silu(gate) * up before down_proj)")
def fold_quantize_prologue(node, ctx, m):
    new, outs = ctx.emit("quantize_fp8_program", (list(arg(m.f, "inputs")), arg(m.f, "program"), arg(node, "fmt")),
                         lowering="quantize_prologue", sources=[], anchor=node.meta["flydsl"]["anchor"], before=node)
    ctx.absorb(new, [m.f, node])
    for u in list(users(node)):
        u.replace_all_uses_with(outs[getitem_of(u)[1]])
    ctx.erase_unused([*users(node), node, m.g, m.f])
    return new
