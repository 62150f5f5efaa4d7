"""Elementwise partitioning: group fusable elementwise nodes into regions, one kernel each.

Runs after the canonical lowerings (gemm, norms, softmax ... are already `flydsl.*` nodes)
and before GEMM epilogue fusion. Walking the graph in order, each fusable node joins the
regions of its fusable producers when the union stays legal:

- convex: no path leaves the region and comes back into it (through a PyTorch op or another
  FlyDSL node); otherwise contracting it into one node would make a cycle. Checked with
  networkx ancestor sets of the region's external inputs on the captured graph.
- one shape: every value used outside the region has the region's full (broadcast) shape.
  Such a value becomes an extra output of the fused kernel, never recomputed or lost;
  smaller intermediates (a scaled bias) are recomputed per element inside the kernel.

Left alone for the epilogue stage: the ops a `flydsl.gemm` can absorb. From a gemm, the
single-user chain scale -> bias -> per-element steps with scalar constants (activations, clamp,
scalar mul / add ...) -> residual (eval dropout passes through) is what
translator/lowerings/gemm_epilogue.py folds into the GEMM (its `plan` decides, for both);
those nodes never join a region, so `linear -> gelu -> clamp` stays one GEMM.

A region is rewritten only if it holds a real op (a lone eval dropout is not a kernel). The
fused node goes after the region's last member; the graph is then re-sorted topologically
(stable), since users of an early member may sit before a later member's inputs.
"""

from __future__ import annotations

import operator

import networkx as nx
import torch

from ..lowerings._common import shape_of, val
from ..lowerings.elementwise import TABLE, is_identity, lower_region, node_supported
from ..lowerings.gemm_epilogue import plan as plan_epilogue

def epilogue_chain(node) -> list:
    """Nodes after flydsl.gemm `node` that the epilogue stage will fold into it (gemm_epilogue.plan)."""
    return [u for _, u, _ in plan_epilogue(node)]


def _full_shape(shapes):
    """The broadcast of symbolic shapes compared by their printed dims, or None if they clash."""
    r = max(len(s) for s in shapes)
    out = ["1"] * r
    for s in shapes:
        s = ["1"] * (r - len(s)) + [str(d) for d in s]
        for i, d in enumerate(s):
            if d != "1":
                if out[i] not in ("1", d):
                    return None
                out[i] = d
    return out


class _Partitioner:
    def __init__(self, gm):
        self.g = nx.DiGraph()
        for n in gm.graph.nodes:
            self.g.add_node(n)
            for i in n.all_input_nodes:
                self.g.add_edge(i, n)
        self._anc = {}

    def ancestors(self, n):
        if n not in self._anc:
            self._anc[n] = nx.ancestors(self.g, n)
        return self._anc[n]

    def legal(self, region: set) -> bool:
        for m in region:
            for i in m.all_input_nodes:
                if i not in region and self.ancestors(i) & region:
                    return False  # a path leaves the region and re-enters it at m
        shapes = [shape_of(m) for m in region]
        full = _full_shape(shapes)
        if full is None:
            return False
        for m in region:
            if any(u not in region for u in m.users) and [str(d) for d in shape_of(m)] != full:
                return False
        return True


def partition(gm, fusable) -> list[list]:
    """Regions (each a list of nodes in graph order) of the fusable nodes."""
    p = _Partitioner(gm)
    region_of: dict = {}
    regions: dict[int, set] = {}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in gm.graph.nodes:
        if n not in fusable:
            continue
        mine = {n}
        cands = []
        for i in n.all_input_nodes:
            r = region_of.get(i)
            if r is not None and r not in cands:
                cands.append(r)
        cands.sort(key=lambda r: -len(regions[r]))
        absorbed = []
        for r in cands:
            merged = regions[r] | mine
            if p.legal(merged):
                mine = merged
                absorbed.append(r)
        for r in absorbed:
            del regions[r]
        rid = len(order) + order[n]
        regions[rid] = mine
        for m in mine:
            region_of[m] = rid
    return [sorted(r, key=order.get) for r in regions.values()]


def fuse_elementwise(ctx) -> int:
    """The pipeline pass: partition, then one `flydsl.fused_elementwise` node per region."""
    gm = ctx.gm
    skip = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.flydsl.gemm.default:
            skip.update(epilogue_chain(n))
    fusable = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in TABLE or n in skip:
            continue
        name = n.meta.get("orig_name", n.name)
        if name in ctx.deny:
            ctx.not_lowered(n, ctx.deny[name])
            continue
        reason = node_supported(n)
        if reason:
            ctx.not_lowered(n, f"fused_elementwise: {reason}")
            continue
        fusable.add(n)
    count = 0
    for members in partition(gm, fusable):
        if all(is_identity(m) for m in members):
            continue
        region = set(members)
        outputs = [m for m in members if any(u not in region for u in m.users)]
        if not outputs:
            continue
        lower_region(ctx, members, outputs, members[-1])
        count += 1
    if count:
        _stable_toposort(gm.graph)
    return count


