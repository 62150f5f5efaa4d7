"""In-place elementwise writes of state as one generated kernel: `flydsl.elementwise_(dst, inputs, program)`.

Forms matched (where they appear):
- ``self.cumulative_length.add_(kv_length)``: HF's StaticCache layer counter, a 0-d int64 buffer
  bumped by the step's sequence length (a symbolic size) in every layer's `update`; in the graph of
  `translate_for_generation` two per step on tiny Llama, which stayed in PyTorch before;
- ``self.n.add_(1)``, ``self.steps.sub_(1)``: step counters on a buffer;
- ``self.running.mul_(m).add_(x, alpha=1 - m)``: running statistics, an EMA of an activation;
- ``buf.fill_(v)`` / ``buf.zero_()``: a reset of state, and ``buf.copy_(x)`` where `x` has another
  dtype (a write with a cast; a same-dtype copy is the scatter kernel's, cache_write.py).

The destination is written where it lies: the state contract (docs/state.md) says a buffer the
graph writes has one storage (the user's under torch.compile, the translated module's one copy under
translate()). So the node names `dst` as mutated (``Tensor(a!)``: kept by dead-code removal, seen by
the storage analysis of translator/aliases.py, so no pass moves a read of that storage across it),
returns nothing, and the in-place op's readers read `dst` itself, as cache_write.py does. The kernel
is the generated elementwise kernel (translator_kernels/codegen/inplace.py) with `dst` as its first
input and its output: ``dst = program(dst, *inputs)``, one launch, no allocation, no copy back.

The program is the one the fused elementwise family builds for the functional op (elementwise.py's
table): ``add_`` is ``add`` with `dst` as input 0, the result stored in `dst`'s dtype (torch's
in-place rule: computed in the promoted type, cast back). A symbolic scalar (HF's `kv_length` is
`sym_size(input_ids, 1)`) becomes a 0-d tensor made from the size, ``aten.scalar_tensor``, which
reads nothing but a shape: fold_shapes computes it once per input shape and caches it, so a decode
step passes the cached tensor (no host-to-device copy per call) and the kernel reads the value on the
device.

Where it applies: `dst` is state or any tensor read after the write (its root through views is a
graph input, a buffer or a lifted constant, or a value with other readers). An in-place op on a
temporary that only it reads (``y = a * b; y.add_(c)``) is left to the elementwise regions, which
fuse it with its neighbours (elementwise.py's table has the in-place forms).

Not taken, with the reason the report shows: a strided view of state (the kernel writes `dst` in its
flat order), a dtype the generated kernels do not take (float64, complex, int8 ...), integer results
through float math (int64 state ``mul_`` by a float: torch refuses it anyway), a symbolic bool.

Not folded into a neighbouring launch: HF's counter update follows the K / V cache write, which rides
in the RoPE launch (rope_cache.py), and its value is ``positions[-1] + 1`` of the positions that
launch reads; storing it from there would need the rope kernel to take one more state tensor and a
proof that the positions are ``arange(S) + counter``. It is one tiny launch per counter (one
workgroup, one element) instead.
"""

from __future__ import annotations

import torch

from translator_kernels.program import DTYPES, Program, ref_program

from ..aliases import _returns_alias
from ..graph import arg, set_args, val
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch
from . import elementwise as ew

aten = torch.ops.aten


@torch.library.custom_op("flydsl::elementwise_", mutates_args=("dst",))
def elementwise_(dst: torch.Tensor, inputs: list[torch.Tensor], program: str) -> None:
    dispatch("elementwise_", dst, inputs, program)


@elementwise_.register_fake
def _(dst, inputs, program):
    return None


def ref_elementwise_(dst, inputs, program):
    """`dst` = program(dst, *inputs) in plain torch (the op table's references, fp32 math), in place."""
    dst.copy_(ref_program([dst, *inputs], program)[0])
    return None


def kernel_elementwise_(dst, inputs, program):
    from translator_kernels.codegen.inplace import elementwise_into

    return elementwise_into(dst, inputs, program)


def _sample(dt):
    prog = Program(3, (("mul", (0, 1), ()), ("add", (3, 2), ())), ((4, DTYPES[dt]),))  # dst * m + x
    return (torch.randn(4, 33).to(dt), [torch.tensor(0.9).to(dt), torch.randn(33).to(dt)], prog.text())


register_family(OpFamily(
    name="elementwise_", description="an in-place elementwise write of state (a counter, running statistics, a "
                                     "fill) stored into the tensor by one generated kernel",
    reference=ref_elementwise_, kernel=kernel_elementwise_,
    kernel_entry="translator_kernels.codegen.inplace:elementwise_into", sample_inputs=_sample,
))


# --- the in-place forms and the functional op whose program each one is --------------------------

FUNCTIONAL = {
    aten.add_.Tensor: aten.add.Tensor, aten.add_.Scalar: aten.add.Scalar,
    aten.sub_.Tensor: aten.sub.Tensor, aten.sub_.Scalar: aten.sub.Scalar,
    aten.mul_.Tensor: aten.mul.Tensor, aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor, aten.div_.Scalar: aten.div.Scalar,
    aten.clamp_.default: aten.clamp.default, aten.clamp_min_.default: aten.clamp_min.default,
    aten.clamp_max_.default: aten.clamp_max.default,
}
FILLS = (aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default)


