"""The one per-element program and op table of the kernel library, and the elementwise launch geometry.

A `Program` is a small SSA list: values 0..n_inputs-1 are the inputs, op i defines value
n_inputs + i. An op is (name, argument value ids, constant parameters). Outputs name a value
and the dtype it is stored in. Every value has a kind: "f" (fp32: all float math is fp32, a
`cast` op rounds to bf16 / f16 where the graph had an explicit `.to()`), "b" (bool), "i" (int32)
or "l" (int64). Integer math is exact in its own width, never routed through fp32. An op's row
says what kind each argument takes: a fixed kind ("f", "b"), "n" (numeric: the arguments are
promoted as torch promotes tensors, bool < int32 < int64 < float, and the op runs in that kind:
`add` of two int64 values is an int64 add), "z" (integer or bool: bitwise ops) or "a" (any, taken
as it is: `cast`). An argument of another kind is converted first (float -> int truncates toward
zero, as torch's `.to()`). Its canonical JSON text is what a graph node carries and what caches
key on:

    {"n": 2, "ops": [["mul", [0, 1], []], ["gelu", [2], []]], "out": [[3, "bf16"]]}

Every kernel that computes per element speaks this one language: the generated elementwise
kernels (the whole kernel), reductions and scans (their prologue, and a reduction's epilogue),
and the GEMM epilogue (a one-input program run on the accumulators after scale and bias;
`chain("gelu;clamp(-1.0,1.0)")` is a shorthand spelling of one). `OPS` is the one op table:
per op its arity and argument kinds, constants, torch reference and device function. The
generated kernels write a call of the device function per op (codegen/source.py), the GEMM
makes the same calls while it traces (device_math.run), the references evaluate the same rows
(`evaluate`, `ref_program`), and translator.lowerings.elementwise maps aten ops onto them. A new
one-argument op is one row here plus one function in device_math (docs/adding-an-op.md).

`geometry()` turns the inputs' shapes into the elementwise kernel's index math: the broadcast
output shape is coalesced (adjacent dims merge while every input is broadcast on both or on
neither), the last coalesced dim is read in vectors of VEC elements (128 bits where its size,
the dtypes and the base addresses allow), and each input is addressed either per vector (its
last dim is the output's) or per element once per vector (its last dim is broadcast: a column
or scalar).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable

import torch

from translator_kernels.arch import DTYPE_NAMES, NAMED_DTYPES
from translator_kernels.errors import KernelInputError

DTYPES, TORCH = DTYPE_NAMES, NAMED_DTYPES  # the one dtype-name map (translator_kernels.arch)
BITS = {"f32": 32, "bf16": 16, "f16": 16, "bool": 8, "i32": 32, "i64": 64}
KIND = {"f32": "f", "bf16": "f", "f16": "f", "bool": "b", "i32": "i", "i64": "l"}  # a stored dtype's value kind
KIND_TORCH = {"f": torch.float32, "b": torch.bool, "i": torch.int32, "l": torch.int64}  # a kind's reference dtype

F = torch.nn.functional


@dataclass(frozen=True)
class Op:
    """One per-element operation, as every kernel, reference and lowering knows it.

    `ref(*args, *params)` is the torch reference on tensors of the kinds the op takes (fp32,
    bool, int32, int64); `device` names the translator_kernels.device_math function called the
    same way on vectors of those kinds while a kernel traces. `takes` has one letter per value
    argument ("f", "b", or the polymorphic "n" / "z" / "a": see the module docstring), `gives`
    the result's kind ("f", "b", or "n": the kind the "n" / "z" arguments were promoted to)."""

    name: str
    ref: Callable
    device: str
    params: int = 0
    takes: str = "f"
    gives: str = "f"
    defaults: tuple = ()  # trailing constants a chain() spelling may leave out: elu(0.5) = elu(0.5, 1.0, 1.0)

    @property
    def arity(self) -> int:
        return len(self.takes)


def _elu(x, alpha, scale, input_scale):
    if input_scale == 1:
        return F.elu(x, alpha) * scale
    return torch.where(x > 0, x * scale, torch.expm1(x * input_scale) * alpha * scale)


def _cast(x, dt):
    return x.to(TORCH[dt]) if KIND[dt] != "f" else x.to(TORCH[dt]).float()


