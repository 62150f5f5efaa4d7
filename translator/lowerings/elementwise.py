"""Fused elementwise family: `flydsl.fused_elementwise(inputs, program) -> outputs`.

One node runs a whole region of elementwise aten ops (found by translator.passes.partition from
the region rule at the bottom)
as one generated FlyDSL kernel (translator_kernels.codegen.elementwise). The region's expression DAG
is carried as the node's `program` string (JSON; see translator_kernels.program),
so the node is an ordinary custom op: traceable, printable, cacheable by its text.

Forms matched (where they appear): the activation / scale / residual / mask chains between
the big ops. ``x * torch.sigmoid(x)`` and ``F.silu`` in Llama MLPs, ``0.5 * x * (1 + tanh(...))``
written out in GPT-2 code, ``h * scale + bias`` / ``torch.where(mask, x, -inf)``, residual
adds and dtype casts around norms, eval dropout. Each table entry below maps one aten op to
program ops (a one-argument op of translator_kernels.program.OPS named like its aten op maps
itself: adding such an op to the program's table is all it takes); `ELEMENTWISE` lists what a
region may contain.

Semantics: float math is fp32 (bool for comparisons); a value is rounded to bf16 / fp16 only
where the graph casts explicitly, and outputs are stored in each node's own dtype (torch's type
promotion, read from the captured metadata). int32 / int64 math is exact in the program's integer
kinds (the mask and position arithmetic HF models write: `(mask.cumsum(-1) - 1)`, `ids != pad`,
T5's relative-position buckets). A Python int scalar next to an integer tensor becomes an exact
`const_int` of the dtype torch computes in; a float scalar stays a float constant (torch compares
and promotes against it in float). An op that would compute an integer result through fp32 math
(relu, pow, sign ... on int tensors) stays in PyTorch: exact only below 2**24.
"""

from __future__ import annotations


import torch

from ..graph import aten, arg, operand, val
from ..registry import OpFamily, RegionRule, register_family, register_region
from ..runtime.ops import dispatch

from translator_kernels.codegen.order import output_order, restore_order  # noqa: E402
from translator_kernels.program import DTYPES, OPS, TORCH, Program, parse, ref_program  # noqa: E402


@torch.library.custom_op("flydsl::fused_elementwise", mutates_args=())
def fused_elementwise(inputs: list[torch.Tensor], program: str) -> list[torch.Tensor]:
    return dispatch("fused_elementwise", inputs, program)


@fused_elementwise.register_fake
def _(inputs, program):
    prog = parse(program)
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    order = output_order(inputs, shape)  # eager's layout (stride contract): the kernel writes it
    if order is None:
        return [inputs[0].new_empty(shape, dtype=TORCH[dt]) for _, dt in prog.out]
    return restore_order([inputs[0].new_empty([shape[d] for d in order], dtype=TORCH[dt]) for _, dt in prog.out], order)


def ref_fused_elementwise(inputs, program):
    """The program interpreted with the op table's torch references (fp32 math), its outputs laid
    out as the kernel's (eager's pointwise layout)."""
    outs = ref_program(inputs, program)
    order = output_order(inputs, tuple(outs[0].shape)) if outs else None
    if order is None:
        return outs
    return restore_order([o.permute(order).contiguous() for o in outs], order)


def kernel_fused_elementwise(inputs, program):
    from translator_kernels.codegen.elementwise import fused_elementwise as run

    return run(inputs, program)


def _sample(dt):
    prog = Program(2, (("mul", (0, 1), ()), ("gelu", (2,), ())), ((3, DTYPES[dt]),))
    return ([torch.randn(4, 33).to(dt), torch.randn(33).to(dt)], prog.text())


