"""Folding a fused elementwise region into the FlyDSL reduction or scan next to it.

`flydsl.fused_reduce` and `flydsl.scan` compute their input with a per-element program
(``inputs, program`` are their first two arguments), and `flydsl.fused_reduce` applies a second
program to its result (``epi_inputs, epilogue``). After partitioning, the elementwise code
around them is a `flydsl.fused_elementwise` node; the consumer rules here fold it in:

    a = exp(x - m); s = a.sum(-1)            prologue: the region read only by the reduction
                                             joins its program; the kernel reads x and m
    cumsum(x * mask, -1)                     the same for a scan (masked cumsum)
    log(s) + m                               epilogue: the one-output region that alone reads
                                             the reduction's result, at the result's shape

A region with several outputs keeps the others; the consumer recomputes the value it reads from
the region's inputs (cheaper than writing the value and reading it back). These run in the
CONSUMER stage (translator.passes.fuse_consumers) with the GEMM epilogue (gemm_epilogue.py, which
folds the region after a gemm with the same helpers: `prune`, `reshape_region`) and residual
add + norm.
"""

from __future__ import annotations

import operator

import torch

from translator_kernels.program import Program, parse

from ..graph import arg, getitem_of, set_args, shape_of, val
from ..registry import NO_MATCH, Match, Stage, rule
from . import elementwise, reduce, scan  # noqa: F401  (register the ops folded here)

FE = torch.ops.flydsl.fused_elementwise.default
REDUCE = torch.ops.flydsl.fused_reduce.default
SCAN = torch.ops.flydsl.scan.default


def compose(pf, nf, j, pr, nr, g):
    """The program of consumer `pr` (inputs `nr`) with elementwise program `pf` (inputs `nf`)
    inlined where `pr` reads `g` (output `j` of `pf`); returns (program, inputs)."""
    inputs = list(nf) + [a for a in dict.fromkeys(nr) if a is not g and a not in nf]
    n = len(inputs)
    fmap = list(range(pf.n)) + [n + k for k in range(len(pf.ops))]
    rmap = [fmap[pf.out[j][0]] if a is g else inputs.index(a) for a in nr]
    rmap += [n + len(pf.ops) + k for k in range(len(pr.ops))]
    ops = [(o, tuple(fmap[a] for a in args), p) for o, args, p in pf.ops]
    ops += [(o, tuple(rmap[a] for a in args), p) for o, args, p in pr.ops]
    return Program(n, tuple(ops), ((rmap[pr.out[0][0]], pr.out[0][1]),)), inputs


def prune(prog):
    """`prog` without ops no output needs and without unread inputs; returns (program, kept inputs)."""
    live = {v for v, _ in prog.out}
    for k in range(len(prog.ops) - 1, -1, -1):
        if prog.n + k in live:
            live.update(prog.ops[k][1])
    ins = [i for i in range(prog.n) if i in live]
    ops = [k for k in range(len(prog.ops)) if prog.n + k in live]
    new = {old: i for i, old in enumerate(ins)}
    new.update({prog.n + k: len(ins) + i for i, k in enumerate(ops)})
    body = tuple((prog.ops[k][0], tuple(new[a] for a in prog.ops[k][1]), prog.ops[k][2]) for k in ops)
    return Program(len(ins), body, tuple((new[v], dt) for v, dt in prog.out)), ins


def reshape_region(ctx, f, prog, inputs, gone: dict) -> None:
    """Make region node `f` compute `prog` over `inputs` (both pruned) without its outputs `gone`
    ({output index: the node its readers read instead, or None when its getitem is already gone}).
    The other outputs' getitems are renumbered; `f` is erased when no output is left."""
    gets = {getitem_of(u)[1]: u for u in list(f.users)}
    for j, instead in gone.items():
        if j in gets and instead is not None:
            gets[j].replace_all_uses_with(instead)
            ctx.gm.graph.erase_node(gets[j])
    keep = [j for j in range(len(prog.out)) if j not in gone]
    if not keep:
        ctx.gm.graph.erase_node(f)
        return
    rest, kin = prune(Program(prog.n, prog.ops, tuple(prog.out[j] for j in keep)))
    set_args(f, inputs=[inputs[i] for i in kin], program=rest.text())
    f.meta["val"] = [f.meta["val"][j] for j in keep]
    for new, old in enumerate(keep):
        if old in gets:
            gets[old].args = (f, new)