def _int_div(fn):
    """An integer division's reference: `fn` where the divisor is nonzero, 0 where it is 0 (as the
    kernel: torch raises there, the GPU has no trap); float division is `fn` as it is (inf / NaN)."""
    def ref(a, b):
        if a.is_floating_point():
            return fn(a, b)
        zero = b == 0
        return torch.where(zero, torch.zeros_like(a), fn(a, torch.where(zero, torch.ones_like(b), b)))
    return ref


def _table(*rows):
    return {op.name: op for op in rows}


OPS = _table(
    # unary: one row and one device function each
    Op("neg", torch.neg, "neg", takes="n", gives="n"), Op("abs", torch.abs, "absf", takes="n", gives="n"), Op("exp", torch.exp, "exp"),
    Op("exp2", torch.exp2, "exp2"), Op("expm1", torch.expm1, "expm1"), Op("log", torch.log, "log"),
    Op("log2", torch.log2, "log2"), Op("log1p", torch.log1p, "log1p"), Op("sqrt", torch.sqrt, "sqrt"),
    Op("rsqrt", torch.rsqrt, "rsqrt"), Op("reciprocal", torch.reciprocal, "reciprocal"),
    Op("relu", torch.relu, "relu"), Op("sigmoid", torch.sigmoid, "sigmoid"), Op("tanh", torch.tanh, "tanh"),
    Op("erf", torch.erf, "erf"), Op("gelu", F.gelu, "gelu"),
    Op("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh"), Op("silu", F.silu, "silu"),
    Op("mish", F.mish, "mish"), Op("softsign", F.softsign, "softsign"),
    Op("hardsigmoid", F.hardsigmoid, "hardsigmoid"), Op("hardswish", F.hardswish, "hardswish"),
    Op("sign", torch.sign, "sign"), Op("floor", torch.floor, "floor"), Op("ceil", torch.ceil, "ceil"),
    Op("round", torch.round, "round_even"), Op("trunc", torch.trunc, "trunc"), Op("sin", torch.sin, "sin"),
    Op("cos", torch.cos, "cos"), Op("atan", torch.atan, "atan"),
    # unary with compile-time constants
    Op("softplus", F.softplus, "softplus", params=2, defaults=(1.0, 20.0)),  # (beta, threshold)
    Op("elu", _elu, "elu", params=3, defaults=(1.0, 1.0, 1.0)),  # (alpha, scale, input_scale); selu too
    Op("celu", F.celu, "celu", params=1, defaults=(1.0,)),
    Op("leaky_relu", F.leaky_relu, "leaky_relu", params=1, defaults=(0.01,)),
    Op("pow_scalar", torch.pow, "pow_scalar", params=1),
    Op("clamp", torch.clamp, "clamp", params=2),  # (min or None, max or None)
    # ("f32" | "bf16" | "f16" | "bool" | "i32" | "i64"): an explicit .to() in the graph
    Op("cast", _cast, "cast", params=1, takes="a"),
    Op("const", None, "splat", params=1, takes=""),  # a float scalar constant, splat to the vector width
    Op("const_int", None, "splat_int", params=2, takes=""),  # (value, "i32" | "i64"): an exact integer constant
    # binary ("n": int32 / int64 math where both sides are integers, else fp32)
    Op("add", torch.add, "add", takes="nn", gives="n"), Op("sub", torch.sub, "sub", takes="nn", gives="n"),
    Op("mul", torch.mul, "mul", takes="nn", gives="n"), Op("div", torch.div, "div", takes="ff"),
    # integer division rounds as torch does: trunc toward zero, floor toward -inf (the sign of the
    # divisor), remainder takes the divisor's sign; an integer division by zero gives 0 (torch raises)
    Op("div_trunc", _int_div(lambda a, b: torch.div(a, b, rounding_mode="trunc")), "div_trunc", takes="nn",
       gives="n"),
    Op("div_floor", _int_div(lambda a, b: torch.div(a, b, rounding_mode="floor")), "div_floor", takes="nn",
       gives="n"),
    Op("remainder", _int_div(torch.remainder), "remainder", takes="nn", gives="n"),
    Op("maximum", torch.maximum, "maximum", takes="nn", gives="n"),
    Op("minimum", torch.minimum, "minimum", takes="nn", gives="n"),
    Op("bitwise_and", torch.bitwise_and, "bitwise_and", takes="zz", gives="n"),
    Op("bitwise_or", torch.bitwise_or, "bitwise_or", takes="zz", gives="n"),
    Op("bitwise_xor", torch.bitwise_xor, "bitwise_xor", takes="zz", gives="n"),
    Op("bitwise_not", torch.bitwise_not, "bitwise_not", takes="z", gives="n"),
    # comparisons and logic (bool results)
    Op("eq", torch.eq, "eq", takes="nn", gives="b"), Op("ne", torch.ne, "ne", takes="nn", gives="b"),
    Op("lt", torch.lt, "lt", takes="nn", gives="b"), Op("le", torch.le, "le", takes="nn", gives="b"),
    Op("gt", torch.gt, "gt", takes="nn", gives="b"), Op("ge", torch.ge, "ge", takes="nn", gives="b"),
    Op("logical_and", torch.logical_and, "logical_and", takes="bb", gives="b"),
    Op("logical_or", torch.logical_or, "logical_or", takes="bb", gives="b"),
    Op("logical_xor", torch.logical_xor, "logical_xor", takes="bb", gives="b"),
    Op("logical_not", torch.logical_not, "logical_not", takes="b", gives="b"),
    Op("where", torch.where, "where", takes="bnn", gives="n"),
)


