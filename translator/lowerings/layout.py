"""Layout family: `flydsl.layout(inputs, spec)` — a data-movement op as the one layout kernel.

Forms matched (where they appear):
- ``F.pad`` (constant, reflect, replicate, circular; negative pads crop): conv padding written by
  hand, sequence padding to a block multiple, Swin's window padding.
- ``torch.roll``: Swin's shifted windows; ``Tensor.repeat`` / ``repeat_interleave(int, dim)``: GQA
  key / value heads written without repeat_kv's expand, CLIP / ViT class tokens;
  ``expand`` / ``expand_as`` materialized for a consumer that needs the data.
- ``index_select`` and ``x[ids]`` / ``x[:, ids]`` (one integer index tensor): rotary tables indexed
  by position ids, gathering kept tokens; ``Tensor.unfold``: sliding windows, im2col by hand.
- ``zeros_like`` / ``ones_like`` / ``full_like`` / ``new_zeros`` / ``new_ones`` / ``new_full`` whose
  result is not folded at specialization.

The node carries the op and its constants as canonical JSON (``{"op": "pad", "pad": [1, 1], ...}``);
the kernel's map (translator_kernels.layout) is built from the run-time shapes, so a new batch or
sequence length needs no new node. Every op here is exact in every dtype (it moves bits).

What is not a launch:
- a node whose value depends only on shapes and constants stays for fold_shapes, which computes it
  once per input shape (a causal mask's expand, `torch.zeros(b, s)`);
- an expand (or a repeat of size-1 dims) read by a generated elementwise kernel folds into that
  kernel's broadcast indexing, and a fill into a constant of its program (`fold_into_elementwise`
  below): the kernel reads the small source per vector instead of a materialized copy;
- an expand or unfold only PyTorch ops read (they take strides) goes back to a view
  (`keep_view`): both are views in PyTorch, so a copy would only cost.

`masked_fill(x, mask, v)` and `clamp(x, min_t, max_t)` with tensor bounds are elementwise: rows of
the elementwise table (translator/lowerings/elementwise.py) put them into fused regions.
"""

from __future__ import annotations

import json

import torch

from ..aliases import shape_only_nodes, written_nodes
from ..graph import META_ONLY, aten, arg, dtype_of, full_shape, set_args, shape_of, val
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from .fold import FE
from translator_kernels.program import Program, parse

F = torch.nn.functional
LAYOUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                 torch.int16, torch.int8, torch.uint8, torch.bool)


@torch.library.custom_op("flydsl::layout", mutates_args=())
def layout(inputs: list[torch.Tensor], spec: str) -> torch.Tensor:
    return dispatch("layout", inputs, spec)


def _dtype(name):
    return getattr(torch, name.removeprefix("torch."))


def ref_layout(inputs, spec):
    """The op in plain torch (a new contiguous tensor, as the kernel returns)."""
    s = json.loads(spec)
    op, x = s["op"], inputs[0]
    if op == "pad":
        out = F.pad(x, s["pad"], mode=s["mode"], value=s["value"] if s["mode"] == "constant" else None)
    elif op == "roll":
        out = torch.roll(x, s["shifts"], s["dims"])
    elif op == "repeat":
        out = x.repeat(s["repeats"])
    elif op == "expand":
        out = x.expand(s["size"])
    elif op == "expand_as":
        out = x.expand_as(inputs[1])
    elif op == "index_select":
        out = torch.index_select(x, s["dim"], inputs[1])
    elif op == "index":
        out = x[(slice(None),) * s["dim"] + (inputs[1],)]
    elif op == "unfold":
        out = x.unfold(s["dim"], s["size"], s["step"])
    elif op == "repeat_interleave":
        out = x.repeat_interleave(s["repeats"], s["dim"])
    elif op == "fill":
        return torch.full(x.shape if s["size"] is None else s["size"], s["value"], dtype=_dtype(s["dtype"]),
                          device=x.device)
    else:
        raise ValueError(f"layout: unknown op {op!r} in spec {spec}")
    return out.clone(memory_format=torch.contiguous_format)


@layout.register_fake
def _(inputs, spec):
    return ref_layout(inputs, spec)