register_family(OpFamily(
    name="fused_elementwise",
    description="a fused region of elementwise ops as one generated kernel (fp32 math)",
    reference=ref_fused_elementwise, kernel=kernel_fused_elementwise,
    kernel_entry="translator_kernels.codegen.elementwise:fused_elementwise", sample_inputs=_sample,
    tolerance_overrides={torch.float32: (1e-5, 1e-5, "exp / log / erf / tanh are 1-2 ulp sequences, "
                                         "not correctly rounded; chains compound it")},
))


# --- aten op -> program ops ------------------------------------------------------------------

def _alpha(b, node, x, y, name):
    a = arg(node, "alpha", 1)
    if a != 1:
        y = b.op("mul", [y, b.arg(a)])
    return b.op(name, [x, y])


def _unary(name):
    return lambda b, n: b.op(name, [b.arg(operand(n))])


def _binary(name):
    return lambda b, n: b.op(name, [b.arg(arg(n, "self")), b.arg(arg(n, "other"))])


def _gelu(b, n):
    return b.op("gelu_tanh" if arg(n, "approximate", "none") == "tanh" else "gelu", [b.arg(operand(n))])


def _clamp(b, n, lo=None, hi=None):
    if b.int_dtype is None:
        return b.op("clamp", [b.arg(operand(n))], [lo, hi])
    x = b.arg(operand(n))  # an integer clamp: exact max / min against integer constants
    if lo is not None:
        x = b.op("maximum", [x, b.arg(lo)])
    if hi is not None:
        x = b.op("minimum", [x, b.arg(hi)])
    return x


def _clamp_tensor(b, n, lo=None, hi=None):
    y = b.arg(operand(n))
    y = y if lo is None else b.op("maximum", [y, b.arg(lo)])  # NaN bounds propagate, as clamp's do
    return y if hi is None else b.op("minimum", [y, b.arg(hi)])


def _div(b, n):
    mode = arg(n, "rounding_mode")
    name = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}[mode]
    return b.op(name, [b.arg(arg(n, "self")), b.arg(arg(n, "other"))])


def _cast(b, n):
    if is_identity(n):
        return b.arg(operand(n))
    return b.op("cast", [b.arg(operand(n))], [DTYPES[val(n).dtype]])


def _where(b, n):
    return b.op("where", [b.arg(arg(n, "condition")), b.arg(arg(n, "self")), b.arg(arg(n, "other"))])


def _masked_fill(b, n):
    return b.op("where", [b.arg(arg(n, "mask")), b.arg(arg(n, "value")), b.arg(arg(n, "self"))])


def _identity(b, n):
    return b.arg(operand(n))


IDENTITY = {aten.dropout.default, aten.clone.default, aten.alias.default}


def is_identity(n) -> bool:
    """Ops that compute nothing: eval dropout, clone, a cast to the dtype the value has."""
    if n.target in IDENTITY:
        return True
    return n.target in (aten._to_copy.default, aten.to.dtype, aten.type_as.default) and \
        val(n).dtype == val(operand(n)).dtype


SELU = (1.6732632423543772, 1.0507009873554805)

