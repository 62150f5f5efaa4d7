"""A per-element program written out as FlyDSL Python source (the generated kernels' bodies).

Each op of a translator_kernels.program Program becomes one line `xK = em.<device>(...)`: the
op table's device function from translator_kernels.device_math, its value arguments converted
to the kind the op takes (`em.from_bool` / `em.to_bool`), its constants as literals. The GEMM
epilogue makes the same calls while it traces (device_math.run); the generated kernels write
them out so the file a user takes away is the code that ran.
"""

from __future__ import annotations

import math

from translator_kernels.program import OPS, Program


def lit(c) -> str:
    """A constant as a Python literal (inf / NaN spelled so the generated file imports nothing)."""
    if c is None:
        return "None"
    if isinstance(c, str):
        return repr(c)
    c = float(c)
    return repr(c) if math.isfinite(c) else f"float({str(c)!r})"


def op_expr(name, args, params, kinds, vec) -> str:
    """One op as a Python expression over earlier values x<i> (fp32 vectors, i1 for kind 'b')."""
    if name == "const":
        return f"em.splat({lit(params[0])}, {vec})"
    op = OPS[name]
    xs = [f"x{a}" if kinds[a] == want else f"em.{'to_bool' if want == 'b' else 'from_bool'}(x{a})"
          for a, want in zip(args, op.takes)]
    return f"em.{op.device}({', '.join(xs + [lit(p) for p in params])})"


def body(prog: Program, kinds, vec, indent: str = "    ") -> list[str]:
    """The lines computing every op of `prog` (values x0..x<n-1> are already defined)."""
    return [f"{indent}x{prog.n + k} = {op_expr(o, a, p, kinds, vec)}  # {o}" for k, (o, a, p) in enumerate(prog.ops)]


def as_float(prog: Program, kinds, indent: str = "    ") -> str:
    """`return` of the program's only output as an fp32 vector."""
    v = prog.out[0][0]
    return f"{indent}return em.from_bool(x{v})" if kinds[v] == "b" else f"{indent}return x{v}"