def promote(kinds) -> str:
    """The kind torch computes a polymorphic op of arguments of `kinds` in: float if any is float,
    else the widest integer; all-bool arguments compute as float (their result stored as bool)."""
    for k in "fli":
        if k in kinds:
            return k
    return "f"


def signature(name: str, params, arg_kinds) -> tuple[list, str]:
    """(the kind each argument is converted to, the result's kind) for op `name` on arguments of
    `arg_kinds`: the one typing rule the references, the generated sources and the GEMM epilogue share."""
    op = OPS[name]
    if name == "cast":
        return list(arg_kinds), KIND[params[0]]
    if name == "const_int":
        return [], KIND[params[1]]
    poly = [k for k, t in zip(arg_kinds, op.takes) if t in "nz"]
    p = promote(poly)
    if "z" in op.takes:
        if p == "f" and "f" in poly:
            raise KernelInputError(f"per-element program: {name} takes integer or bool values, got kinds {poly} "
                                   "(f: float); bitwise ops on float tensors are not defined")
        p = p if "f" in poly or any(k in "il" for k in poly) else "b"
    wants = [p if t in "nz" else (k if t == "a" else t) for k, t in zip(arg_kinds, op.takes)]
    return wants, (p if op.gives == "n" else op.gives)


def _canon(p):
    return float(p) if isinstance(p, int) and not isinstance(p, bool) else p


@dataclass(frozen=True)
class Program:
    n: int
    ops: tuple  # ((name, (arg ids...), (params...)), ...)
    out: tuple  # ((value id, dtype str), ...)

    def text(self) -> str:
        """The canonical JSON text (integer constants written as floats: clamp(0, 1) == clamp(0.0, 1.0))."""
        return json.dumps({"n": self.n, "ops": [[o, list(a), list(p) if o == "const_int" else [_canon(x) for x in p]]
                                                for o, a, p in self.ops],
                           "out": [list(x) for x in self.out]}, separators=(",", ":"))

    def kinds(self, in_dtypes) -> list[str]:
        """The kind ("f", "b", "i", "l") of every value, given the inputs' stored dtypes."""
        kinds = [KIND[d] for d in in_dtypes]
        for o, a, p in self.ops:
            kinds.append(signature(o, p, [kinds[i] for i in a])[1])
        return kinds


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Program:
    """Program of a JSON text; raises KernelInputError naming what is wrong."""
    try:
        d = json.loads(text)
        ops = tuple((o, tuple(a), tuple(p)) for o, a, p in d["ops"])
        prog = Program(int(d["n"]), ops, tuple((int(v), str(dt)) for v, dt in d["out"]))
    except (TypeError, ValueError, KeyError) as e:
        raise KernelInputError(f"per-element program: {text!r} is not a program ({e}); expected JSON "
                               '{"n": inputs, "ops": [[name, [args], [params]], ...], "out": [[id, dtype]]}') from None
    for i, (name, args, params) in enumerate(ops):
        if name not in OPS:
            raise KernelInputError(f"per-element program: unknown op {name!r} in program {text}; "
                                   f"known ops: {', '.join(sorted(OPS))}")
        op = OPS[name]
        if len(args) != op.arity or len(params) != op.params:
            raise KernelInputError(f"per-element program: op {i} ({name}) takes {op.arity} value(s) and "
                                   f"{op.params} constant(s), got {list(args)} {list(params)} in {text}")
        if any(not 0 <= a < prog.n + i for a in args):
            raise KernelInputError(f"per-element program: op {i} ({name}) reads a value not yet defined: {text}")
        if name == "const_int" and (not isinstance(params[0], int) or isinstance(params[0], bool)
                                    or params[1] not in ("i32", "i64")):
            raise KernelInputError(f"per-element program: op {i} (const_int) takes an integer and 'i32' or 'i64', "
                                   f"got {list(params)} in {text}")
        if name == "cast" and params[0] not in BITS:
            raise KernelInputError(f"per-element program: op {i} casts to {params[0]!r}; dtypes: {sorted(BITS)}")
    for v, dt in prog.out:
        if not 0 <= v < prog.n + len(ops) or dt not in BITS:
            raise KernelInputError(f"per-element program: bad output ({v}, {dt!r}) in {text}")
    return prog