TABLE = {
    aten.add.Tensor: lambda b, n: _alpha(b, n, b.arg(arg(n, "self")), b.arg(arg(n, "other")), "add"),
    aten.add.Scalar: lambda b, n: _alpha(b, n, b.arg(arg(n, "self")), b.arg(arg(n, "other")), "add"),
    aten.sub.Tensor: lambda b, n: _alpha(b, n, b.arg(arg(n, "self")), b.arg(arg(n, "other")), "sub"),
    aten.sub.Scalar: lambda b, n: _alpha(b, n, b.arg(arg(n, "self")), b.arg(arg(n, "other")), "sub"),
    aten.rsub.Scalar: lambda b, n: _alpha(b, n, b.arg(arg(n, "other")), b.arg(arg(n, "self")), "sub"),
    aten.rsub.Tensor: lambda b, n: _alpha(b, n, b.arg(arg(n, "other")), b.arg(arg(n, "self")), "sub"),
    aten.mul.Tensor: _binary("mul"), aten.mul.Scalar: _binary("mul"),
    aten.div.Tensor: _div, aten.div.Scalar: _div, aten.div.Tensor_mode: _div,
    aten.maximum.default: _binary("maximum"), aten.minimum.default: _binary("minimum"),
    aten.where.self: _where, aten.where.ScalarOther: _where, aten.where.ScalarSelf: _where, aten.where.Scalar: _where,
    aten.min.other: _binary("minimum"), aten.max.other: _binary("maximum"),
    aten.floor_divide.default: _binary("div_floor"),
    aten.remainder.Tensor: _binary("remainder"), aten.remainder.Scalar: _binary("remainder"),
    aten.pow.Tensor_Scalar: lambda b, n: b.op("pow_scalar", [b.arg(operand(n))], [float(arg(n, "exponent"))]),
    aten.clamp.default: lambda b, n: _clamp(b, n, arg(n, "min"), arg(n, "max")),
    aten.clamp_min.default: lambda b, n: _clamp(b, n, lo=arg(n, "min")),
    aten.clamp_max.default: lambda b, n: _clamp(b, n, hi=arg(n, "max")),
    aten.clamp.Tensor: lambda b, n: _clamp_tensor(b, n, arg(n, "min"), arg(n, "max")),
    aten.clamp_min.Tensor: lambda b, n: _clamp_tensor(b, n, lo=arg(n, "min")),
    aten.clamp_max.Tensor: lambda b, n: _clamp_tensor(b, n, hi=arg(n, "max")),
    aten.masked_fill.Scalar: _masked_fill, aten.masked_fill.Tensor: _masked_fill,
    aten.hardtanh.default: lambda b, n: _clamp(b, n, arg(n, "min_val", -1.0), arg(n, "max_val", 1.0)),
    aten.relu6.default: lambda b, n: _clamp(b, n, 0.0, 6.0),
    aten.gelu.default: _gelu,
    aten.leaky_relu.default: lambda b, n: b.op("leaky_relu", [b.arg(operand(n))],
                                               [float(arg(n, "negative_slope", 0.01))]),
    aten.elu.default: lambda b, n: b.op("elu", [b.arg(operand(n))], [float(arg(n, "alpha", 1.0)),
                                                                       float(arg(n, "scale", 1.0)),
                                                                       float(arg(n, "input_scale", 1.0))]),
    aten.selu.default: lambda b, n: b.op("elu", [b.arg(operand(n))], [SELU[0], SELU[1], 1.0]),
    aten.celu.default: lambda b, n: b.op("celu", [b.arg(operand(n))], [float(arg(n, "alpha", 1.0))]),
    aten.softplus.default: lambda b, n: b.op("softplus", [b.arg(operand(n))], [float(arg(n, "beta", 1.0)),
                                                                               float(arg(n, "threshold", 20.0))]),
    aten._to_copy.default: _cast, aten.to.dtype: _cast, aten.type_as.default: _cast,
    aten.dropout.default: _identity, aten.clone.default: _identity, aten.alias.default: _identity,
}
for _name, _op in OPS.items():  # every one-argument op of the program's table named like its aten op
    if _op.arity == 1 and not _op.params and hasattr(aten, _name):
        TABLE.setdefault(getattr(aten, _name).default, _unary(_name))
for _name in ("relu_", "sigmoid_", "tanh_", "silu_", "hardtanh_"):  # in-place forms (nn.ReLU(inplace=True))
    TABLE[getattr(aten, _name).default] = _unary(_name[:-1])
TABLE[aten.hardtanh_.default] = TABLE[aten.hardtanh.default]
for _name in ("add_", "sub_", "mul_", "div_"):  # `y = a * b; y.add_(c)` on a temporary (state: inplace.py)
    for _ov in ("Tensor", "Scalar"):
        TABLE[getattr(getattr(aten, _name), _ov)] = TABLE[getattr(getattr(aten, _name[:-1]), _ov)]