# --- prologue: a region output read only by the consumer -------------------------------------

def _prologue_source(node):
    """The getitem of a fused_elementwise node that only `node` reads, else None."""
    for g in dict.fromkeys(arg(node, "inputs")):
        src = getitem_of(g)
        if src is not None and src[0].target is FE and list(g.users) == [node]:
            return g
    return None


def prologue_supported(node, ctx):
    g = _prologue_source(node)
    return NO_MATCH if g is None else Match(g=g)


def _fold_prologue(node, ctx, g, counter):
    f, j = getitem_of(g)
    pf = parse(arg(f, "program"))
    prog, inputs = compose(pf, arg(f, "inputs"), j, parse(arg(node, "program")), arg(node, "inputs"), g)
    prog, keep = prune(prog)
    set_args(node, inputs=[inputs[i] for i in keep], program=prog.text())
    ctx.gm.graph.erase_node(g)
    if len(pf.out) == 1:
        ctx.absorb(node, [f], prepend=True)
    reshape_region(ctx, f, pf, arg(f, "inputs"), {j: None})  # the region keeps its other outputs, if any
    ctx.count(counter)
    return node


@rule(Stage.CONSUMER, REDUCE, family="fused_reduce", supported=prologue_supported, name="reduce_prologue",
      priority=1, doc="the elementwise region read only by a reduction joins its program ((x * x).mean(-1))")
def fold_reduce_prologue(node, ctx, m):
    return _fold_prologue(node, ctx, m.g, "reduce_prologue_fused")


@rule(Stage.CONSUMER, SCAN, family="scan", supported=prologue_supported, name="scan_prologue",
      doc="the elementwise region read only by a scan joins its program (masked cumsum: cumsum(x * mask))")
def fold_scan_prologue(node, ctx, m):
    return _fold_prologue(node, ctx, m.g, "scan_prologue")


# --- epilogue: the region that alone reads a reduction's result ------------------------------

def _epilogue_parts(r):
    """(getitem of r's result, the region node f) when f can become r's epilogue, else None."""
    if arg(r, "kind") in ("argmax", "argmin", "max", "min") or arg(r, "epilogue") or len(r.users) != 1:
        return None
    g = next(iter(r.users))
    if g.target is not operator.getitem or len(g.users) != 1:
        return None
    f = next(iter(g.users))
    if f.target is not FE or len(f.users) != 1 or [str(d) for d in val(f)[0].shape] != [str(d) for d in shape_of(g)]:
        return None
    pf = parse(arg(f, "program"))
    if len(pf.out) != 1 or pf.out[0][1] == "bool":
        return None
    for a in arg(f, "inputs"):  # an input computed from the result would make a cycle
        if a is g:
            continue
        stack, seen = [a], set()
        while stack:
            n = stack.pop()
            if n is g or n is r:
                return None
            if n not in seen:
                seen.add(n)
                stack.extend(n.all_input_nodes)
    return g, f


def epilogue_supported(node, ctx):
    parts = _epilogue_parts(node)
    return NO_MATCH if parts is None else Match(g=parts[0], f=parts[1])


@rule(Stage.CONSUMER, REDUCE, family="fused_reduce", supported=epilogue_supported, name="reduce_epilogue",
      doc="the one-output elementwise region that alone reads a reduction's result becomes its epilogue "
          "(log(s) + m)")
def fold_reduce_epilogue(r, ctx, m):
    g, f = m.g, m.f
    pf, ins = parse(arg(f, "program")), arg(f, "inputs")
    others = [a for a in ins if a is not g]
    order = [ins.index(g)] + [i for i, a in enumerate(ins) if a is not g]
    vmap = {old: new for new, old in enumerate(order)}
    vmap.update({pf.n + k: pf.n + k for k in range(len(pf.ops))})
    ops = tuple((o, tuple(vmap[a] for a in args), p) for o, args, p in pf.ops)
    epi = Program(pf.n, ops, ((vmap[pf.out[0][0]], pf.out[0][1]),))
    set_args(r, epi_inputs=others, epilogue=epi.text())
    ctx.infer(r)
    g.meta["val"] = r.meta["val"][0]
    (fg,) = f.users
    fg.replace_all_uses_with(g)
    ctx.gm.graph.erase_node(fg)
    ctx.gm.graph.erase_node(f)
    ctx.absorb(r, [f])
    ctx.count("reduce_epilogue_fused")
    return r
