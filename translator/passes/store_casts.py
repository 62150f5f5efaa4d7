"""A GEMM's output widened to fp32 by the precision mode: the GEMM stores fp32 itself, no cast kernel.

Under precision="bf16" / "fp16" on an fp32 model every lowering casts its output back to the model's
fp32 (`LowerCtx.replace`). Where nothing lowered reads it next (the LM head's logits, the model's
output; gpt-fast's QKV projection, split in fp32 before RoPE and the fp32 KV cache), the cast stays
after passes/casts.py, and partition makes it a generated kernel of one op:

    y = flydsl.gemm(x16, W16, ...)                          y = flydsl.gemm(x16, W16, ...,
    z = flydsl.fused_elementwise([y], cast f32)      ->         activation=act; cast bf16,
                                                                 out_dtype=fp32)

The GEMM accumulates in fp32. Storing the accumulator as it is would be more accurate than the
graph and differ from it; this fold keeps the precision mode's semantics instead: the epilogue
rounds to the compute dtype (a `cast` step of its per-element program, after any activation) and
stores that value widened to fp32, exactly what the cast kernel read and wrote, bit for bit
(docs/precision.md says why: the translation with and without the fold agree, so a mismatch
never depends on which folds fired). The store writes twice the bytes of the bf16 output; the
cast kernel read those and wrote the fp32 copy on top, so traffic goes down as well as a launch.

Refused where the rounding would move: a residual (the kernel adds it after the program, in fp32:
eager rounds the sum once, the fold would round before the add). The region must be the GEMM's only
reader and compute the one cast alone; its output keeps the GEMM's layout (both are the dense
[..., n] of the GEMM: checked). Counter `gemm_out_cast`.

The same for a gather: the embedding of an fp32 table (the user's parameter) narrowed to bf16 for the
first norm and the residual stream is stored in bf16 by the gather (`out_dtype`: each row converted
in registers as `.to()` rounds, bit for bit), counter `embedding_out_cast`. The table stays fp32:
no bf16 copy of it is made.

And for a generated elementwise kernel: its fp32 output read, through views only, by a cast kernel
to bf16 (GPT-2's `gelu(fc(x))` viewed back to [-1, 4d] before the projection: a view between the two
regions keeps partition from putting them in one) is stored in bf16 by the kernel that computes it
(the program's output dtype: the store rounds as the cast does), the views rebuilt on it. Counter
`region_out_cast`. The layout must come out the same (the fp32 output and the views keep their
strides, so the narrow views' strides must be the cast's).

All are passes after the consumer folds, not consumer rules: a cast that a later fold takes (the residual
add a norm takes with its precision casts, norm_residual.py) must still be there for it; what is
left by then is a cast kernel that nothing else removes.
"""

from __future__ import annotations

import torch

from translator_kernels.program import DTYPES, Program, epilogue, parse, then

from ..graph import arg, dtype_of, getitem_of, set_args, val
from .casts import VIEWS

NARROW = (torch.bfloat16, torch.float16)


def _layout(v) -> tuple:
    return tuple(str(d) for d in v.shape), tuple(str(d) for d in v.stride())


def _cast_region(g, to: str, readers):
    """The one getitem of the region that alone (beside `readers`, checks that read no value) reads
    `g` and only casts its value to `to`, keeping g's layout; else None."""
    fe = torch.ops.flydsl.fused_elementwise.default
    if len(readers) != 1:
        return None
    f = readers[0]
    if f.target is not fe or list(arg(f, "inputs")) != [g]:
        return None
    prog = parse(arg(f, "program"))
    if prog.n != 1 or len(prog.out) != 1 or prog.out[0] != (len(prog.ops), to) \
            or prog.ops not in ((), (("cast", (0,), (to,)),)):
        return None
    outs = list(f.users)
    if len(outs) != 1 or getitem_of(outs[0]) is None or _layout(val(outs[0])) != _layout(val(g)):
        return None
    return outs[0]


