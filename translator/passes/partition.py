"""Partitioning: group fusable elementwise nodes into regions, one kernel each.

Runs after the canonical lowerings (gemm, norms, softmax ... are already `flydsl.*` nodes)
and before the consumer folds. What may join a region, and the rewrite of a whole region, come
from the registry's region rules (translator.lowerings.elementwise registers the one for
`flydsl.fused_elementwise`). Walking the graph in order, each fusable node joins the
regions of its fusable producers when the union stays legal:

- convex: no path leaves the region and comes back into it (through a PyTorch op or another
  FlyDSL node); otherwise contracting it into one node would make a cycle. Checked with
  networkx ancestor sets of the region's external inputs on the captured graph.
- ordered around writes: a region never spans an in-place op left in the graph (one whose
  mutation is observable, so functionalize kept it: `v = h.view(...); v.add_(1); h * 3`) when a
  member reads or produces the written storage (the written tensor, its base, any view of that
  base: translator.aliases). FX edges do not carry the write: `h * 3` reads `h`, not the `add_`, so
  without this rule `x * 2` and `h * 3` would fuse into one kernel that never sees the write. Nor
  may the re-sort after fusion move an in-place op, or a reader past one, that sits between the
  members and reads one of them (`moves_across_a_write`).
- one shape: every value used outside the region has the region's full (broadcast) shape.
  Such a value becomes an extra output of the fused kernel, never recomputed or lost;
  smaller intermediates (a scaled bias) are recomputed per element inside the kernel.

Left alone for the consumer stage: the nodes a consumer rule claims (translator.registry
`Rule.claims`): a residual add that a FlyDSL norm takes in (norm_residual.py). The code after a
`flydsl.gemm` does join regions: the consumer stage folds the region that reads a gemm into its
epilogue (translator/lowerings/gemm_epilogue.py), as it folds regions into reductions and scans,
so `linear -> gelu -> clamp` is one GEMM.

Left alone for fold_shapes: nodes whose value depends only on shapes and constants
(passes.fold_shapes `shape_only_nodes`: a causal mask, T5's relative-position buckets, position
ids built from `new_ones`). A kernel there would run on every forward and, being a FlyDSL op, cut
the shape-only region in two, so the ops after it would stay per-forward PyTorch ops; left out,
the whole region is computed once per input shape.

Bypassed first: `x.to(x.dtype)`, `type_as` of the same dtype and `alias`, which return their input
itself in eager. As region members they would be copied out as an extra output, and they would tie
the region to the producer of their input (`mask.long()` read by both a cumsum and `mask == 0`: the
comparison could not join the region after the cumsum). Dropped too: export's
`_assert_tensor_metadata` on a value a region computes (the kernel stores the captured dtype on the
captured device by construction); it alone would make the value an extra output of the kernel.

A region is rewritten only if it holds a real op (a lone eval dropout is not a kernel). The
fused node goes after the region's last member; the graph is then re-sorted topologically
(stable), since users of an early member may sit before a later member's inputs.
"""

from __future__ import annotations

import itertools

import networkx as nx

from ..graph import arg, full_shape, in_order, shape_of, stable_toposort
from ..registry import REGION_RULES, Stage, rules_for
from .. import aliases
from ..aliases import shape_only_nodes


def writes(gm) -> list[tuple[int, set]]:
    """(position, storage nodes) of each node that writes a tensor argument in place (translator.aliases:
    the written tensor, its base, every view of that base, by op schema and by fake storage)."""
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    return [(pos[w], touched) for w, touched in aliases.writes(gm.graph)]