def integer_accumulation(op: str, prog: Program, in_dtypes) -> None:
    """Raise if `prog` (a reduction's or scan's prologue) hands integer values to the accumulation:
    torch accumulates integers in int64, the kernels in fp32. Integer inputs are fine when the program
    casts them to a float dtype (`(ids * 2).float().sum(-1)`)."""
    v = prog.out[0][0]
    kind = prog.kinds(in_dtypes)[v]
    if kind in "il":
        raise KernelInputError(f"{op}: the program hands {'int64' if kind == 'l' else 'int32'} values to the "
                               "accumulation; integer reductions and scans are not supported (torch accumulates "
                               "integers in int64): keep them in PyTorch, or cast to a float dtype in the program")

def broadcast_inputs(op: str, prog: Program, inputs, note: str = "") -> tuple:
    """The checks a generated row kernel (reduce, scan) makes of its inputs: each a tensor of a
    supported dtype, all on one device, integer accumulation allowed, shapes that broadcast.
    Returns the broadcast shape; `note` ends the unsupported-dtype message."""
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise KernelInputError(f"{op}: input {i} ({what}) is not supported; use float32, bfloat16, float16, "
                                   f"bool, int32 or int64{note}")
        if t.device != inputs[0].device:
            raise KernelInputError(f"{op}: input {i} is on {t.device}, input 0 on {inputs[0].device}; "
                                   "move them to one device")
    integer_accumulation(op, prog, [DTYPES[t.dtype] for t in inputs])
    try:
        return tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))
    except RuntimeError as e:
        raise KernelInputError(f"{op}: input shapes {[tuple(t.shape) for t in inputs]} do not broadcast: {e}") from None



def as_program(program) -> Program:
    return parse(program) if isinstance(program, str) else program


# ---------------------------------------------------------------------------
# the reference: the program interpreted with the table's torch functions
# ---------------------------------------------------------------------------


def evaluate(prog: Program, inputs) -> list:
    """Every value of `prog` on `inputs` in its kind's dtype (fp32, bool, int32, int64): the table's
    torch references, with arguments converted to the kind each op takes, as the kernel does."""
    vals = [t if t.dtype in (torch.bool, torch.int32, torch.int64) else t.float() for t in inputs]
    kinds = [KIND[DTYPES.get(t.dtype, "f32")] for t in inputs]
    dev = inputs[0].device
    for name, args, params in prog.ops:
        wants, k = signature(name, params, [kinds[a] for a in args])
        if name == "const":
            vals.append(torch.tensor(float(params[0]), dtype=torch.float32, device=dev))
        elif name == "const_int":
            vals.append(torch.tensor(params[0], dtype=KIND_TORCH[k], device=dev))
        else:
            xs = [vals[a].to(KIND_TORCH[w]) for a, w in zip(args, wants)]  # float -> int truncates, as torch
            vals.append(OPS[name].ref(*xs, *params).to(KIND_TORCH[k]))
        kinds.append(k)
    return vals


