"""The per-node table, built from the final graph, and the launches that back it.

`track(gm, inputs)` wraps the pass pipeline. Before it, it notes every captured node
(name, op, shapes, dtype) and its cost (`cost.measure`: FLOPs and bytes on the example
inputs). While the passes run, FX's node hooks record provenance: which node replaced
which (`replace_all_uses_with`), and which new nodes a rewrite created on the way to that
replacement (a loss decomposed into elementwise ops and a mean: those nodes come *from*
the loss). After the pipeline, `Tracking.rows` attributes each captured node to where it
ended in the FINAL graph:

- named in a FlyDSL node's `sources`, or replaced by a node that is: that FlyDSL op;
- still in the graph: PyTorch (with the reason a lowering declined it);
- replaced by other aten nodes left in PyTorch: PyTorch, "rewritten as ...";
- computed by a shape-only region (passes.fold_shapes): "folded" (once per input shape);
- gone with nothing using it (dead code) or folded into its input: "removed".

Nodes a pass created that stay in PyTorch (a cast, part of a decomposition) get their own
rows, naming the captured node they came from. Views (an output aliasing an input, per the
op's schema, e.g. `x.T`) are layout rows, never compute.

A FlyDSL row says "flydsl-kernel" only once a call of the translated module recorded a
kernel launch for its graph node (`Report.observe`, fed by runtime.ops.dispatch through
TranslatedModule.forward). Until then it is "flydsl-op" (not run yet, or run on a backend
that records no launches); a FlyDSL op that ran without launching anything (the reference
backend, a kernel not landed) is "flydsl-reference".
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

from . import cost
from .names import LAYOUT_OPS, describe_shapes, node_dtype, op_name


def is_flydsl(node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace == "flydsl"


def is_layout(node_or_target) -> bool:
    t = getattr(node_or_target, "target", node_or_target)
    return cost.is_view(t) or cost.short_name(t) in LAYOUT_OPS


class Provenance:
    """Which node replaced which, and which created nodes came from which captured node."""

    def __init__(self, gm):
        self.gm = gm
        self.created: dict = {}  # name -> node created while the passes ran
        self.succ = defaultdict(set)  # name -> names of the nodes that took its uses
        self.origin: dict = {}  # created node name -> captured node it came from
        self.flops: dict = {}  # created node name -> its FLOPs (our model, from fake values)

    def __enter__(self):
        self.gm._register_create_node_hook(self._create)
        self.gm._register_replace_node_hook(self._replace)
        return self

    def __exit__(self, *exc):
        self.gm._unregister_create_node_hook(self._create)
        self.gm._unregister_replace_node_hook(self._replace)

    def _create(self, node):
        self.created[node.name] = node

    def _replace(self, old, new, user):
        if new == old.name:
            return
        self.succ[old.name].add(new)
        src = self.origin.get(old.name) or old.meta.get("orig_name") or old.name
        stack = [self.created[new]] if new in self.created else []
        while stack:  # the created nodes that build the replacement come from `src`
            n = stack.pop()
            if n.name in self.origin:
                continue
            self.origin[n.name] = src
            self.flops[n.name] = cost.node_flops(n)
            stack += [a for a in n.all_input_nodes if a.name in self.created and a.name not in self.origin]


class Tracking:
    def __init__(self, gm, flat_inputs):
        self.snapshot = [(n.meta.get("orig_name", n.name), op_name(n), describe_shapes(n), node_dtype(n), n.target)
                         for n in gm.graph.nodes if n.op == "call_function"]
        self.costs = cost.measure(gm, flat_inputs)
        self.prov = Provenance(gm)

    def rows(self, gm, reasons: dict, backend: str, families: dict):
        """(rows, ops): the per-node rows and, per FlyDSL graph node, its cost and what it absorbed."""
        from . import Row

        final = {n.name: n for n in gm.graph.nodes}
        absorber = {}
        for n in gm.graph.nodes:
            if is_flydsl(n):
                for s in n.meta.get("flydsl", {}).get("sources", []):
                    absorber[s] = n.name
        ops = {n.name: _op_entry(n, families) for n in gm.graph.nodes if is_flydsl(n)}
        parts = self._cost_ops(ops, final)
        folded = {s for n in gm.graph.nodes for s in n.meta.get("folded", ())}  # passes.fold_shapes
        rows = []
        for name, op, shapes, dtype, target in self.snapshot:
            f, b = self.costs.get(name, (0, 0))
            layout = is_layout(target)
            if layout and cost.short_name(target) not in cost.NO_ARITHMETIC:
                b = 0  # a view, or shape arithmetic: no traffic
            ends = self._ends(name, absorber, final)
            fly = [e for e in ends if e in ops]
            fly += [p for p in parts.get(name, []) if p not in fly]
            if fly:
                fnode = fly[0]
                entry = ops[fnode]
                if name not in absorber and f"{name} (part)" not in entry["sources"]:
                    entry["sources"].append(f"{name} (result)")
                how = "" if name in absorber else f"; rewritten, result computed by {fnode}"
                if len(fly) > 1:
                    how += f" (parts in {', '.join(fly[1:])})"
                why = reasons.get(name, "")
                detail = entry["head"] + how + (f"; {why}" if why.startswith("not taken by ") else
                                                f"; not taken by {why}" if why else "")
                rows.append(Row(name, op, shapes, dtype, _initial_where(entry, backend), detail, f, layout, fnode,
                                bytes=b))
            elif name in folded:
                rows.append(Row(name, op, shapes, dtype, "folded", "folded at specialization: computed in PyTorch once "
                                "per input shape and cached, not per forward", f, layout, bytes=b))
            elif name in final:
                rows.append(Row(name, op, shapes, dtype, "pytorch", _pytorch_reason(name, op, target, reasons, layout),
                                f, layout, bytes=b))
            elif ends:
                left = [e for e in ends if final[e].op == "call_function"]
                if left:
                    what = ", ".join(f"{op_name(final[e])} ({e})" for e in left)
                    rows.append(Row(name, op, shapes, dtype, "pytorch", f"rewritten as {what}, in PyTorch", f, layout,
                                    bytes=b))
                else:
                    rows.append(Row(name, op, shapes, dtype, "removed", "folded into its input (no work left)", 0,
                                    True))
            else:
                rows.append(Row(name, op, shapes, dtype, "removed", "dead code: nothing uses its result (removed)",
                                0, True))
        rows += self._inserted_rows(gm, {r.node for r in rows})
        for e in ops.values():
            e.pop("head")
        return rows, ops

    def _cost_ops(self, ops, final) -> dict:
        """Each FlyDSL op's FLOPs and absorbed nodes, from its sources; returns, per captured node,
        the FlyDSL ops that compute a part of its decomposition."""
        parts = defaultdict(list)
        for fnode, e in ops.items():
            for src in final[fnode].meta.get("flydsl", {}).get("sources", []):
                if src in self.costs:  # a captured node
                    e["flops"] += self.costs[src][0]
                    e["sources"].append(src)
                    continue
                e["flops"] += self.prov.flops.get(src, 0)  # a node a rewrite created
                o = self.prov.origin.get(src)
                if o and fnode not in parts[o]:
                    parts[o].append(fnode)
                    e["sources"].append(f"{o} (part)")
        return parts

    def _inserted_rows(self, gm, captured) -> list:
        """Rows for the nodes the passes created that stay in PyTorch, naming their origin."""
        from . import Row

        rows = []
        for n in gm.graph.nodes:
            if n.op != "call_function" or is_flydsl(n) or n.name in captured or n.meta.get("flydsl"):
                continue
            layout = is_layout(n)
            src = self.prov.origin.get(n.name)
            rows.append(Row(n.name, op_name(n), describe_shapes(n), node_dtype(n), "pytorch",
                            f"inserted by a pass{f' (from {src})' if src else ''}", 0 if layout else cost.node_flops(n),
                            layout, bytes=cost.node_bytes(n), origin=src or ""))
        return rows

    def _ends(self, name, absorber, final) -> list:
        """The final-graph nodes a captured node's value ended in (FlyDSL nodes first)."""
        if name in absorber:
            return [absorber[name]]
        if name in final:
            return [name]
        seen, todo, ends = {name}, [name], []
        while todo:
            for nxt in self.prov.succ.get(todo.pop(), ()):
                if nxt in seen:
                    continue
                seen.add(nxt)
                if nxt in absorber:
                    ends.append(absorber[nxt])
                elif nxt in final:
                    ends.append(nxt)
                else:
                    todo.append(nxt)
        return sorted(set(ends), key=lambda e: e not in absorber.values())


