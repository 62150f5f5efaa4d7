"""Cast round trips: a value widened and narrowed back to its own dtype is the value itself.

Under `precision="bf16"` / `"fp16"` / `"fp8"` on an fp32 model every lowering casts its inputs to
the compute dtype and its output back to the model's fp32 (`LowerCtx.cast_in`, `LowerCtx.replace`).
Between two lowered ops that leaves `bf16 -> fp32 -> bf16`, often with the views the model wrote in
between (HF Llama's `q.view(B, S, H, D).transpose(1, 2)` after the QKV GEMM, `o.transpose(1,
2).reshape(B, S, -1)` before the output projection), and each cast was a generated kernel launch:

    rms = flydsl.rms_norm(x16, ...)                 rms = flydsl.rms_norm(x16, ...)
    a = rms.to(fp32); b = a.to(bf16)         ->     y = flydsl.gemm(rms, ...)
    y = flydsl.gemm(b, ...)

    o = flydsl.attention(...)                       o = flydsl.attention(...)
    t = o.to(fp32).transpose(1, 2).reshape(..)  ->  t = o.transpose(1, 2).reshape(..)
    y = flydsl.gemm(t.to(bf16), ...)                y = flydsl.gemm(t, ...)

`x.to(wide).to(narrow)` is `x` on every value (NaN, inf, -0 and subnormals included) when `wide`
holds every value of `narrow` (bf16 and fp16 in fp32 or fp64, fp32 in fp64), and views do not look
at values, so the views move onto `x` and both casts go. A cast of a value to a dtype it was already
cast to before (the norm-residual fold casts the residual's fp32 input again) reads the first cast.

Where the result would differ from eager other than in values, the casts stay:
- layout: each cast makes a fresh tensor; the rewrite is made where the views on `x` end with the
  strides of the narrowed result (the stride contract), or else where every reader of the result is
  a FlyDSL op whose own result keeps its layout when re-inferred on the new strides (V's column slice
  of the merged QKV output, its copy dense, read by the attention in place: counter
  `cast_round_trip_strided`); a PyTorch reader or a view of it keeps the casts;
- storage: the rewrite makes the result share `x`'s storage, so no op of the graph may write `x`,
  the copy or the result in place (translator.aliases), and the result must not reach the graph's
  outputs (a returned tensor that shares the user's input or another output would surprise).

It runs twice: before partition (aten casts from the lowerings) and after the consumer folds (a
norm's residual fold casts inputs that partition has made single-cast kernels by then: such a kernel
counts as the cast it computes). Counter: `cast_round_trip` per pair removed, `cast_repeated` per
repeated cast. `aten.alias` counts as a view (HF's full slice before the LM head is captured as one).
"""

from __future__ import annotations

import operator

import torch

from .. import aliases
from ..graph import CASTS, aten, arg, dtype_of, val
from .cleanup import dead_code

# what each narrow dtype widens into exactly
EXACT = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
         torch.float32: (torch.float64,)}

# views whose result depends on their input's shape and strides only, never on its dtype or values
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.alias.default, aten.transpose.int,
         aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
         aten.slice.Tensor, aten.select.int, aten.expand.default, aten.t.default, aten.unflatten.int,
         aten.flatten.using_ints}
SPLITS = {aten.split.Tensor, aten.split_with_sizes.default}


def _layout(node) -> tuple:
    v = val(node)
    return (tuple(str(d) for d in v.shape), tuple(str(s) for s in v.stride())) if isinstance(v, torch.Tensor) else None