def ref_program(inputs, program) -> list:
    """The program's outputs, broadcast and stored in their dtypes (fresh tensors, never an alias)."""
    prog = as_program(program)
    vals = evaluate(prog, inputs)
    shape = torch.broadcast_shapes(*[t.shape for t in inputs])
    outs = [torch.empty(shape, dtype=TORCH[dt], device=inputs[0].device) for _, dt in prog.out]
    for o, (v, _) in zip(outs, prog.out):
        o.copy_(vals[v])
    return outs


# ---------------------------------------------------------------------------
# one-input chains: the GEMM epilogue's program
# ---------------------------------------------------------------------------

SCALAR_STEPS = {"add": False, "sub": False, "mul": False, "div": False, "rsub": True}  # -> constant first?


def chain(text: str) -> Program:
    """The one-input program spelled as a chain of steps, "gelu;clamp(-1.0,1.0);mul(2.0)": each step
    is a one-argument op of the table with its constants, or add / sub / mul / div / rsub by a scalar
    (rsub(c): c - x). Output dtype f32. A shorthand for callers; nodes carry the program's JSON."""
    ops, cur = [], 0
    for part in text.split(";"):
        part = part.strip()
        name, _, rest = part.partition("(")
        if rest and not rest.endswith(")"):
            raise KernelInputError(f"epilogue: malformed step {part!r} in {text!r}; write name(c1,c2)")
        try:
            params = tuple(None if p.strip() == "None" else float(p) for p in rest[:-1].split(",") if p.strip())
        except ValueError:
            raise KernelInputError(f"epilogue: step {part!r} in {text!r} has a constant that is not a number") from None
        if name in SCALAR_STEPS and len(params) == 1:
            ops.append(("const", (), params))
            c = len(ops)  # value id of the constant (value 0 is the input)
            ops.append(("sub" if name == "rsub" else name, (c, cur) if SCALAR_STEPS[name] else (cur, c), ()))
        elif name in OPS and OPS[name].arity == 1 and name != "cast":
            op = OPS[name]
            params += op.defaults[len(op.defaults) - op.params + len(params):]
            if op.params != len(params):
                raise KernelInputError(f"epilogue: step {name!r} takes {OPS[name].params} params, got {part!r} "
                                       f"in {text!r}")
            ops.append((name, (cur,), params))
        else:
            known = sorted([n for n, o in OPS.items() if o.arity == 1 and n != "cast"] + list(SCALAR_STEPS))
            raise KernelInputError(f"epilogue: activation / step {part!r} in {text!r} is not a one-input op of "
                                   f"the per-element table with its constants; known steps: {known}")
        cur = len(ops)
    return Program(1, tuple(ops), ((cur, "f32"),))


def epilogue(program) -> str | None:
    """Canonical text of a one-input, one-float-output program (None, "" or no ops -> None). Accepts
    a Program, its JSON text, or a chain() spelling."""
    if not program:
        return None
    if isinstance(program, str):
        program = parse(program) if program.lstrip().startswith("{") else chain(program)
    if not isinstance(program, Program):
        raise KernelInputError(f"epilogue: expected a program (text or Program), got {program!r}")
    if program.n != 1 or len(program.out) != 1 or program.kinds(["f32"])[program.out[0][0]] != "f":
        raise KernelInputError(f"epilogue: {program.text()} must read one value and return one float value")
    if not program.ops:
        return None
    return Program(1, program.ops, ((program.out[0][0], "f32"),)).text()


def then(p: Program, q: Program) -> Program:
    """q applied to p's (only) output: one program; q's input 0 reads p's output."""
    m = [p.out[0][0]] + [p.n + len(p.ops) + k for k in range(len(q.ops))]
    ops = p.ops + tuple((o, tuple(m[a] for a in args), prm) for o, args, prm in q.ops)
    return Program(p.n, ops, ((m[q.out[0][0]], q.out[0][1]),))


# ---------------------------------------------------------------------------
# launch geometry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InputGeometry:
    dtype: str
    per_vector: bool  # True: VEC contiguous elements per vector index; False: one element per vector
    terms: tuple  # ((div, mod or 0, mul), ...): offset = sum(((v // div) % mod) * mul), in its units


