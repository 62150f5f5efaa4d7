"""GEMM epilogue fusion: the elementwise region that reads a `flydsl.gemm` folds into its epilogue.

The kernel's epilogue is ``out = program(scale * (a @ W.T) + bias) + residual`` in fp32, where
``program`` is a one-input per-element program of translator_kernels.program. After partitioning,
the elementwise code after a gemm is a `flydsl.fused_elementwise` region: a program of the same
language and op table. This consumer rule (translator.passes.fuse_consumers, the mechanism that
folds regions into reductions and scans in fold.py) moves into the gemm the part of the region's
program that is computed from the gemm's value alone, so every op with a float result that an
elementwise region takes folds here too (sqrt, log, erf, sin, floor, pow by a scalar, where, ...):

    y = x @ W.t() * s                   scale      (a multiply by a constant, the accumulator's
                                                    only reader, before any bias or program)
    y = torch.mm(x, W) + self.bias      bias       (an add of a [N] vector of the gemm's dtype,
                                                    before any program)
    y = torch.sigmoid(y * 2.0)          program    (the ops whose operands are the running value
    y = torch.sqrt(F.gelu(y)).clamp(0, 1)          and constants; a scale after the bias is a step)
    x = x + self.dropout(y)             residual   (last: an add of a full-shape tensor of the
                                                    gemm's dtype computed before the gemm)

The folded part ends at one value v, the only value of it that the rest of the region or the
graph reads. `choose_fold` picks the largest such part. If it is the whole region, the region goes
away (``linear -> gelu -> clamp`` is one GEMM; ``x + drop(proj(gelu(fc(x))))`` is two gemm
nodes, fc with a gelu program and proj with the residual); else the region reads v from the
gemm in place of the gemm's raw value (``sigmoid(fc(x)) * x``: the gemm applies the sigmoid,
the region multiplies). v is then stored in the gemm's dtype, as eager stores every op's result.

A gemm whose value is read by anything besides one region keeps it. A cast in the folded part
is allowed only where v is a region output of the gemm's dtype (the bf16 / fp16 precision
policy casts the gemm's output back to the model's dtype first: those gemms keep their epilogue
unfused, which is correct, just not fused). Verification compares the gemm with the captured
node whose value it now reproduces when v was a region output; an inner v has no captured twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from translator_kernels.program import DTYPES, Program, epilogue, parse, then

from ..graph import arg, before, dims, dtype_of, getitem_of, set_args, shape_of, users
from ..registry import NO_MATCH, Stage, rule
from . import elementwise, gemm  # noqa: F401  (register flydsl.fused_elementwise and flydsl.gemm)
from .fold import prune, reshape_region

GEMM = torch.ops.flydsl.gemm.default
FE = torch.ops.flydsl.fused_elementwise.default
ARITH = ("add", "sub", "mul", "div")  # counted as epilogue_arith, the other ops as epilogue_activation


@dataclass
class Fold:
    region: torch.fx.Node
    v: int  # value id (in the region's program) the gemm computes after the fold
    part: frozenset  # value ids of the region's program the gemm takes over
    program: Program | None  # the one-input program from the accumulator to v (before the residual)
    scale: float
    bias: torch.fx.Node | None
    residual: torch.fx.Node | None


def _readers(prog: Program, v: int) -> list[int]:
    return [prog.n + k for k, (_, args, _) in enumerate(prog.ops) if v in args]


def _op(prog: Program, v: int):
    return prog.ops[v - prog.n] if v >= prog.n else (None, (), ())


def _ancestors(prog: Program, v: int) -> set[int]:
    out, stack = set(), [v]
    while stack:
        u = stack.pop()
        if u not in out:
            out.add(u)
            stack.extend(_op(prog, u)[1])
    return out


def _const_like(prog: Program) -> set[int]:
    """Values computed from constants alone (the rest of a region may recompute them)."""
    c = set()
    for k, (_, args, _) in enumerate(prog.ops):
        if all(a in c for a in args):
            c.add(prog.n + k)
    return c


class _Region:
    """The region `f` that alone reads gemm `g`, read as a program over the gemm's value."""

    def __init__(self, g, f):
        self.g, self.f, self.ins = g, f, list(arg(f, "inputs"))
        self.prog = parse(arg(f, "program"))
        self.gi = self.ins.index(g)
        self.consts = _const_like(self.prog)
        self.outs = {v for v, _ in self.prog.out}
        self.kinds = self.prog.kinds([DTYPES.get(dtype_of(a), "f32") for a in self.ins])

    def only_reader(self, v: int):
        rd = _readers(self.prog, v)
        return rd[0] if len(rd) == 1 and v not in self.outs else None

    def other(self, v: int, u: int) -> int:
        """The operand of binary op u that is not v (None when both are v)."""
        args = _op(self.prog, u)[1]
        rest = [a for a in args if a != v]
        return rest[0] if len(args) == 2 and len(rest) == 1 else None

    def input_like(self, i, shape) -> bool:
        """Region input i is a tensor of the gemm's dtype and `shape`, computed before the gemm, read once."""
        if i is None or i >= self.prog.n or i == self.gi or len(_readers(self.prog, i)) != 1 or i in self.outs:
            return False
        x = self.ins[i]
        return dtype_of(x) == dtype_of(self.g) and dims(shape_of(x)) == shape and before(x, self.g)

    def boundary(self, part: set) -> set:
        """Values of `part` read outside it (by the rest of the program or as region outputs)."""
        out = set()
        for k, (_, args, _) in enumerate(self.prog.ops):
            if self.prog.n + k not in part:
                out.update(a for a in args if a in part)
        return {v for v in out | (self.outs & part) if v not in self.consts}

    def castless(self, part, v) -> bool:
        casts = any(_op(self.prog, u)[0] == "cast" for u in part)
        j = [dt for w, dt in self.prog.out if w == v]
        return (not casts or bool(j)) and all(dt == DTYPES[dtype_of(self.g)] for dt in j)