# issue 27 item 5: the small ops new model families write (Qwen3 / OLMoE norms, HF masks, aliases)
TABLE[aten.square.default] = lambda b, n: (lambda x: b.op("mul", [x, x]))(b.arg(operand(n)))
TABLE[aten.multiply.Tensor] = _binary("mul")  # torch.multiply: mul's alias, kept by name in the export
TABLE[aten.multiply.Scalar] = _binary("mul")
TABLE[aten.isnan.default] = lambda b, n: (lambda x: b.op("ne", [x, x]))(b.arg(operand(n)))  # NaN != NaN (une)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    TABLE[getattr(aten, _name).Tensor] = _binary(_name)
    TABLE[getattr(aten, _name).Scalar] = _binary(_name)
for _name in ("logical_and", "logical_or", "logical_xor"):
    TABLE[getattr(aten, _name).default] = _binary(_name)
for _name in ("and", "or", "xor"):  # x & y on int / bool tensors exports as aten.__and__ or aten.bitwise_and
    for _ov in ("Tensor", "Scalar"):
        TABLE[getattr(getattr(aten, f"__{_name}__"), _ov)] = _binary(f"bitwise_{_name}")
        TABLE[getattr(getattr(aten, f"bitwise_{_name}"), _ov)] = _binary(f"bitwise_{_name}")

# what may compute an integer (int32 / int64) result: exact integer math in the program
INT_EXACT = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar, aten.rsub.Tensor,
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor_mode, aten.floor_divide.default, aten.remainder.Tensor,
    aten.remainder.Scalar, aten.maximum.default, aten.minimum.default, aten.min.other, aten.max.other,
    aten.neg.default, aten.abs.default, aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf,
    aten.where.Scalar, aten.bitwise_not.default, aten.clamp.default, aten.clamp_min.default,
    aten.clamp_max.default, aten._to_copy.default, aten.to.dtype, aten.type_as.default,
    aten.dropout.default, aten.clone.default, aten.alias.default, aten.square.default, aten.multiply.Tensor,
    aten.multiply.Scalar, aten.add_.Tensor, aten.add_.Scalar, aten.sub_.Tensor, aten.sub_.Scalar, aten.mul_.Tensor,
    aten.mul_.Scalar,
} | {t for t, f in TABLE.items() if "bitwise" in str(t) or "__" in str(t)})

ELEMENTWISE = frozenset(TABLE)


def node_supported(node) -> str | None:
    """None when `node` may join an elementwise region, else the reason it stays in PyTorch."""
    if node.op != "call_function" or node.target not in TABLE:
        return "not an elementwise op"
    out = val(node)
    if not isinstance(out, torch.Tensor):
        return "output is not a tensor"
    for a in node.all_input_nodes + [node]:
        v = val(a)
        if not isinstance(v, torch.Tensor):
            return f"argument {a.name} has no tensor metadata"
        if v.dtype not in DTYPES:
            return (f"dtype {str(v.dtype).replace('torch.', '')} of {a.name} is not supported "
                    "(fused kernels take float32, bfloat16, float16, bool, int32, int64)")
    if out.dtype in (torch.int32, torch.int64) and node.target not in INT_EXACT:
        return (f"{node.target._opname} with an {str(out.dtype).replace('torch.', '')} result would run in fp32 "
                "(exact only below 2**24); kept in PyTorch")
    if node.target is aten.div.Tensor_mode and out.dtype in (torch.int32, torch.int64) and \
            arg(node, "rounding_mode") is None:
        return "true division with an integer result"
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return "a symbolic scalar argument"
    if node.target._opname.endswith("_") and not node.target._opname.endswith("__"):  # relu_, not __and__
        x = operand(node)
        if x.op != "call_function" or len(x.users) != 1:
            return "in-place op on a value that is read elsewhere (its mutation must stay visible)"
    if node.target is aten.dropout.default and arg(node, "train", False):
        return "dropout in training mode"
    if node.target in (aten._to_copy.default, aten.to.dtype):
        extra = set(node.kwargs) - {"dtype", "memory_format"}
        if extra and any(node.kwargs[k] is not None for k in extra):
            return f"_to_copy with {sorted(extra)} (device / layout changes stay in PyTorch)"
    if node.target is aten.where.self and val(arg(node, "condition")).dtype != torch.bool:
        return "where with a non-bool condition"
    if node.target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor) and val(arg(node, "mask")).dtype != torch.bool:
        return "masked_fill with a non-bool mask"
    if node.target is aten.pow.Tensor_Scalar and not isinstance(arg(node, "exponent"), (int, float)):
        return "pow exponent is not a number"
    return None


