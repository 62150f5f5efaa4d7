"""Fold shape-only subgraphs: computed once per input shape, then served from a cache.

HF models build their attention masks and position ids on every forward from nothing but
shapes and constants: `new_ones(ids.shape)`, `cumsum`, `arange`, `diff`, `__and__`, `le`,
`index` of a causal buffer, `where`, T5's relative-position buckets. Each is a small op
between our kernels (an extra launch on a GPU), and their result only changes when a shape
does. This pass, run after every lowering, finds the nodes whose values depend only on

- constants (the translated module's parameters and buffers),
- shapes of the inputs (`sym_size`, SymInt arithmetic, and ops that read only an input's
  shape / dtype / device: `new_ones`, `zeros_like`, `full_like`, ...),
- literals,

and replaces the tensors such a region hands to the rest of the graph with one call of a
`FoldedShapes` module: on the first sight of an input-shape key it runs the region (in
PyTorch, as eager would) and caches the results; later calls with the same key return them.
The key is every input shape, dtype and device the region reads, and every SymInt it takes,
so a new batch or sequence length computes its own. Parameters and buffers can change after
translation (`load_state_dict`, an optimizer step, `with torch.no_grad(): p.mul_(2)`) or be
replaced by new objects (`load_state_dict(assign=True)`, `module.pos = nn.Parameter(...)`), so
the constants the region reads stay get_attr nodes of the translated graph, passed to the call
after the inputs (read by name on every forward, as the rest of the graph reads them), and the
cache remembers the identity, data pointer and version counter of each; when any differs on a
forward, the cache is dropped and the region runs again. Identity and storage are held as weak
references, not as `id()` and a data pointer: a tensor freed and a new one made at the same address,
with its storage in the freed block and the same version (`load_state_dict(assign=True)` of a
fresh tensor), compared equal on all three before. A weak reference is dead once its object is, so
the same object and the same storage are the only match. The check is a few compares per forward,
and a causal-mask buffer that never changes never misses.
Random ops and in-place ops are never folded (they are not pure). Folded results are read-only:
a value whose storage some op writes in place, directly or through any view of it (HF DeepSeek-V3
fills `key_states = k_pe.new_empty(...)` through slices), is not shape-only (translator.aliases). The report counts the folded ops as
"folded at specialization".

A FlyDSL op whose inputs are all shape-only is folded too: lowering runs before this pass, so a
matched op can compute a constant of the input shape — Llama's rotary tables are
`inv_freq @ positions` (a bmm) then `cos` / `sin` (elementwise regions), three kernel launches per
forward whose result changes only with the sequence length. In the folded region such an op runs
its family's torch reference (under the reference backend, so no launch is recorded and none is
claimed), once per input-shape key, and the report shows its captured ops as folded; each is
counted as `folded_<family>`.
"""

from __future__ import annotations

import collections
import itertools
import operator
import threading
import weakref

import torch
from translator_kernels.launch import locked

from ..aliases import shape_only_nodes
from ..graph import META_ONLY as _META_ONLY

aten = torch.ops.aten

CACHE_ENTRIES = 32  # input-shape keys kept per folded region (least recently used dropped)


class FoldedShapes(torch.nn.Module):
    """A shape-only region of a translated graph, evaluated once per input-shape key."""

    def __init__(self, gm: torch.fx.GraphModule, sources: list[str], n_constants: int = 0):
        super().__init__()
        self.region = gm
        self.sources = sources  # captured names of the ops folded in (the report's rows)
        self.n_constants = n_constants  # the last n arguments: parameters / buffers the region reads
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stamp = None  # per constant the cached results were computed from: _stamp's tuple
        self.computed = 0  # how many times the region ran (once per new key)

    def __getstate__(self):  # a deep copy (or pickle) has its own lock, and computes its own results
        return {**self.__dict__, "_lock": None, "_cache": collections.OrderedDict(), "_stamp": None}

    def __setstate__(self, d):
        super().__setstate__({**d, "_lock": threading.Lock()})

    def forward(self, *args):
        if any(isinstance(a, torch.SymInt) or _is_fake(a) for a in args):
            return self.region(*args)  # tracing (torch.export, fake propagation): no cache
        n_in = len(args) - self.n_constants
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args[:n_in])
        constants = (*args[n_in:], *self._constants())
        hit = locked(self._lock, self._lookup, key, constants)  # not `with self._lock:` (see locked)
        if hit is not None:
            return hit
        from ..runtime import current, use_backend

        with use_backend("reference", current().arch):  # FlyDSL ops folded in run their torch reference
            out = tuple(self.region(*args))
        locked(self._lock, self._keep, key, out)
        return out

    def _lookup(self, key, constants):
        if not _same(self._stamp, constants):  # a parameter / buffer the region reads changed: recompute
            self._cache.clear()
            self._stamp = [_stamp(t) for t in constants]
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
        return hit

    def _keep(self, key, out):
        self.computed += 1
        self._cache[key] = out
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)

    def _constants(self):
        """Parameters and buffers the region holds itself (a region folded before constants were
        passed as arguments, as a loaded translation may have)."""
        return itertools.chain(self.region.parameters(), self.region.buffers())