def _op_entry(n, families) -> dict:
    info = n.meta.get("flydsl", {})
    fam = families.get(info.get("family") or n.target._opname)
    name = fam.name if fam else n.target._opname
    out = cost.tensors(n.meta.get("val"))
    return {"family": name, "lowering": info.get("lowering", ""), "sources": [], "flops": 0,
            "bytes": cost.node_bytes(n), "dtype": str(out[0].dtype).replace("torch.", "") if out else "",
            "kernel_available": fam is not None, "kernel_entry": fam.kernel_entry if fam else "",
            "head": f"flydsl.{name} [{info.get('lowering', '')}]"}


def _initial_where(entry, backend) -> str:
    return "flydsl-reference" if backend == "reference" or not entry["kernel_available"] else "flydsl-op"


def _pytorch_reason(name, op, target, reasons, layout) -> str:
    from ..registry import BY_DESIGN, BY_DESIGN_WHY

    packet = getattr(target, "overloadpacket", None)
    if packet in BY_DESIGN:
        why = BY_DESIGN_WHY.get(packet)
        return "kept in PyTorch by design" + (f": {why}" if why else "")
    if name in reasons:
        return reasons[name]
    if layout:
        return "view/layout op (no arithmetic)"
    return f"no FlyDSL lowering for {op} yet"


@contextlib.contextmanager
def track(gm, flat_inputs):
    """Note the captured graph and its costs, then record provenance while the passes run."""
    t = Tracking(gm, flat_inputs)
    with t.prov:
        yield t
