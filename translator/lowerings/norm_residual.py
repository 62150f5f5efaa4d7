"""Residual add + norm -> `flydsl.add_rms_norm` / `flydsl.add_layer_norm` (two outputs).

A consumer rule on the norms the canonical and hand-written rules produced:

    hidden = residual + hidden                # the sum feeds the norm AND is used later
    residual = hidden; hidden = self.post_attention_layernorm(hidden)   # pre-norm blocks

``s = a + b; y = flydsl.rms_norm(s, ...)`` with s also read elsewhere becomes
``s, y = flydsl.add_rms_norm(a, b, ...)`` (or add_layer_norm): one pass that writes both the
residual stream and the normalized value; the graph gets getitem nodes for the two results.

When one addend is a GEMM whose only use is this add (every transformer's ``x + o_proj(attn)``),
the GEMM epilogue folds the add as its residual for one extra read (4 tensor passes: gemm writes
x + r, norm reads and writes) where add + norm costs 5 (gemm writes, add+norm reads two and
writes two). So `claims` leaves such an add (also through an eval dropout) to the elementwise
regions, whose region after a GEMM the epilogue folds (the norm then reads the GEMM). Where the GEMM's output is cast back
first (under precision bf16 / fp16), the addend is the cast, not the GEMM, and this rule takes
the add.
"""

from __future__ import annotations

import torch

from ..graph import arg, aten, dtype_of, is_call, operand, same_shape, users
from ..registry import NO_MATCH, Match, Stage, rule
from . import gemm, norm  # noqa: F401  (register the norm families and the ops this rule reads)

Node = torch.fx.Node
GEMM = torch.ops.flydsl.gemm.default
PASS = (aten.dropout.default, aten.clone.default, aten.alias.default)  # compute nothing in eval
NORMS = {torch.ops.flydsl.layer_norm.default: "add_layer_norm", torch.ops.flydsl.rms_norm.default: "add_rms_norm"}


def _parts(norm, ctx):
    """(add, precision cast or None) when flydsl norm `norm` reads a residual add also used
    elsewhere, else None."""
    x, cast = arg(norm, "x"), None
    if is_call(x, aten._to_copy.default) and x.kwargs == {"dtype": ctx.compute_dtype} and len(x.args) == 1 \
            and ctx.precision != "fp32" and dtype_of(arg(x, "self")) == torch.float32 and users(x) == [norm]:
        x, cast = arg(x, "self"), x  # the precision policy's cast of the sum (LowerCtx.cast_in)
    if not is_call(x, aten.add.Tensor) or arg(x, "alpha") != 1:
        return None
    a, b = arg(x, "self"), arg(x, "other")
    if not (isinstance(a, Node) and isinstance(b, Node) and same_shape(a, x) and same_shape(b, x)):
        return None
    if not dtype_of(a) == dtype_of(b) == dtype_of(x) or ctx.denied([x]):
        return None
    if not [u for u in users(x) if u is not (cast or norm)]:
        return None  # read only by the norm: a plain norm of a + b is the same kernel count
    if any(_reads(p, x) for p in norm.all_input_nodes if p is not (cast or x)):
        return None  # a weight computed from the sum: the fused op could not come before it
    return x, cast


def _reads(node, target) -> bool:
    """`node` is computed from `target` (a path of inputs leads to it)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def add_norm_supported(node, ctx):
    parts = _parts(node, ctx)
    return NO_MATCH if parts is None else Match(add=parts[0], cast=parts[1])


def claims(node, ctx) -> list:
    """The residual add (and the precision cast of it) this rule will take into norm `node`: kept
    out of elementwise regions. An add of a GEMM that nothing else reads is left to the regions:
    the GEMM epilogue folds the region it lands in (gemm_epilogue.py) as its residual."""
    parts = _parts(node, ctx)
    if parts is None or any(_lone_gemm(arg(parts[0], k), parts[0]) for k in ("self", "other")):
        return []
    return [p for p in parts if p is not None]


def _lone_gemm(a, reader) -> bool:
    """`a` is a GEMM that only `reader` reads, through eval dropout / clone / alias (GPT-2's
    ``x + self.drop(self.c_proj(h))``): its epilogue will take the add."""
    while is_call(a, *PASS) and users(a) == [reader] and not (a.target is aten.dropout.default and arg(a, "train")):
        a, reader = operand(a), a
    return is_call(a, GEMM) and users(a) == [reader]


@rule(Stage.CONSUMER, torch.ops.flydsl.layer_norm.default, family="add_layer_norm", supported=add_norm_supported,
      name="add_layer_norm", claims=claims,
      doc="layer_norm(x + r) where x + r is also used later -> (x + r, norm) in one pass")
@rule(Stage.CONSUMER, torch.ops.flydsl.rms_norm.default, family="add_rms_norm", supported=add_norm_supported,
      name="add_rms_norm", claims=claims,
      doc="rms_norm(x + r) where x + r is also used later -> (x + r, norm) in one pass")
def lower_add_norm(norm, ctx, m):
    """``s, y = flydsl.add_<kind>_norm(a, b, ...)``: s takes the add's uses, y the norm's. The
    add's other users that came before the norm are moved after it (fuse_consumers re-sorts)."""
    add, cast = m.add, m.cast
    family = NORMS[norm.target]
    a, b = (ctx.cast_in(arg(add, k), norm) for k in ("self", "other"))
    info = norm.meta["flydsl"]
    rest = [arg(norm, p.name) for p in norm.target._schema.arguments[1:]]  # the norm's own arguments after x
    new, (s, y) = ctx.emit(family, (a, b, *rest), lowering=family, sources=[add], anchor=info["anchor"],
                           before=norm, output_anchors=(add, info["anchor"]))
    ctx.absorb(new, [norm])
    s = ctx.cast(s, dtype_of(add), norm)  # the sum in the compute dtype, back to the model's
    norm.replace_all_uses_with(y)
    ctx.gm.graph.erase_node(norm)
    if cast is not None:
        ctx.gm.graph.erase_node(cast)
    add.replace_all_uses_with(s)
    ctx.gm.graph.erase_node(add)
    return new