def _peel(r: _Region, scale, bias, fresh):
    """(accumulator value id, scale, bias node, peeled value ids): the scale and bias the gemm's
    own arguments take, read off the start of the region's program."""
    acc, peeled = r.gi, {r.gi}
    u = r.only_reader(acc)
    if fresh and u is not None and _op(r.prog, u)[0] == "mul":
        c = r.other(acc, u)
        if c is not None and _op(r.prog, c)[0] == "const":
            scale, acc = scale * float(_op(r.prog, c)[2][0]), u
            peeled.add(u)
    u = r.only_reader(acc)
    if fresh and bias is None and u is not None and _op(r.prog, u)[0] == "add":
        b = r.other(acc, u)
        if r.input_like(b, [str(arg(r.g, "n"))]):
            bias, acc = r.ins[b], u
            peeled |= {b, u}
    return acc, scale, bias, peeled


def _sub_program(prog: Program, acc: int, v: int, skip: set) -> Program | None:
    """The one-input program computing value v from value acc (ops in `skip` are not copied)."""
    if v == acc:
        return None
    need = _ancestors(prog, v)
    ids, ops = {acc: 0}, []
    for k, (o, args, p) in enumerate(prog.ops):
        u = prog.n + k
        if u in need and u not in skip and u != acc:
            ops.append((o, tuple(ids[a] for a in args), p))
            ids[u] = len(ops)
    sub, _ = prune(Program(1, tuple(ops), ((ids[v], "f32"),)))
    return sub


def _candidates(r: _Region, peeled: set):
    """(v, end, residual input id or None, part) for each way the folded part may end."""
    full = dims(shape_of(r.g))
    for v in range(r.prog.n, r.prog.n + len(r.prog.ops)):
        if v in r.consts or r.kinds[v] != "f":
            continue
        yield v, v, None, _ancestors(r.prog, v)
        name, args, _ = _op(r.prog, v)
        if name == "add" and len(set(args)) == 2:
            for s, ri in (args, args[::-1]):
                if ri not in peeled and r.input_like(ri, full):
                    yield v, s, ri, _ancestors(r.prog, s) | {v, ri}


def choose_fold(g) -> Fold | None:
    """What of the region after gemm node `g` its epilogue takes (the largest part), or None."""
    bias, act, residual, scale = (arg(g, k) for k in ("bias", "activation", "residual", "scale"))
    us = users(g)
    if residual is not None or len(us) != 1 or len(g.users) != 1 or us[0].target is not FE:
        return None
    r = _Region(g, us[0])
    if r.ins.count(g) != 1:
        return None
    acc, scale, bias, peeled = _peel(r, scale, bias, fresh=bias is None and not act)
    best = None
    for v, end, ri, part in _candidates(r, peeled):
        reads = {a for a in part if a < r.prog.n} - peeled - {ri}
        if r.gi not in part or reads or r.kinds[end] != "f" or r.boundary(part) != {v} \
                or not r.castless(part, v):
            continue
        if best is None or len(part) > len(best.part):
            best = Fold(r.f, v, frozenset(part), _sub_program(r.prog, acc, end, peeled), scale, bias,
                        None if ri is None else r.ins[ri])
    return best


def epilogue_check(node, ctx):
    fold = choose_fold(node)
    return NO_MATCH if fold is None else fold


@rule(Stage.CONSUMER, GEMM, family="gemm", supported=epilogue_check, name="gemm_epilogue", priority=1,
      doc="the elementwise region after a gemm: scale / bias / per-element program / residual -> its epilogue")
def fuse_epilogue(g, ctx, fold):
    f, prog = fold.region, parse(arg(fold.region, "program"))
    bias, act, scale = arg(g, "bias"), arg(g, "activation"), arg(g, "scale")
    program = fold.program if not act or fold.program is None else then(parse(act), fold.program)
    set_args(g, bias=fold.bias, activation=epilogue(program or act), residual=fold.residual, scale=fold.scale)
    for name in (o for o, _, _ in (fold.program.ops if fold.program else ()) if o != "const"):
        ctx.count("epilogue_arith" if name in ARITH else "epilogue_activation")
    for kind, changed in (("scale", fold.scale != scale), ("bias", fold.bias is not bias),
                          ("residual", fold.residual is not None)):
        if changed:
            ctx.count(f"epilogue_{kind}")
    gone = {j: g for j, (v, _) in enumerate(prog.out) if v == fold.v}
    names = [gi.meta.get("replaces") for gi in f.users if getitem_of(gi)[1] in gone]
    g.meta["flydsl"]["anchor"] = names[-1] if names else None  # the captured node g now reproduces
    ins = list(arg(f, "inputs"))
    if len(gone) == len(prog.out):
        ctx.absorb(g, [f])  # the whole region: its ops now run in the gemm (reshape_region erases f)
    gi = ins.index(g)
    rest = Program(prog.n, tuple((o, tuple(gi if x == fold.v else x for x in args), p) for o, args, p in prog.ops),
                   prog.out)
    reshape_region(ctx, f, rest, ins, gone)
    return g