def _stamp(t: torch.Tensor) -> tuple:
    """What identifies a constant's value: its object and its storage (weakly: a freed one is never matched
    by a new one at its address), its data pointer (a view moved within the storage) and its version."""
    return weakref.ref(t), weakref.ref(t.untyped_storage()), t.data_ptr(), t._version


def _same(stamps, constants) -> bool:
    if stamps is None or len(stamps) != len(constants):
        return False
    for (tref, sref, ptr, version), t in zip(stamps, constants):
        if tref() is not t or sref() is None or t.data_ptr() != ptr or t._version != version:
            return False
    return True


def _is_fake(a) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(a, FakeTensor)


def fold_shapes(ctx) -> int:
    gm, g = ctx.gm, ctx.gm.graph
    const = shape_only_nodes(gm)
    for n in [n for n in const if n.target is aten._assert_tensor_metadata.default and not n.users]:
        # export's dtype / device assertion on a shape-only value: fixed by construction, and
        # it alone would keep the folded ops alive on the per-forward path
        g.erase_node(n)
        const.discard(n)
    computed = {n for n in const if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)}
    frontier = sorted((n for n in computed if any(u not in const for u in n.users)), key=lambda n: n._sort_key)
    folded = 0
    while frontier:  # one call per group: a value read before some other group's input exists gets its own call
        group, frontier = _placeable(frontier, const)
        folded += _fold(ctx, group, const)
    return folded


def _placeable(frontier, const):
    """(group, rest): the frontier values one call can serve, placed after its region's inputs and before
    its readers; `rest` is what is read before one of those inputs exists (Mixtral's `empty_like` of the
    router's sort output comes late, its causal mask early), served by later calls. A single value is
    always placeable (its region precedes it), so each round makes progress."""
    group, rest = list(frontier), []
    while True:
        region = _region(group, const)
        ins = [i for n in region for i in n.all_input_nodes if i not in region]
        last_in = max((i._sort_key for i in ins), default=None)
        late = [f for f in group if last_in is not None and _first_reader(f, const)._sort_key <= last_in]
        if not late:
            return group, rest
        group = [f for f in group if f not in late]
        rest += late


def _fold(ctx, frontier, const) -> int:
    """Replace the region computing `frontier` with one cached `FoldedShapes` call; its op count."""
    gm, g = ctx.gm, ctx.gm.graph
    region = _region(frontier, const)
    if not any(isinstance(n.meta.get("val"), torch.Tensor) and n.target not in _META_ONLY for n in region):
        return 0
    sub, inputs, n_constants = _subgraph(region, frontier)
    sources = [s for n in region if n.op == "call_function" for s in _captured(n)]
    for n in region:
        if "flydsl" in n.meta:
            ctx.count(f"folded_{n.meta['flydsl']['family']}")
    name = f"_flydsl_folded_{sum(1 for k in gm._modules if k.startswith('_flydsl_folded_'))}"
    gm.add_submodule(name, FoldedShapes(sub, sources, n_constants))
    first_user = min((_first_reader(f, const) for f in frontier), key=lambda u: u._sort_key)
    with g.inserting_before(first_user):
        call = g.call_module(name, tuple(inputs))
    for c in inputs:  # a constant added by a lowering (a preshuffled GEMM weight) may sit later: it
        if c.op == "get_attr" and call < c:  # reads nothing, so it moves up to the call
            call.prepend(c)
    assert all(i < call for i in inputs), f"fold_shapes: {name} placed before an input it reads"
    call.meta["val"] = tuple(f.meta["val"] for f in frontier)
    call.meta["folded"] = sources
    for i, f in enumerate(frontier):
        with g.inserting_after(call):
            item = g.call_function(operator.getitem, (call, i))
        item.meta["val"] = f.meta["val"]
        f.replace_all_uses_with(item, delete_user_cb=lambda u: u not in const)
    ctx.count("fold_shapes", len(sources))
    return len(sources)


def _captured(n) -> list:
    """The captured nodes `n` computes: a FlyDSL node's sources, else itself."""
    if "flydsl" in n.meta:
        return list(n.meta["flydsl"]["sources"])
    return [n.meta.get("orig_name") or n.name]


def _first_reader(n, const):
    return min((u for u in n.users if u not in const), key=lambda u: u._sort_key)


def _region(frontier, const) -> list:
    """Every shape-only node the frontier depends on, in graph order."""
    seen, todo = set(), list(frontier)
    while todo:
        n = todo.pop()
        if n in seen or n not in const:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return sorted(seen, key=lambda n: n._sort_key)


def _subgraph(region, frontier):
    """A GraphModule computing `frontier` from the region's outside inputs (placeholders and
    SymInt nodes read for their shape), then the constants (get_attr nodes) it reads; and how
    many constants there are."""
    sub = torch.fx.Graph()
    env, inputs = {}, []
    constants = [n for n in region if n.op == "get_attr"]
    for x in [i for n in region for i in n.all_input_nodes if i not in region] + constants:
        if x not in env:
            env[x] = sub.placeholder(f"in_{len(inputs)}")
            env[x].meta["val"] = x.meta.get("val")
            inputs.append(x)
    for n in region:
        if n.op != "get_attr":
            env[n] = sub.node_copy(n, lambda x: env[x])
            env[n].meta = dict(n.meta)
    sub.output(tuple(env[f] for f in frontier))
    return torch.fx.GraphModule(torch.nn.Module(), sub), inputs, len(constants)
