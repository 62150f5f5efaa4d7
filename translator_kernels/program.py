"""The expression program of a fused elementwise kernel, and its launch plan.

A `Program` is a small SSA list: values 0..n_inputs-1 are the kernel's inputs, op i defines
value n_inputs + i. An op is (name, argument value ids, constant parameters). Outputs name a
value and the dtype it is stored in. All math is fp32 (bool for comparisons); a `cast` op
rounds to bf16 / f16 where the graph had an explicit `.to()`. Its JSON text is what a graph
node carries and what caches key on:

    {"n": 2, "ops": [["mul", [0, 1], []], ["gelu", [2], []]], "out": [[3, "bf16"]]}

`plan()` turns the inputs' shapes into the kernel's index math: the broadcast output shape is
coalesced (adjacent dims merge while every input is broadcast on both or on neither), the
last coalesced dim is read in vectors of VEC elements (128 bits where its size, the dtypes and
the base addresses allow), and each input is addressed either per vector (its last dim is
the output's) or per element once per vector (its last dim is broadcast: a column or scalar).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.bool: "bool"}
TORCH = {v: k for k, v in DTYPES.items()}
BITS = {"f32": 32, "bf16": 16, "f16": 16, "bool": 8}

# name -> (arity, number of constant params, result kind "f" float / "b" bool)
UNARY = ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
         "relu", "sigmoid", "tanh", "erf", "gelu", "gelu_tanh", "silu", "mish", "softsign", "hardsigmoid",
         "hardswish", "sign", "floor", "ceil", "round", "trunc", "sin", "cos")
PARAM_UNARY = {"softplus": 2, "elu": 3, "celu": 1, "leaky_relu": 1, "pow_scalar": 1, "clamp": 2,
               "cast": 1, "const": 1}
BINARY = ("add", "sub", "mul", "div", "div_trunc", "div_floor", "maximum", "minimum")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
OPS = set(UNARY) | set(PARAM_UNARY) | set(BINARY) | set(COMPARE) | set(LOGICAL) | {"where", "logical_not"}


@dataclass(frozen=True)
class Program:
    n: int
    ops: tuple  # ((name, (arg ids...), (params...)), ...)
    out: tuple  # ((value id, dtype str), ...)

    def text(self) -> str:
        return json.dumps({"n": self.n, "ops": [[o, list(a), list(p)] for o, a, p in self.ops],
                           "out": [list(x) for x in self.out]}, separators=(",", ":"))

    def kinds(self, in_dtypes) -> list[str]:
        """'f' or 'b' (bool) for every value."""
        k = ["b" if d == "bool" else "f" for d in in_dtypes]
        for name, args, params in self.ops:
            if name in COMPARE or name in LOGICAL or name == "logical_not":
                k.append("b")
            elif name == "cast":
                k.append("b" if params[0] == "bool" else "f")
            elif name == "where":
                k.append("f" if "f" in (k[args[1]], k[args[2]]) else "b")
            else:
                k.append("f")
        return k


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Program:
    d = json.loads(text)
    ops = tuple((o, tuple(a), tuple(p)) for o, a, p in d["ops"])
    prog = Program(int(d["n"]), ops, tuple((int(v), str(dt)) for v, dt in d["out"]))
    for i, (name, args, _) in enumerate(ops):
        if name not in OPS:
            raise ValueError(f"fused_elementwise: unknown op {name!r} in program {text}")
        if any(not 0 <= a < prog.n + i for a in args):
            raise ValueError(f"fused_elementwise: op {i} ({name}) reads a value not yet defined: {text}")
    for v, dt in prog.out:
        if not 0 <= v < prog.n + len(ops) or dt not in BITS:
            raise ValueError(f"fused_elementwise: bad output ({v}, {dt!r}) in {text}")
    return prog


# ---------------------------------------------------------------------------
# launch plan
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InputPlan:
    dtype: str
    per_vector: bool  # True: VEC contiguous elements per vector index; False: one element per vector
    terms: tuple  # ((div, mod or 0, mul), ...): offset = sum(((v // div) % mod) * mul), in its units


@dataclass(frozen=True)
class Plan:
    shape: tuple  # coalesced output shape (elements)
    vec: int
    inputs: tuple  # InputPlan per input

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def coalesce(out_shape, in_shapes):
    """Merge adjacent output dims while every input is broadcast on both or on neither."""
    r = len(out_shape)
    masks = []  # per input: per dim True when broadcast (size 1 against a larger output dim)
    for s in in_shapes:
        s = (1,) * (r - len(s)) + tuple(s)
        masks.append([s[d] == 1 and out_shape[d] != 1 for d in range(r)])
    dims = [d for d in range(r) if out_shape[d] != 1]
    shape, bmask = [], [[] for _ in in_shapes]
    for d in dims:
        if shape and all(m[d] == bm[-1] for m, bm in zip(masks, bmask)):
            shape[-1] *= out_shape[d]
            continue
        shape.append(out_shape[d])
        for m, bm in zip(masks, bmask):
            bm.append(m[d])
    if not shape:
        shape, bmask = [1], [[True] for _ in in_shapes]
    return tuple(shape), [tuple(b) for b in bmask]


def plan(out_shape, in_shapes, in_dtypes, out_dtypes, aligned) -> Plan:
    """`aligned(vec)`: whether every tensor's base address suits `vec`-element accesses."""
    shape, bmasks = coalesce(out_shape, in_shapes)
    last = shape[-1]
    vec_dtypes = [dt for dt, b in zip(in_dtypes, bmasks) if not b[-1]] + list(out_dtypes)
    vec = 128 // max(BITS[d] for d in vec_dtypes)
    vec = min(vec, 8)
    while vec > 1 and (last % vec or not aligned(vec)):
        vec //= 2
    r = len(shape)
    vshape = shape[:-1] + (last // vec,)
    # output strides in vector units
    ostride = [1] * r
    for d in range(r - 2, -1, -1):
        ostride[d] = ostride[d + 1] * vshape[d + 1]
    inputs = []
    for dt, bm in zip(in_dtypes, bmasks):
        per_vec = not bm[-1]
        units = vshape if per_vec else shape  # the input's own dims are counted in these units
        istride, acc = [0] * r, 1
        for d in range(r - 1, -1, -1):
            if not bm[d]:
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
        inputs.append(InputPlan(dt, per_vec, tuple(terms)))
    return Plan(shape, vec, tuple(inputs))