def cast_of(n) -> tuple | None:
    """(input, dtype) when `n` only converts its input's dtype (same device, layout kept), else None."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return None
    if n.target in CASTS and n.target is not aten.type_as.default and n.target is not aten.to.dtype_layout:
        x = n.args[0]
        kw = n.kwargs
        if kw.get("memory_format") not in (None, torch.preserve_format) or kw.get("layout") not in (None, torch.strided):
            return None
        if kw.get("pin_memory") or not isinstance(x, torch.fx.Node) or not isinstance(val(x), torch.Tensor):
            return None
        if not isinstance(val(n), torch.Tensor) or val(x).device != val(n).device:
            return None
        return x, dtype_of(n)
    if n.target is operator.getitem and _single_cast_kernel(n.args[0]):
        return n.args[0].args[0][0], dtype_of(n)
    return None


def _single_cast_kernel(f) -> bool:
    """A fused elementwise kernel (partition) that computes one cast of its one input."""
    if not (isinstance(f, torch.fx.Node) and f.target is getattr(torch.ops.flydsl, "fused_elementwise").default):
        return False
    from translator_kernels.program import parse

    prog = parse(arg(f, "program"))
    return prog.n == 1 and len(prog.ops) == 1 and prog.ops[0][0] == "cast" and prog.out == ((1, prog.out[0][1]),)


class _Storage:
    def __init__(self, graph):
        self.classes = aliases.storage_classes(graph)
        self.written = aliases.written_nodes(graph)
        out = next(n for n in graph.nodes if n.op == "output")
        self.returned = {self.classes[a] for a in out.all_input_nodes}

    def free(self, fresh, read) -> bool:
        """No op writes the storage of any of these nodes, and none of `fresh` (tensors that will share
        the storage of one of `read`) is a graph output or a view of one."""
        return not any(n in self.written for n in (*fresh, *read)) and \
            not any(self.classes[n] in self.returned for n in fresh)


def cast_round_trips(ctx) -> int:
    g = ctx.gm.graph
    if not any(cast_of(n) for n in g.nodes):
        return 0
    st = _Storage(g)
    count = 0
    for c in list(g.nodes):
        count += _round_trip(ctx, c, st)
    seen: dict = {}
    for c in list(g.nodes):
        hit = cast_of(c)
        if hit is None or not c.users:
            continue
        key = (hit[0], hit[1], _layout(c))
        first = seen.setdefault(key, c)
        if first is not c and st.free((c, first), (hit[0],)):
            c.replace_all_uses_with(first)
            ctx.count("cast_repeated")
            count += 1
    dead_code(ctx)
    return count


def _round_trip(ctx, c, st) -> int:
    """`c = views(x.to(wide)).to(narrow)` with x narrow: c's users read `views(x)`; 1 if rewritten."""
    hit = cast_of(c)
    if hit is None or not c.users:
        return 0
    b, narrow = hit
    views = []
    while isinstance(b, torch.fx.Node) and b.op == "call_function" and (b.target in VIEWS or _split_part(b)):
        views.append(b)
        b = b.args[0]
    inner = cast_of(b)
    if inner is None:
        return 0
    x, wide = inner
    if dtype_of(x) != narrow or wide not in EXACT.get(narrow, ()):
        return 0
    readers = list(c.users)
    if _layout(x)[1] != _layout(b)[1] and not all(_flydsl(u) for u in readers):
        return 0  # a strided source: only FlyDSL readers (checked below) may read it in place
    if not st.free((c,), (x, b, *views)):
        return 0
    cur, made = x, []
    try:
        for v in reversed(views):
            cur = ctx.insert(v.target, cur, *v.args[1:], before=c, **v.kwargs)
            made.append(cur)
    except RuntimeError:  # a view the strided source cannot take (it would need a copy)
        return _undo(made, 0)
    if _layout(cur) == _layout(c):
        c.replace_all_uses_with(cur)
        ctx.count("cast_round_trip")
        return 1
    if not all(_flydsl(u) for u in readers):
        return _undo(made, 0)
    before = [_layouts(val(u)) for u in readers]
    c.replace_all_uses_with(cur)
    try:
        for u in readers:
            ctx.infer(u)
        kept = [_layouts(val(u)) for u in readers] == before
    except RuntimeError:  # a reader's meta function refuses the strides
        kept = False
    if not kept:  # a reader's result would change its layout
        cur.replace_all_uses_with(c)
        for u in readers:
            ctx.infer(u)
        return _undo(made, 0)
    ctx.count("cast_round_trip_strided")
    return 1


def _split_part(n) -> bool:
    """`n` is one part of a split (GPT-2's `c_attn(x).split(d, 2)`): a view, walked as the split node and
    its getitem (the rebuilt chain splits the narrow tensor again, a view as well)."""
    if n.target is operator.getitem:
        return isinstance(n.args[0], torch.fx.Node) and n.args[0].target in SPLITS
    return n.target in SPLITS


def _flydsl(n) -> bool:
    return n.op == "call_function" and getattr(n.target, "namespace", None) == "flydsl"


def _layouts(v) -> tuple:
    """Shapes and strides of a value or of each tensor of a list / tuple of them."""
    if isinstance(v, (list, tuple)):
        return tuple(_layouts(t) for t in v)
    return (tuple(str(d) for d in v.shape), tuple(str(s) for s in v.stride())) if isinstance(v, torch.Tensor) else ()


def _undo(made, result):
    for m in reversed(made):
        m.graph.erase_node(m)
    return result