def kernel_layout(inputs, spec):
    import translator_kernels.layout as L

    s = json.loads(spec)
    op, x = s["op"], inputs[0]
    if op == "pad":
        return L.pad(x, s["pad"], s["mode"], s["value"])
    if op == "roll":
        return L.roll(x, s["shifts"], s["dims"])
    if op in ("repeat", "expand"):
        return getattr(L, op)(x, s["repeats" if op == "repeat" else "size"])
    if op == "expand_as":
        return L.expand(x, inputs[1].shape)
    if op in ("index_select", "index"):
        return getattr(L, op)(x, s["dim"], inputs[1])
    if op == "unfold":
        return L.unfold(x, s["dim"], s["size"], s["step"])
    if op == "repeat_interleave":
        return L.repeat_interleave(x, s["repeats"], s["dim"])
    if op == "fill":
        return L.fill(x.shape if s["size"] is None else s["size"], s["value"], _dtype(s["dtype"]), x.device)
    raise ValueError(f"layout: unknown op {op!r} in spec {spec}")


def spec_text(op: str, **params) -> str:
    return json.dumps({"op": op, **params}, sort_keys=True)


register_family(OpFamily(
    name="layout", description="data movement (pad, roll, repeat, expand, index, unfold, fill) as one map kernel",
    reference=ref_layout, kernel=kernel_layout, kernel_entry="translator_kernels.layout:pad",
    sample_inputs=lambda dt: ([torch.randn(5, 6).to(dt)], spec_text("pad", pad=[1, 2, -1, 1], mode="constant",
                                                                     value=0.5)),
))


# --- support ------------------------------------------------------------------------------------

def _static(v) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_static(e) for e in v)
    return v is None or isinstance(v, (bool, int, float, str))


def folded_at_specialization(node, ctx) -> bool:
    """Whether fold_shapes will serve `node` from its cache (it depends only on shapes and constants):
    then a launch per forward would be a loss. Ops that read only a tensor's shape fold with the
    rest of a region, never alone (translator.passes.fold_shapes)."""
    const = shape_only_nodes(ctx.gm)
    if node not in const:
        return False
    if node.target not in META_ONLY:
        return True
    return any(m.op == "call_function" and m.target not in META_ONLY and isinstance(val(m), torch.Tensor)
               and any(u not in const for u in m.users) for m in const)


def _common(node, ctx, x, *params):
    if not isinstance(val(x), torch.Tensor):
        return "the source is not a tensor"
    for t in (x, node):
        if dtype_of(t) not in LAYOUT_DTYPES:
            return f"dtype {str(dtype_of(t)).replace('torch.', '')} is not moved by the layout kernel (real and bool only)"
    if not _static(params):
        return "a symbolic size or shift (the layout map takes constants)"
    if folded_at_specialization(node, ctx):
        return "depends only on shapes and constants: folded at specialization (computed once per input shape)"
    out = val(node)
    n = 1
    for d in out.shape:
        n *= int(d) if isinstance(d, int) else 1
    if n * out.element_size() >= 2**31:
        return f"output {tuple(out.shape)} spans >= 2 GiB (32-bit buffer offsets)"
    return None


def _emit(node, ctx, name, inputs, **params):
    return ctx.replace(node, "layout", f"layout_{name}", (list(inputs), spec_text(name, **params)), [node])


def pad_supported(node, ctx):
    mode = arg(node, "mode", "constant")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        return f"pad mode {mode!r} (the layout kernel takes constant, reflect, replicate, circular)"
    pads = list(arg(node, "pad"))
    if mode != "constant" and _static(pads) and any(p < 0 for p in pads):
        return f"{mode} pad with negative pads {pads} (only constant mode crops)"
    return _common(node, ctx, arg(node, "self"), pads, arg(node, "value"))


@rule(Stage.CANONICAL, aten.pad.default, family="layout", supported=pad_supported, doc="F.pad (any mode but none)")
def lower_pad(node, ctx):
    mode = arg(node, "mode", "constant")
    value = arg(node, "value")
    return _emit(node, ctx, "pad", [arg(node, "self")], pad=[int(p) for p in arg(node, "pad")], mode=mode,
                 value=0.0 if value is None else value)


def constant_pad_supported(node, ctx):
    return _common(node, ctx, arg(node, "self"), list(arg(node, "pad")), arg(node, "value"))


