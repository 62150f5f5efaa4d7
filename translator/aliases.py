"""Alias analysis by storage: which nodes of a graph share memory, and which of them some op writes.

FX edges carry data flow, not memory: `ks = x.new_empty(...); ks[..., :16].copy_(k); y = ks * 2`
has no edge from the `copy_` to `y`, yet `y` reads what the `copy_` wrote (HF DeepSeek-V3 builds
its query / key states that way). A pass that caches a value (fold_shapes), fuses nodes into one
kernel placed elsewhere (partition) or reorders nodes must see a write made through *any* view of
a storage. Two sources say that two nodes share a storage, and either suffices:

- the op schemas: a result annotated as an alias (`Tensor(a)`: slice, select, view, transpose,
  unsqueeze, expand, `to` of the same dtype, ...) shares its first tensor argument's storage;
  `getitem` of a list of views (split, unbind, chunk) shares its list's; `_unsafe_view` too (it
  is a view, though its schema does not say so). Unknown callables are assumed to alias their
  first tensor argument.
- the fake tensors in `node.meta["val"]`: torch.export's fake mode gives a view the untyped
  storage of its base (checked on torch 2.13), so a view reached another way is still seen.

The classes are the connected components of those two relations (a union-find over the graph).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from .graph import META_ONLY, arg, is_pure

aten = torch.ops.aten


def _returns_alias(n: Node) -> bool:
    t = n.target
    if n.op != "call_function":
        return False
    if t is operator.getitem:
        return isinstance(n.args[0], Node) and _returns_alias(n.args[0])
    if t is aten._unsafe_view.default:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return getattr(t, "__module__", "") not in ("_operator", "operator", "math", "torch.sym")
    return any(r.alias_info is not None for r in t._schema.returns)


def _storages(v) -> list:
    """Identities of the storages behind a node's fake value (a tensor or a list of tensors)."""
    vals = v if isinstance(v, (list, tuple)) else [v]
    out = []
    for t in vals:
        if isinstance(t, torch.Tensor):
            try:
                out.append(t.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
                pass
    return out


def storage_classes(graph: torch.fx.Graph) -> dict[Node, Node]:
    """Each node -> the representative of the nodes sharing its storage."""
    parent: dict[Node, Node] = {}

    def find(n):
        parent.setdefault(n, n)
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[ra] = rb

    by_storage: dict[int, Node] = {}
    for n in graph.nodes:
        find(n)
        if _returns_alias(n):
            src = n.args[0] if n.target is operator.getitem else next(iter(n.all_input_nodes), None)
            if isinstance(src, Node):
                union(n, src)
        for s in _storages(n.meta.get("val")):
            if s in by_storage:
                union(n, by_storage[s])
            else:
                by_storage[s] = n
    return {n: find(n) for n in graph.nodes}


def written_args(n: Node) -> list[Node]:
    """The tensor arguments node `n` writes in place (none for a pure op)."""
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
        return []
    out = []
    for a in t._schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            w = arg(n, a.name, None)
            out.extend(x for x in (w if isinstance(w, (list, tuple)) else [w]) if isinstance(x, Node))
    return out


def writes(graph: torch.fx.Graph, classes: dict | None = None) -> list[tuple[Node, set]]:
    """(writer, every node sharing a storage it writes, itself included) for each in-place op."""
    classes = classes if classes is not None else storage_classes(graph)
    members: dict[Node, set] = {}
    for n, r in classes.items():
        members.setdefault(r, set()).add(n)
    out = []
    for n in graph.nodes:
        ws = written_args(n)
        if ws:
            out.append((n, set().union(*(members[classes[w]] for w in ws)) | {n}))
    return out


def written_nodes(graph: torch.fx.Graph) -> set[Node]:
    """Every node whose storage some op of the graph writes in place (through any view)."""
    if not any(written_args(n) for n in graph.nodes):
        return set()  # the common case: no in-place op left in the graph
    return set().union(*(touched for _, touched in writes(graph)))


def shape_only_nodes(gm) -> set:
    """Nodes whose value depends on no tensor data of the graph's inputs, and whose storage no op
    of the graph writes in place through any view (`ks = x.new_empty(...)` filled by
    `ks[..., :16].copy_(k)` holds data). The fold_shapes pass serves them from a cache; a lowering
    leaves them to it."""
    const, written = set(), written_nodes(gm.graph)
    for n in gm.graph.nodes:
        if n in written:
            continue
        if n.op == "get_attr":
            const.add(n)
        elif is_pure(n):
            ins = n.all_input_nodes
            if n.target in META_ONLY:
                ins = [i for i in ins if not isinstance(i.meta.get("val"), torch.Tensor)]
            if all(i in const for i in ins):
                const.add(n)
    return const