def _dt(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _root(n):
    """The node whose storage `n` views (through slice, select, view, `to` of the same dtype ...)."""
    while isinstance(n, torch.fx.Node) and n.op == "call_function" and _returns_alias(n):
        nxt = next((a for a in n.all_input_nodes if isinstance(val(a), torch.Tensor)), None)
        if nxt is None:
            break
        n = nxt
    return n


def _operands(node) -> dict:
    """The op's arguments other than `self` that the program reads, by schema name (tensors, numbers,
    symbolic sizes)."""
    if node.target is aten.zero_.default:
        return {}
    names = [a.name for a in node.target._schema.arguments if a.name != "self"]
    return {k: arg(node, k, None) for k in names}


def inplace_supported(node, ctx):
    dst = arg(node, "self")
    d = val(dst)
    if not isinstance(dst, torch.fx.Node) or not isinstance(d, torch.Tensor):
        return NO_MATCH
    root = _root(dst)
    temp = root is dst and dst.op == "call_function" and len(dst.users) == 1
    if temp and node.target in ew.TABLE:  # a temporary only this op reads: the elementwise regions fuse it
        return NO_MATCH
    if d.dtype not in DTYPES:
        return (f"in-place {node.target._opname} on {_dt(d)} state: the generated kernels take float32, bfloat16, "
                "float16, bool, int32 and int64")
    if not d.is_contiguous():
        return (f"in-place {node.target._opname} on a strided view of state (strides {tuple(d.stride())}): the "
                "in-place kernel writes its destination in flat order")
    operands = _operands(node)
    for a in operands.values():
        v = val(a) if isinstance(a, torch.fx.Node) else a
        if isinstance(v, torch.SymBool) or isinstance(a, torch.SymBool):
            return f"in-place {node.target._opname} with a symbolic bool operand"
        if isinstance(v, torch.Tensor):
            if v.dtype not in DTYPES:
                return f"in-place {node.target._opname} with a {_dt(v)} operand (not a dtype of the generated kernels)"
            if v.device != d.device:
                return f"in-place {node.target._opname} with an operand on {v.device}, state on {d.device}"
        elif a is not None and not isinstance(v, (bool, int, float, torch.SymInt, torch.SymFloat)):
            return f"in-place {node.target._opname} with a {type(v).__name__} operand"
    if node.target in FUNCTIONAL and d.dtype in (torch.int32, torch.int64) and FUNCTIONAL[node.target] not in ew.INT_EXACT:
        return f"in-place {node.target._opname} on {_dt(d)} state would compute through fp32 (exact only below 2**24)"
    return Match(dst=dst, operands=operands)


def _symbolic_as_tensors(ctx, node, dst, operands) -> None:
    """Each symbolic size operand of `node` replaced by a 0-d tensor of it (folded per input shape by
    fold_shapes: the kernel reads the size on the device, no host copy per call)."""
    for name, a in operands.items():
        v = val(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(a, torch.fx.Node) and not isinstance(v, torch.Tensor):
            dtype = torch.int64 if isinstance(v, (int, torch.SymInt)) else torch.float32
            set_args(node, **{name: ctx.insert(aten.scalar_tensor.default, a, before=node, dtype=dtype,
                                               device=val(dst).device)})


def _program(node, dst):
    """(program over [dst, *tensor operands], the tensor operands) computing the value `node` stores."""
    out_dt = DTYPES[val(dst).dtype]
    if node.target in FUNCTIONAL:  # the functional op's table entry: it reads the arguments by schema name
        b = ew.ProgramBuilder([node])
        b.arg(dst)  # input 0: the destination
        b.int_dtype = ew.scalar_int_dtype(node)
        b.values[node] = ew.TABLE[FUNCTIONAL[node.target]](b, node)
        return b.program([node]), b.inputs[1:]
    a = 0 if node.target is aten.zero_.default else arg(node, "src" if node.target is aten.copy_.default else "value")
    if isinstance(a, torch.fx.Node):  # fill_.Tensor (a 0-d value), copy_ (a cast), a folded symbolic size
        return Program(2, (("cast", (1,), (out_dt,)),), ((2, out_dt),)), [a]
    if out_dt in ("i32", "i64") and isinstance(a, (bool, int)):
        op = ("const_int", (), (int(a), out_dt))
    else:
        op = ("const", (), (float(a),))
    return Program(1, (op, ("cast", (1,), (out_dt,))), ((2, out_dt),)), []


@rule(Stage.CANONICAL, *FUNCTIONAL, *FILLS, aten.copy_.default, family="elementwise_", supported=inplace_supported,
      priority=-1, doc="buf.add_(x) / n.add_(1) / buf.mul_(m) / buf.fill_(v) / a copy_ with a cast, on state: one "
                       "kernel writing the tensor in place")
def lower_inplace(node, ctx, m):
    dst = m.dst
    _symbolic_as_tensors(ctx, node, dst, m.operands)
    prog, tensors = _program(node, dst)
    ctx.emit("elementwise_", (dst, list(tensors), prog.text()), lowering=f"inplace_{node.target._opname}",
             sources=[node], anchor=node, before=node)
    node.replace_all_uses_with(dst)
    ctx.graph.erase_node(node)
    return dst