@rule(Stage.CANONICAL, aten.constant_pad_nd.default, family="layout", supported=constant_pad_supported,
      doc="constant_pad_nd (F.pad's constant mode as some captures spell it)")
def lower_constant_pad_nd(node, ctx):
    return _emit(node, ctx, "pad", [arg(node, "self")], pad=[int(p) for p in arg(node, "pad")], mode="constant",
                 value=arg(node, "value", 0))


def roll_supported(node, ctx):
    shifts, dims = list(arg(node, "shifts")), list(arg(node, "dims") or [])
    if not dims:
        return "roll of the flattened tensor (no dims)"
    return _common(node, ctx, arg(node, "self"), shifts, dims)


@rule(Stage.CANONICAL, aten.roll.default, family="layout", supported=roll_supported, doc="torch.roll along dims")
def lower_roll(node, ctx):
    return _emit(node, ctx, "roll", [arg(node, "self")], shifts=[int(s) for s in arg(node, "shifts")],
                 dims=[int(d) for d in arg(node, "dims")])


def repeat_supported(node, ctx):
    return _common(node, ctx, arg(node, "self"), list(arg(node, "repeats")))


@rule(Stage.CANONICAL, aten.repeat.default, family="layout", supported=repeat_supported, doc="Tensor.repeat")
def lower_repeat(node, ctx):
    return _emit(node, ctx, "repeat", [arg(node, "self")], repeats=[int(r) for r in arg(node, "repeats")])


def expand_supported(node, ctx):
    if node.target is aten.expand_as.default:
        return _common(node, ctx, arg(node, "self"))
    return _common(node, ctx, arg(node, "self"), list(arg(node, "size")))


@rule(Stage.CANONICAL, aten.expand.default, aten.expand_as.default, family="layout", supported=expand_supported,
      doc="expand / expand_as (folded into a generated elementwise consumer as broadcast)")
def lower_expand(node, ctx):
    if node.target is aten.expand_as.default:
        return _emit(node, ctx, "expand_as", [arg(node, "self"), arg(node, "other")])
    return _emit(node, ctx, "expand", [arg(node, "self")], size=[int(d) for d in arg(node, "size")])


def _ids_reason(ids):
    if not isinstance(val(ids), torch.Tensor) or dtype_of(ids) not in (torch.int64, torch.int32):
        return "indices are not an int64 / int32 tensor"
    return None


def index_select_supported(node, ctx):
    ids = arg(node, "index")
    return _ids_reason(ids) or _common(node, ctx, arg(node, "self"), arg(node, "dim"))


@rule(Stage.CANONICAL, aten.index_select.default, family="layout", supported=index_select_supported,
      doc="index_select (ids bounds-checked on the device)")
def lower_index_select(node, ctx):
    return _emit(node, ctx, "index_select", [arg(node, "self"), arg(node, "index")], dim=int(arg(node, "dim")))


def one_index(idx) -> tuple:
    """(dim of the one index tensor of an `indices` list, None) or (None, the reason it is not one)."""
    tensors = [i for i in idx if i is not None]
    if len(tensors) != 1:
        return None, f"{len(tensors)} index tensors (the layout and scatter kernels take one)"
    d = idx.index(tensors[0])
    if any(i is not None for i in idx[d + 1:]):
        return None, "an index after the tensor index"
    return d, _ids_reason(tensors[0])


def index_supported(node, ctx):
    idx = list(arg(node, "indices"))
    d, reason = one_index(idx)
    return reason or _common(node, ctx, arg(node, "self"), len(idx))


@rule(Stage.CANONICAL, aten.index.Tensor, family="layout", supported=index_supported,
      doc="x[ids] / x[:, ids] with one integer index tensor (negative ids count from the end)")
def lower_index(node, ctx):
    idx = list(arg(node, "indices"))
    d = next(i for i, t in enumerate(idx) if t is not None)
    return _emit(node, ctx, "index", [arg(node, "self"), idx[d]], dim=d)


def unfold_supported(node, ctx):
    return _common(node, ctx, arg(node, "self"), arg(node, "dimension"), arg(node, "size"), arg(node, "step"))


@rule(Stage.CANONICAL, aten.unfold.default, family="layout", supported=unfold_supported, doc="Tensor.unfold")
def lower_unfold(node, ctx):
    return _emit(node, ctx, "unfold", [arg(node, "self")], dim=int(arg(node, "dimension")), size=int(arg(node, "size")),
                 step=int(arg(node, "step")))