class _Partitioner:
    def __init__(self, gm):
        self.g = nx.DiGraph()
        self.pos = {}
        for n in gm.graph.nodes:
            self.pos[n] = len(self.pos)
            self.g.add_node(n)
            for i in n.all_input_nodes:
                self.g.add_edge(i, n)
        self._anc = {}
        self.order = list(gm.graph.nodes)
        self.writes = writes(gm)
        self.writers = {self.order[p] for p, _ in self.writes}

    def spans_a_write(self, region: set) -> bool:
        """Some in-place op sits between members, and a member reads or produces what it writes."""
        lo, hi = min(self.pos[m] for m in region), max(self.pos[m] for m in region)
        for pos, touched in self.writes:
            if lo < pos < hi and any(m in touched or touched.intersection(m.all_input_nodes) for m in region):
                return True
        return False

    def moves_across_a_write(self, region: set) -> bool:
        """The fused node goes after the last member, so a node between the members that reads one of
        them moves after it too (the re-sort): it must be no in-place op, and no in-place op it would
        move past may write what it reads (`a = x * 2; buf[:, :4].copy_(a[:, :4]); r = buf.softmax(-1);
        c = a + 3` put the copy after the softmax)."""
        lo, hi = min(self.pos[m] for m in region), max(self.pos[m] for m in region)
        inside = [(p, touched) for p, touched in self.writes if lo < p < hi]
        if not inside:
            return False
        for n in self.order[lo + 1:hi]:
            if n in region or not (self.ancestors(n) & region):
                continue  # stays where it is
            if n in self.writers:
                return True
            reads = {n, *n.all_input_nodes}
            if any(p > self.pos[n] and reads & touched for p, touched in inside):
                return True
        return False

    def ancestors(self, n):
        if n not in self._anc:
            self._anc[n] = nx.ancestors(self.g, n)
        return self._anc[n]

    def legal(self, region: set) -> bool:
        if self.writes and (self.spans_a_write(region) or self.moves_across_a_write(region)):
            return False
        for m in region:
            for i in m.all_input_nodes:
                if i not in region and self.ancestors(i) & region:
                    return False  # a path leaves the region and re-enters it at m
        shapes = [shape_of(m) for m in region]
        full = full_shape(shapes)
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
    ids = itertools.count()
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
        rid = next(ids)
        regions[rid] = mine
        for m in mine:
            region_of[m] = rid
    return [in_order(r) for r in regions.values()]


def claimed(ctx) -> set:
    """Nodes the consumer rules will fold into a FlyDSL node; they stay out of regions."""
    out = set()
    for r in rules_for(Stage.CONSUMER):
        if r.claims is None:
            continue
        for n in list(ctx.gm.graph.nodes):
            if n.op == "call_function" and n.target in r.targets:
                out.update(r.claims(n, ctx))
    return out


def fuse_regions(ctx) -> int:
    """The pipeline pass: for each region rule, partition its fusable nodes, then rewrite each
    region into one FlyDSL node."""
    count = 0
    for rr in REGION_RULES:
        count += _fuse(ctx, rr, claimed(ctx) | shape_only_nodes(ctx.gm))
    if count:
        stable_toposort(ctx.gm.graph)
    return count


ALIASES = ("aten.to.dtype", "aten.type_as.default", "aten.alias.default")  # eager returns the input itself


def bypass_aliases(ctx, nodes) -> set:
    """Replace the same-dtype casts and aliases among `nodes` by their input; returns those left."""
    left = set()
    for n in nodes:
        for u in list(n.users):
            if str(u.target) == "aten._assert_tensor_metadata.default" and not u.users:
                ctx.gm.graph.erase_node(u)
        src = n.args[0]
        same = getattr(n.meta.get("val"), "dtype", None) == getattr(src.meta.get("val"), "dtype", 0)
        if str(n.target) in ALIASES and same and isinstance(src, type(n)):
            n.replace_all_uses_with(src)
            ctx.gm.graph.erase_node(n)
            ctx.count("alias_bypassed")
        else:
            left.add(n)
    return left


def _fuse(ctx, rr, skip) -> int:
    gm = ctx.gm
    fusable = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in rr.targets or n in skip:
            continue
        if ctx.denied([n]):
            ctx.not_lowered(n, ctx.denied([n]))
            continue
        reason = rr.supported(n)
        if reason:
            ctx.not_lowered(n, f"{rr.name}: {reason}")
            continue
        fusable.add(n)
    fusable = bypass_aliases(ctx, fusable)
    count = 0
    for members in partition(gm, fusable):
        if all(rr.trivial(m) for m in members):
            continue
        region = set(members)
        outputs = [m for m in members if any(u not in region for u in m.users)]
        if not outputs:
            continue
        rr.rewrite(ctx, members, outputs, members[-1])
        count += 1
    return count