def scalar_int_dtype(node):
    """The integer dtype torch computes `node` in when its Python int scalars meet integer tensors
    (its result's, or for a comparison its widest integer tensor argument's), else None: the
    scalars are float constants."""
    out = val(node).dtype
    if out.is_floating_point:
        return None
    if out in (torch.int32, torch.int64):
        return out
    ints = {val(a).dtype for a in node.all_input_nodes} & {torch.int32, torch.int64}
    return torch.int64 if torch.int64 in ints else (torch.int32 if ints else None)


class ProgramBuilder:
    """Collects a region's ops into a Program; nodes outside the region become inputs."""

    def __init__(self, members):
        self.int_dtype = None  # the integer dtype a Python int scalar of the node being added takes
        self.members = set(members)
        self.inputs: list[torch.fx.Node] = []
        self.ops: list[tuple] = []
        self.values: dict = {}  # fx node -> value id

    def _new(self, name, args, params=()) -> int:
        self.ops.append((name, tuple(args), tuple(params)))
        return len(self.ops) - 1  # provisional: op index; renumbered in program()

    def op(self, name, args, params=()):
        return ("op", self._new(name, args, params))

    def const(self, c):
        return self.op("const", [], [float(c)])

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            if a in self.members:
                return self.values[a]
            if a not in self.inputs:
                self.inputs.append(a)
            return ("in", self.inputs.index(a))
        if isinstance(a, (bool, int)) and self.int_dtype is not None:
            return self.op("const_int", [], [int(a), DTYPES[self.int_dtype]])
        if isinstance(a, (bool, int, float)):
            return self.const(a)
        raise ValueError(f"fused_elementwise: unsupported argument {a!r}")

    def add(self, node):
        self.int_dtype = scalar_int_dtype(node)
        self.values[node] = TABLE[node.target](self, node)

    def program(self, outputs) -> Program:
        n = len(self.inputs)

        def vid(ref):
            return ref[1] if ref[0] == "in" else n + ref[1]

        ops = tuple((name, tuple(vid(a) for a in args), params) for name, args, params in self.ops)
        out = tuple((vid(self.values[o]), DTYPES[val(o).dtype]) for o in outputs)
        return Program(n, ops, out)


def lower_region(ctx, members, outputs, anchor) -> torch.fx.Node:
    """Replace `members` (graph order) by one fused node; `outputs` are used outside the region."""
    b = ProgramBuilder(members)
    for m in members:
        b.add(m)
    prog = b.program(outputs)
    fused, gets = ctx.emit("fused_elementwise", (list(b.inputs), prog.text()), lowering="fused_elementwise",
                           sources=members, anchor=outputs[-1], after=anchor)
    for o, gi in zip(outputs, gets):
        gi.meta["replaces"] = o.meta.get("orig_name", o.name)  # verification compares it with o's value
        o.replace_all_uses_with(gi)
    ctx.erase_unused(members)
    ctx.count("fused_elementwise_ops", len(members))
    return fused


register_region(RegionRule("fused_elementwise", "fused_elementwise", frozenset(TABLE), node_supported, lower_region,
                           is_identity, doc="chains of elementwise ops -> one generated kernel"))
