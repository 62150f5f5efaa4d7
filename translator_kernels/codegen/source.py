"""A per-element program written out as FlyDSL Python source (the generated kernels' bodies).

Each op of a translator_kernels.program Program becomes one line `xK = em.<device>(...)`: the
op table's device function from translator_kernels.device_math, its value arguments converted
to the kind the op takes (`program.signature`: `em.from_bool` / `em.to_bool` between float and bool,
`em.as_kind` for the integer kinds), its constants as literals. The GEMM
epilogue makes the same calls while it traces (device_math.run); the generated kernels write
them out so the file a user takes away is the code that ran.
"""

from __future__ import annotations

import math

from translator_kernels.program import OPS, Program, signature


def lit(c) -> str:
    """A constant as a Python literal (inf / NaN spelled so the generated file imports nothing)."""
    if c is None:
        return "None"
    if isinstance(c, str):
        return repr(c)
    c = float(c)
    return repr(c) if math.isfinite(c) else f"float({str(c)!r})"


def convert(expr: str, have: str, want: str) -> str:
    """`expr` (a value of kind `have`) as kind `want`."""
    if have == want:
        return expr
    if {have, want} == {"f", "b"}:
        return f"em.{'to_bool' if want == 'b' else 'from_bool'}({expr})"
    return f"em.as_kind({expr}, {have!r}, {want!r})"


def op_expr(name, args, params, kinds, vec) -> str:
    """One op as a Python expression over earlier values x<i> (vectors of their kinds: fp32, i1, i32, i64)."""
    if name == "const":
        return f"em.splat({lit(params[0])}, {vec})"
    if name == "const_int":
        return f"em.splat_int({int(params[0])}, {params[1]!r}, {vec})"
    op = OPS[name]
    wants, _ = signature(name, params, [kinds[a] for a in args])
    xs = [convert(f"x{a}", kinds[a], want) for a, want in zip(args, wants)]
    return f"em.{op.device}({', '.join(xs + [lit(p) for p in params])})"


def body(prog: Program, kinds, vec, indent: str = "    ") -> list[str]:
    """The lines computing every op of `prog` (values x0..x<n-1> are already defined)."""
    return [f"{indent}x{prog.n + k} = {op_expr(o, a, p, kinds, vec)}  # {o}" for k, (o, a, p) in enumerate(prog.ops)]


def as_float(prog: Program, kinds, indent: str = "    ") -> str:
    """`return` of the program's only output as an fp32 vector."""
    v = prog.out[0][0]
    return f"{indent}return {convert(f'x{v}', kinds[v], 'f')}"