def gemm_out_casts(ctx) -> int:
    gemm = getattr(torch.ops.flydsl, "gemm", None)
    count = 0
    for g in list(ctx.gm.graph.nodes):
        if gemm is None or g.target is not gemm.default or dtype_of(g) not in NARROW \
                or arg(g, "residual") is not None or arg(g, "out_dtype") is not None:
            continue
        out = _cast_region(g, "f32", list(g.users))
        if out is None:
            continue
        f = getitem_of(out)[0]
        rnd = Program(1, (("cast", (0,), (DTYPES[dtype_of(g)],)),), ((1, "f32"),))
        act = arg(g, "activation")
        set_args(g, activation=epilogue(then(parse(act), rnd) if act else rnd), out_dtype=torch.float32)
        ctx.infer(g)
        out.replace_all_uses_with(g)
        ctx.absorb(g, [f])
        ctx.erase_unused([out, f])
        ctx.count("gemm_out_cast")
        count += 1
    return count


def embedding_out_casts(ctx) -> int:
    emb = getattr(torch.ops.flydsl, "embedding", None)
    count = 0
    for e in list(ctx.gm.graph.nodes):
        if emb is None or e.target is not emb.default or arg(e, "out_dtype") is not None:
            continue
        checks = [u for u in e.users if u.target is torch.ops.aten._assert_tensor_metadata.default]
        out = _cast_region(e, "bf16", [u for u in e.users if u not in checks]) \
            or _cast_region(e, "f16", [u for u in e.users if u not in checks])
        if out is None or dtype_of(e) == dtype_of(out):
            continue
        f = getitem_of(out)[0]
        set_args(e, out_dtype=dtype_of(out))
        ctx.infer(e)
        out.replace_all_uses_with(e)
        for c in checks:  # they assert the dtype of the fp32 rows, which no longer exist
            ctx.gm.graph.erase_node(c)
        ctx.absorb(e, [f])
        ctx.erase_unused([out, f])
        ctx.count("embedding_out_cast")
        count += 1
    return count


def _narrowing(o):
    """(view chain, cast kernel's getitem, dtype name) when fp32 value `o` is read only through views,
    each the only reader of the one before, by one kernel casting it alone to bf16 / fp16."""
    chain, n = [], o
    while len(n.users) == 1:
        u = next(iter(n.users))
        if u.op == "call_function" and u.target in VIEWS and u.args[0] is n:
            chain.append(u)
            n = u
            continue
        for to in ("bf16", "f16"):
            out = _cast_region(n, to, [u])
            if out is not None:
                return chain, out, to
        return None
    return None


def region_out_casts(ctx) -> int:
    fe = torch.ops.flydsl.fused_elementwise.default
    count = 0
    for f in list(ctx.gm.graph.nodes):
        if f.target is not fe:
            continue
        for o in list(f.users):
            part = getitem_of(o)
            if part is None or dtype_of(o) != torch.float32:
                continue
            hit = _narrowing(o)
            if hit is None:
                continue
            chain, out, to = hit
            prog = parse(arg(f, "program"))
            j = part[1]
            old_prog, old_vals = arg(f, "program"), [val(v) for v in (o, *chain)]
            outs = tuple((v, to if k == j else dt) for k, (v, dt) in enumerate(prog.out))
            set_args(f, program=Program(prog.n, prog.ops, outs).text())
            ctx.infer(f)
            o.meta["val"] = val(f)[j]
            for v in chain:
                ctx.infer(v)
            if _layout(val(chain[-1] if chain else o)) != _layout(val(out)):  # the cast's strides differ
                set_args(f, program=old_prog)
                ctx.infer(f)
                for v, old in zip((o, *chain), old_vals):
                    v.meta["val"] = old
                continue
            c = getitem_of(out)[0]
            out.replace_all_uses_with(chain[-1] if chain else o)
            ctx.absorb(f, [c])
            ctx.erase_unused([out, c])
            ctx.count("region_out_cast")
            count += 1
    return count