@dataclass(frozen=True)
class Geometry:
    shape: tuple  # coalesced output shape (elements)
    vec: int
    inputs: tuple  # InputGeometry per input

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def coalesce(out_shape, in_shapes, in_strides=None):
    """Merge adjacent output dims while every input is broadcast on both or on neither, and every
    strided input (`in_strides[i]` its element strides, None: contiguous) steps over the outer dim
    as one block of the inner. Returns (shape, per input its broadcast mask, per input its strides
    per merged dim or None)."""
    r = len(out_shape)
    in_strides = in_strides or [None] * len(in_shapes)
    masks, strides = [], []  # per input: per dim True when broadcast (size 1 against a larger output dim)
    for s, st in zip(in_shapes, in_strides):
        lead = r - len(s)
        s = (1,) * lead + tuple(s)
        masks.append([s[d] == 1 and out_shape[d] != 1 for d in range(r)])
        strides.append(None if st is None else (0,) * lead + tuple(st))
    dims = [d for d in range(r) if out_shape[d] != 1]
    shape, bmask, cst = [], [[] for _ in in_shapes], [None if st is None else [] for st in strides]
    for d in dims:
        if shape and all(m[d] == bm[-1] for m, bm in zip(masks, bmask)) and all(
                st is None or m[d] or c[-1] == st[d] * out_shape[d] for st, m, c in zip(strides, masks, cst)):
            shape[-1] *= out_shape[d]
            for st, c in zip(strides, cst):
                if st is not None:
                    c[-1] = st[d]
            continue
        shape.append(out_shape[d])
        for m, bm in zip(masks, bmask):
            bm.append(m[d])
        for st, m, c in zip(strides, masks, cst):
            if st is not None:
                c.append(0 if m[d] else st[d])
    if not shape:
        shape, bmask, cst = [1], [[True] for _ in in_shapes], [None if st is None else [0] for st in strides]
    return tuple(shape), [tuple(b) for b in bmask], [None if c is None else tuple(c) for c in cst]


def geometry(out_shape, in_shapes, in_dtypes, out_dtypes, aligned, in_strides=None) -> Geometry:
    """`aligned(vec)`: whether every tensor's base address suits `vec`-element accesses. `in_strides`:
    per input its element strides where it is read in place with them (a column slice, a transpose:
    no contiguous copy first), or None (a contiguous input)."""
    shape, bmasks, cstrides = coalesce(out_shape, in_shapes, in_strides)
    last = shape[-1]
    vec_dtypes = [dt for dt, b in zip(in_dtypes, bmasks) if not b[-1]] + list(out_dtypes)
    vec = 128 // max(BITS[d] for d in vec_dtypes)
    vec = min(vec, 8)

    def strided_ok(v):  # a strided input read per vector: unit inner stride, outer strides whole vectors
        return all(st is None or bm[-1] or (st[-1] == 1 and all(x % v == 0 for x in st[:-1]))
                   for st, bm in zip(cstrides, bmasks))

    while vec > 1 and (last % vec or not aligned(vec) or not strided_ok(vec)):
        vec //= 2
    r = len(shape)
    vshape = shape[:-1] + (last // vec,)
    # output strides in vector units
    ostride = [1] * r
    for d in range(r - 2, -1, -1):
        ostride[d] = ostride[d + 1] * vshape[d + 1]
    inputs = []
    for dt, bm, st in zip(in_dtypes, bmasks, cstrides):
        per_vec = not bm[-1]
        units = vshape if per_vec else shape  # the input's own dims are counted in these units
        istride, acc = [0] * r, 1
        for d in range(r - 1, -1, -1):
            if not bm[d]:
                if st is not None:  # its own strides, in its units (vectors: the inner stride is 1)
                    istride[d] = st[d] if (d == r - 1 or not per_vec) else st[d] // vec
                else:
                    istride[d] = acc
                acc *= units[d]
        terms = []
        for d in range(r):
            if bm[d]:
                continue
            mod = 0 if d == 0 else vshape[d]
            t = (ostride[d], mod, istride[d])
            if terms and terms[-1][0] == t[0] * t[1] and terms[-1][2] == t[2] * t[1]:
                o = terms.pop()  # the outer dim continues this one in the input too: one term
                t = (t[0], o[1] * t[1] if o[1] else 0, t[2])
            terms.append(t)
        inputs.append(InputGeometry(dt, per_vec, tuple(terms)))
    return Geometry(shape, vec, tuple(inputs))