def repeat_interleave_supported(node, ctx):
    if arg(node, "dim") is None:
        return "repeat_interleave without dim (of the flattened tensor)"
    return _common(node, ctx, arg(node, "self"), arg(node, "repeats"), arg(node, "dim"))


@rule(Stage.CANONICAL, aten.repeat_interleave.self_int, family="layout", supported=repeat_interleave_supported,
      doc="repeat_interleave with one int count along a dim")
def lower_repeat_interleave(node, ctx):
    return _emit(node, ctx, "repeat_interleave", [arg(node, "self")], repeats=int(arg(node, "repeats")),
                 dim=int(arg(node, "dim")))


# fills: (how the value is read, whether the size is the like-tensor's)
FILLS = {aten.zeros_like.default: (0, True), aten.ones_like.default: (1, True),
         aten.full_like.default: ("fill_value", True), aten.new_zeros.default: (0, False),
         aten.new_ones.default: (1, False), aten.new_full.default: ("fill_value", False)}


def fill_supported(node, ctx):
    device = arg(node, "device")
    if device is not None and torch.device(device) != val(arg(node, "self")).device:
        return f"a fill on {device}, another device than its like-tensor"
    if arg(node, "layout") not in (None, torch.strided) or arg(node, "pin_memory") not in (None, False):
        return "a layout or pinned-memory request"
    if FILLS[node.target][1] and arg(node, "memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return "a memory_format request"
    value = FILLS[node.target][0]
    value = arg(node, value) if isinstance(value, str) else value
    return _common(node, ctx, arg(node, "self"), value, None if FILLS[node.target][1] else list(arg(node, "size")))


@rule(Stage.CANONICAL, *FILLS, family="layout", supported=fill_supported,
      doc="zeros_like / ones_like / full_like / new_zeros / new_ones / new_full not folded at specialization")
def lower_fill(node, ctx):
    value = FILLS[node.target][0]
    value = arg(node, value) if isinstance(value, str) else value
    size = None if FILLS[node.target][1] else [int(d) for d in arg(node, "size")]
    return _emit(node, ctx, "fill", [arg(node, "self")], size=size, value=value, dtype=str(dtype_of(node)))


# --- folded into a generated elementwise consumer: broadcast instead of a copy ---------------

LAYOUT = torch.ops.flydsl.layout.default
EXPANDS = (aten.expand.default, aten.expand_as.default)


def broadcast_source(n):
    """What `n` broadcasts when it only broadcasts (an expand, a repeat of size-1 dims), else None."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return None
    if n.target in EXPANDS:
        return arg(n, "self")
    if n.target is not LAYOUT:
        return None
    s = json.loads(arg(n, "spec"))
    x = arg(n, "inputs")[0]
    if s["op"] in ("expand", "expand_as"):
        return x
    if s["op"] == "repeat":
        xs = [str(d) for d in shape_of(x)]
        reps = s["repeats"][len(s["repeats"]) - len(xs):]
        if all(r == 1 or d == "1" for d, r in zip(xs, reps)):
            return x
    return None


def fill_constant(n):
    """The value of a layout fill node, rounded to its dtype (as the program's fp32 constant), else None."""
    if not isinstance(n, torch.fx.Node) or n.target is not LAYOUT:
        return None
    s = json.loads(arg(n, "spec"))
    if s["op"] != "fill":
        return None
    return float(torch.tensor(s["value"], dtype=_dtype(s["dtype"])).float())


def _foldable(fe):
    """(input position, broadcast source or None, fill constant or None) of the first input of `fe`
    the kernel can do without: read unexpanded, or a constant of its program. Shapes are compared
    by their printed dims, as partitioning does (no guard on a symbolic size)."""
    ins = list(arg(fe, "inputs"))
    full = full_shape([shape_of(i) for i in ins])
    written = written_nodes(fe.graph)  # a fill written through a view later holds data, not its constant
    for k, a in enumerate(ins):
        if a in written:
            continue
        src = broadcast_source(a)
        fill = fill_constant(a) if src is None else None
        if (src is None or not isinstance(val(src), torch.Tensor)) and fill is None:
            continue
        rest = [shape_of(i) for j, i in enumerate(ins) if j != k] + ([shape_of(src)] if src is not None else [])
        if rest and full_shape(rest) == full:
            return k, src, fill
    return None


def broadcast_supported(node, ctx):
    found = _foldable(node)
    return NO_MATCH if found is None else Match(k=found[0], src=found[1], fill=found[2])


def _constant_input(text, k, value) -> str:
    """Program `text` with input k replaced by the constant `value` (inputs after k shift down)."""
    prog = parse(text)
    n = prog.n
    remap = {i: i - (i > k) for i in range(n)}
    remap[k] = n - 1  # the constant takes the last input id; op ids stay where they were
    ops = (("const", (), (value,)),) + tuple((o, tuple(remap.get(a, a) for a in args), p) for o, args, p in prog.ops)
    return Program(n - 1, ops, tuple((remap.get(v, v), dt) for v, dt in prog.out)).text()


@rule(Stage.CONSUMER, FE, family="layout", supported=broadcast_supported, name="layout_broadcast",
      doc="an expand / repeat of size-1 dims read by a generated elementwise kernel becomes broadcast indexing; "
          "a fill becomes a constant of its program")
def fold_into_elementwise(node, ctx, m):
    k, src, fill = m.k, m.src, m.fill
    ins = list(arg(node, "inputs"))
    b = ins[k]
    if src is not None:
        ins[k] = src
        set_args(node, inputs=ins)
        ctx.count("layout_broadcast_folded")
    else:
        set_args(node, inputs=ins[:k] + ins[k + 1:], program=_constant_input(arg(node, "program"), k, fill))
        ctx.count("layout_fill_folded")
    if not b.users:
        ctx.absorb(node, [b])  # the report attributes the expand (lowered or a view) to this kernel
        ctx.gm.graph.erase_node(b)
    return node


# --- an expand or unfold only PyTorch ops read stays a view --------------------------------------------

COPYING_READERS = {aten.reshape.default, aten.view.default, aten._unsafe_view.default, aten.flatten.using_ints,
                   aten.clone.default, aten.contiguous.default}


def _reads_in_place(user) -> bool:
    """Whether `user` reads an expanded view through its strides (no copy of it first)."""
    if user.op != "call_function":
        return user.op == "output"
    t = user.target
    return not (getattr(t, "namespace", "") == "flydsl" or t in COPYING_READERS)


def view_supported(node, ctx):
    s = json.loads(arg(node, "spec"))
    if s["op"] not in ("expand", "expand_as", "unfold") or not all(_reads_in_place(u) for u in node.users):
        return NO_MATCH
    return None


@rule(Stage.CONSUMER, LAYOUT, family="layout", supported=view_supported, name="layout_view",
      doc="an expand or unfold read only by PyTorch ops that take strides stays a view (no copy, no launch)")
def keep_view(node, ctx):
    s = json.loads(arg(node, "spec"))
    x = arg(node, "inputs")[0]
    if s["op"] == "expand":
        new = ctx.insert(aten.expand.default, x, s["size"], before=node)
    elif s["op"] == "expand_as":
        new = ctx.insert(aten.expand_as.default, x, arg(node, "inputs")[1], before=node)
    else:
        new = ctx.insert(aten.unfold.default, x, s["dim"], s["size"], s["step"], before=node)
    new.meta["orig_name"] = node.meta["flydsl"]["sources"][0]
    node.replace_all_uses_with(new)
    ctx.gm.graph.erase_node(node)
    ctx.count(f"layout_{s['op']}_kept_as_view")
    return new


def copy_supported(node, ctx):
    x = arg(node, "self")
    fmt = arg(node, "memory_format")
    if not (isinstance(x, torch.fx.Node) and x.target is LAYOUT and len(x.users) == 1):
        return NO_MATCH
    return None if fmt in (None, torch.contiguous_format, torch.preserve_format) else NO_MATCH


@rule(Stage.CONSUMER, aten.clone.default, aten.contiguous.default, family="layout", supported=copy_supported,
      name="layout_copy", doc="a clone / contiguous of a layout kernel's fresh output is that output")
def drop_copy(node, ctx):
    x = arg(node, "self")
    ctx.absorb(x, [node])
    node.replace_all_uses_with(x)
    ctx.gm.graph.erase_node(node)
    ctx.count("layout_copy_absorbed")
    return x