def _stable_toposort(graph) -> None:
    order = {n: i for i, n in enumerate(graph.nodes)}
    dg = nx.DiGraph()
    for n in graph.nodes:
        dg.add_node(n)
        for i in n.all_input_nodes:
            dg.add_edge(i, n)
    new = list(nx.lexicographical_topological_sort(dg, key=order.get))
    if new == list(graph.nodes):
        return
    prev = None
    for n in new:
        if n.op == "placeholder" or prev is None:
            prev = n
            continue
        if n.prev is not prev:
            prev.append(n)
        prev = n


def compose(pf, nf, j, pr, nr, g):
    """The program of reduction `pr` (inputs `nr`) with elementwise program `pf` (inputs `nf`)
    inlined where `pr` reads `g` (output `j` of `pf`); returns (program, inputs)."""
    from translator_kernels.program import Program

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
    from translator_kernels.program import Program

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


def fuse_reduce_prologue(ctx) -> int:
    """Fold the fused_elementwise output that only a fused_reduce reads into the reduction's program.

    A region with one output disappears into the reduction. A region with several outputs keeps the
    others; the reduction recomputes its value from the region's inputs (cheaper than writing the
    value and reading it back)."""
    from translator_kernels.program import Program, parse

    g_ = ctx.gm.graph
    fe, fr = torch.ops.flydsl.fused_elementwise.default, torch.ops.flydsl.fused_reduce.default
    count = 0
    for r in list(g_.nodes):
        if r.op != "call_function" or r.target is not fr:
            continue
        for g in dict.fromkeys(r.args[0]):
            if not (g.op == "call_function" and g.target is operator.getitem and g.args[0].target is fe
                    and list(g.users) == [r]):
                continue
            f, j = g.args[0], g.args[1]
            pf = parse(f.args[1])
            prog, inputs = compose(pf, f.args[0], j, parse(r.args[1]), r.args[0], g)
            prog, keep = prune(prog)
            r.args = ([inputs[i] for i in keep], prog.text()) + tuple(r.args[2:])
            meta = r.meta["flydsl"]
            g_.erase_node(g)
            if len(pf.out) == 1:
                meta["sources"] = list(f.meta["flydsl"]["sources"]) + list(meta["sources"])
                g_.erase_node(f)
            else:  # the region keeps its other outputs; later getitems shift down by one
                rest, kin = prune(Program(pf.n, pf.ops, pf.out[:j] + pf.out[j + 1:]))
                f.args = ([f.args[0][i] for i in kin], rest.text())
                f.meta["val"] = [v for i, v in enumerate(f.meta["val"]) if i != j]
                for u in list(f.users):
                    if u.args[1] > j:
                        u.args = (f, u.args[1] - 1)
            ctx.counters["reduce_prologue_fused"] = ctx.counters.get("reduce_prologue_fused", 0) + 1
            count += 1
            break
    epi = sum(_fold_epilogue(ctx, r) for r in list(g_.nodes) if r.op == "call_function" and r.target is fr)
    if epi:
        _stable_toposort(g_)
    return count + epi


def _fold_epilogue(ctx, r) -> int:
    """Fold the one-output region that alone reads reduction `r`'s result, at the result's shape,
    into `r` as its epilogue program."""
    from translator_kernels.program import Program, parse

    fe = torch.ops.flydsl.fused_elementwise.default
    if r.args[2] in ("argmax", "argmin", "max", "min") or r.args[7] or len(r.users) != 1:
        return 0
    g = next(iter(r.users))
    if g.target is not operator.getitem or len(g.users) != 1:
        return 0
    f = next(iter(g.users))
    if f.target is not fe or len(f.users) != 1 or [str(d) for d in val(f)[0].shape] != [str(d) for d in shape_of(g)]:
        return 0
    pf = parse(f.args[1])
    if len(pf.out) != 1 or pf.out[0][1] == "bool":
        return 0
    others = [a for a in f.args[0] if a is not g]
    for a in others:  # an input computed from the result would make a cycle
        stack, seen = [a], set()
        while stack:
            n = stack.pop()
            if n is g or n is r:
                return 0
            if n not in seen:
                seen.add(n)
                stack.extend(n.all_input_nodes)
    order = [f.args[0].index(g)] + [i for i, a in enumerate(f.args[0]) if a is not g]
    vmap = {old: new for new, old in enumerate(order)}
    vmap.update({pf.n + k: pf.n + k for k in range(len(pf.ops))})
    ops = tuple((o, tuple(vmap[a] for a in args), p) for o, args, p in pf.ops)
    epi = Program(pf.n, ops, ((vmap[pf.out[0][0]], pf.out[0][1]),))
    r.args = tuple(r.args[:6]) + (others, epi.text())
    ctx.infer(r)
    g.meta["val"] = r.meta["val"][0]
    (fg,) = f.users
    fg.replace_all_uses_with(g)
    ctx.gm.graph.erase_node(fg)
    ctx.gm.graph.erase_node(f)
    r.meta["flydsl"]["sources"] = list(r.meta["flydsl"]["sources"]) + list(f.meta["flydsl"]["sources"])
    ctx.counters["reduce_epilogue_fused"] = ctx.counters.get("reduce_epilogue_fused", 0) + 1
    return 1


__all__ = ["partition", "fuse_elementwise", "fuse_reduce_prologue", "compose", "prune", "epilogue_chain", "val"]
