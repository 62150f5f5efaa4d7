"""Model state across translate()'s internal runs, and what a translation owns.

translate() runs the user's model (the eager check, verification, localization) and the
captured graph (FLOP counting, verification) several times. A model that updates a buffer
in forward (a step counter, running statistics, a cache) would be advanced by each run, so:

- `preserved(module)` snapshots a module's buffers before an internal run and copies them
  back after it, in place (the tensors the user holds stay the same objects). For a graph
  module only the tensors its graph writes are copied. Parameters are
  not copied (that would double the model's memory); a run that writes a parameter is
  detected through its version counter and refused with a clear error, since the model's
  state could not be restored.
- `own_mutable_state(gm)`: torch.export's graph module holds the user's own parameter and
  buffer tensors. Every tensor the graph writes (the target of an in-place op such as
  `aten.copy_`, `aten.index_put_` or `aten.add_`) is replaced in the graph module by a private
  copy, so a translated module never advances the user's buffers nor the reverse: translate()'s
  result is a separate artifact, which owns ONE copy of each such buffer (a KV cache, running
  statistics), written in place by every call, whatever its shapes (one graph serves prefill and
  decode where the capture kept the sequence dim dynamic), and saved / loaded with it. A tensor
  marked with `share(t)` is kept as it is instead: under torch.compile the state is the user's
  own buffer (as dynamo's eager backend does), so every graph dynamo hands over (prefill, decode,
  each recompile) writes the one storage the user holds. Tensors the graph only
  reads (weights) stay shared: copying them would double the memory of every translated
  model, and translated FlyDSL ops that need a different layout (preshuffled GEMM weights)
  already hold their own copies. The extra memory is the size of the mutated buffers.
- `prepared(gm, name, derive, sources)`: such a copy (gm's buffer `name`, made as
  `derive(*sources)` from the user's parameters) follows the parameters: before each forward,
  `refresh_prepared(gm)` compares each source's version counter and data pointer with
  those it was made from (`load_state_dict`, an optimizer step and `p.mul_(2)` under no_grad all
  bump the version) and rebuilds it in place where one differs. A forward where no source changed
  costs one comparison of all sources' stamps (gm's sources are listed once). A parameter object
  replaced (`load_state_dict(assign=True)`) is found by name before (translator.weights.follow),
  which swaps the source (`replace_source`). Not seen: a write through `p.data`
  (`p.data.copy_(w)`: `.data` is a tensor with a version counter of its own, so nothing short of
  reading the data would see it; `refresh_prepared(gm, force=True)`, which the public
  `tm.refresh_weights()` calls, rebuilds every copy). The
  table is weak-keyed by gm: nothing is pickled with it (a loaded module owns its weights); a deep
  copy of the translated module gets a table of its own over the copied weights (`deep_copy`).
- **Lazy prepared weights** (`lazy`, `natural`, `settle`): a prepared copy of every GEMM weight is
  a second copy of the model (1x its bytes: 4 GB for a 1.1 B fp32 Llama), and it is only ever
  read by a FlyDSL kernel. So a lowering may register the copy without making it (`add_constant(None,
  ..., derive=, natural=)`): gm then holds a *placeholder*, a meta tensor of the copy's shape, dtype
  and strides that carries its entry (`derive`, `sources`, and `natural`, the weight in the layout a
  reference computes in: `cast(W)` where the copy is `preshuffle(cast(W))`, a view of W in fp32).
  After the passes, `settle(gm, backend)` makes every copy (`derive(*sources)`, what the passes used
  to do) unless the backend is the reference and the copies would hold more than `LAZY_BYTES`: then
  they stay placeholders, and the reference ops compute from `natural(w)` made per call from the
  user's weights (no preshuffle at translate time, no unshuffle per call, one weight at a time;
  a write to a weight, even through `p.data`, is seen at once). A placeholder that reaches a kernel
  (the backend switched after translation) is made for that call (`resolve_lazy`). A placeholder is
  loud everywhere else (a meta tensor has no data): `materialize(gm)` makes all of gm's copies
  (save, `tm.to()`). The placeholder carries its entry as a Python attribute, so a deep copy of the
  translation carries it too (with the copied model's weights as sources, through deepcopy's memo).
"""

from __future__ import annotations

import contextlib
import operator
import weakref

import torch

from .errors import InputError


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # gm -> _Prepared
_SHARED: dict = {}  # id(tensor) -> weakref: state that translations write in place, never copy (see share)


_VERSION, _PTR = operator.attrgetter("_version"), torch.Tensor.data_ptr
# prepared copies are left unmade on the reference backend when they hold more than this (settle)
LAZY_BYTES = 256 << 20
_LAZY_LIVE: dict = {}  # id(placeholder) -> weakref: any placeholder alive in the process (resolve_lazy's fast test)


def _stamp(tensors) -> tuple:
    """What changes when a held tensor is written (`_version`) or re-pointed (`p.data = ...`): two
    lists made in C by map (a list of pairs costs ~1.5x more)."""
    return list(map(_VERSION, tensors)), list(map(_PTR, tensors))


class _Prepared:
    """gm's prepared buffers: per entry [name, derive, sources, stamp], and every source once with
    the stamp of all of them, so a forward where nothing changed costs one comparison."""

    def __init__(self):
        self.entries: list = []
        self.sources: tuple = ()
        self.stamp: list | None = None

    def add(self, entry):
        self.entries.append(entry)
        seen = {id(t) for t in self.sources}
        self.sources += tuple(t for t in entry[2] if id(t) not in seen and not seen.add(id(t)))
        self.stamp = None  # the next refresh compares every entry with its own stamp, then sets this


def prepared(gm: torch.fx.GraphModule, name: str, derive, sources, natural=None) -> list:
    """Note that gm's buffer `name` is `derive(*sources)`; refresh_prepared rebuilds it when a source changes.
    `derive` must not reference gm (the table is weak-keyed by it). `natural(*sources)`: the weight in the
    layout the op's reference computes in (needed for a lazy entry). Returns the entry."""
    table = _PREPARED.get(gm)
    if table is None:
        table = _PREPARED[gm] = _Prepared()
    entry = [name, derive, tuple(sources), _stamp(sources), natural]
    table.add(entry)
    return entry


def entry_of(gm: torch.fx.GraphModule, name: str) -> list | None:
    """The prepared entry [name, derive, sources, stamp, natural] of gm's buffer `name`, or None."""
    table = _PREPARED.get(gm)
    return next((e for e in table.entries if e[0] == name), None) if table is not None else None


def placeholder(entry: list) -> torch.Tensor:
    """A lazy prepared copy: a meta tensor of `derive(*sources)`'s shape, dtype and strides (derived on
    meta copies of the sources: nothing is computed), carrying its entry."""
    _, derive, srcs, _, natural = entry
    if natural is None:
        raise ValueError("a lazy prepared weight needs `natural` (the layout its reference computes in)")
    t = derive(*(s.detach().to("meta") for s in srcs))
    t._flydsl_lazy = entry
    key = id(t)
    _LAZY_LIVE[key] = weakref.ref(t, lambda _r, key=key: _LAZY_LIVE.pop(key, None))
    return t


def _entry(t):
    return t.__dict__.get("_flydsl_lazy") if type(t) is torch.Tensor and t.device.type == "meta" else None


def is_lazy(t) -> bool:
    return _entry(t) is not None


def device_of(t: torch.Tensor) -> torch.device:
    """Where `t` lives: for a lazy prepared copy, where it is made (its sources' device)."""
    e = _entry(t)
    return t.device if e is None else e[2][0].device


def natural(t):
    """For a lazy prepared weight: the weight in its op's reference layout, made now from the user's
    weights (`entry.natural(*sources)`); None for anything else (a made copy: the reference inverts it)."""
    e = _entry(t)
    return None if e is None else e[4](*e[2])


def resolve_lazy(args: tuple) -> tuple:
    """`args` with every lazy placeholder made (`derive(*sources)`, for this call): a kernel backend met a
    translation whose copies were left unmade (its backend was switched after translate)."""
    if not _LAZY_LIVE:
        return args
    out = []
    for a in args:
        e = _entry(a)
        if e is not None:
            with torch.no_grad():
                a = e[1](*e[2])
        out.append(a)
    return tuple(out)


def materialize(gm: torch.fx.GraphModule, only: str | None = None) -> int:
    """Make every lazy prepared copy of `gm` (or only gm's buffer `only`): the buffer is replaced by
    `derive(*sources)`; returns how many were made."""
    done = 0
    for mod in gm.modules():
        for name, t in list(mod._buffers.items()):
            e = _entry(t)
            if e is None or (only is not None and (mod is not gm or name != only)):
                continue
            with torch.no_grad():
                mod._buffers[name] = e[1](*e[2]).detach()
            e[3] = _stamp(e[2])
            done += 1
    return done


@contextlib.contextmanager
def materialized(gm: torch.fx.GraphModule):
    """gm with its lazy prepared copies made for the body (an export for save), left lazy again after."""
    lazy = [(mod, name, t) for mod in gm.modules() for name, t in mod._buffers.items() if is_lazy(t)]
    materialize(gm)
    try:
        yield gm
    finally:
        for mod, name, t in lazy:
            mod._buffers[name] = t


def settle(gm: torch.fx.GraphModule, backend: str) -> int:
    """After the passes: make the lazy copies, unless `backend` is the reference and they would hold more
    than LAZY_BYTES (then they stay lazy: see the module docstring). Returns how many stay lazy."""
    lazy = [t for t in gm.buffers() if is_lazy(t)]
    if not lazy:
        return 0
    if backend != "reference" or sum(t.numel() * t.element_size() for t in lazy) <= LAZY_BYTES:
        materialize(gm)
        return 0
    return len(lazy)


def deep_copy(gm: torch.fx.GraphModule, memo: dict, copy_all):
    """`copy_all()` (a deep copy of what holds gm, through `memo`), with gm's copy given the prepared table
    of gm, each entry's sources the copied weights (through the memo). A source that is a view of a
    weight (GPT-2's Conv1D `weight.t()`) is copied as the same view of the copied weight, so a write to
    that weight moves what refresh_prepared compares. An entry stale in gm (a source written since its
    last forward) is stale in the copy: its next forward remakes it. Returns copy_all()'s result."""
    import copy

    table = _PREPARED.get(gm)
    with torch.no_grad():
        for s in table.sources if table is not None else ():
            if s._base is not None and id(s) not in memo:
                memo[id(s)] = copy.deepcopy(s._base, memo).as_strided(s.size(), s.stride(), s.storage_offset())
    out = copy_all()
    new_gm = memo[id(gm)]
    if table is not None:
        new = _PREPARED[new_gm] = _Prepared()
        for entry in table.entries:  # a lazy placeholder's entry is the same list: copied once, through the memo
            e = copy.deepcopy(entry, memo)
            e[3] = _stamp(e[2]) if entry[3] == _stamp(entry[2]) else None
            new.add(e)
    for t in new_gm.buffers():
        if is_lazy(t):  # resolve_lazy's fast test must see the copy's placeholders too
            key = id(t)
            _LAZY_LIVE[key] = weakref.ref(t, lambda _r, key=key: _LAZY_LIVE.pop(key, None))
    return out


def sources(gm: torch.fx.GraphModule) -> list:
    """The tensors gm's prepared buffers are made from."""
    table = _PREPARED.get(gm)
    return list(table.sources) if table is not None else []


def replace_source(gm: torch.fx.GraphModule, old: torch.Tensor, new: torch.Tensor) -> None:
    """`old` was replaced by `new` (a parameter object replaced): what was made from it is remade from `new`."""
    table = _PREPARED.get(gm)
    if table is None:
        return
    for entry in table.entries:
        if any(s is old for s in entry[2]):
            entry[2] = tuple(new if s is old else s for s in entry[2])
            entry[3] = None
    table.sources = tuple(new if s is old else s for s in table.sources)
    table.stamp = None  # the next refresh_prepared walks the entries


def refresh_prepared(gm: torch.fx.GraphModule, force: bool = False) -> int:
    """Rebuild, in place, the prepared buffers of `gm` whose sources changed (all of them with
    `force`: after a write the version counter does not see, `p.data.copy_(...)`); returns how many."""
    table = _PREPARED.get(gm)
    if table is None:
        return 0
    now = _stamp(table.sources)
    if now == table.stamp and not force:  # the common case: no source written or re-pointed since the last forward
        return 0
    done = 0
    for entry in table.entries:
        name, derive, sources, stamp = entry[:4]
        now_e = _stamp(sources)
        if now_e == stamp and not force:
            continue
        buf = getattr(gm, name, None)
        if buf is not None and not is_lazy(buf):  # None: the lowering that made it was undone (cleanup dropped
            # it); a lazy one is made from the sources at each call
            with torch.no_grad():
                buf.copy_(derive(*sources))
            done += 1
        entry[3] = now_e
    table.stamp = now
    return done


def _buffers(module: torch.nn.Module) -> list:
    """The tensors a run of `module` may advance: for a graph module (or a translated module's
    graph) exactly those its graph writes, so large read-only buffers such as preshuffled
    weights are never copied; for a user's model every buffer and every plain tensor attribute
    (its code is opaque; torch.export captures such an attribute as a constant, and a run that
    advanced it left the translation starting from the advanced value)."""
    gm = module if isinstance(module, torch.fx.GraphModule) else getattr(module, "gm", None)
    if isinstance(gm, torch.fx.GraphModule):
        return [(t, tensor_at(gm, t)) for t in written_targets(gm)]
    out = [(n, b) for n, b in module.named_buffers(remove_duplicate=True) if isinstance(b, torch.Tensor)]
    seen = {id(b) for _, b in out}
    for prefix, m in module.named_modules():  # plain tensor attributes (`self.acc = torch.zeros(...)`): state too
        for k, v in vars(m).items():
            if type(v) is torch.Tensor and id(v) not in seen:
                seen.add(id(v))
                out.append((f"{prefix}.{k}" if prefix else k, v))
    return out


def tensor_at(gm: torch.fx.GraphModule, target: str) -> torch.Tensor:
    """gm's tensor at a get_attr target (`"bn.running_mean"`)."""
    owner, _, attr = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, attr)


def written_targets(gm: torch.fx.GraphModule) -> list[str]:
    """The get_attr targets `gm`'s graph writes in place: an in-place op's mutable argument, or the
    base of a view chain it writes through (`self.cache[:, :, 4:6] = k` writes a slice of the buffer)."""
    written = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        for arg, a in zip(n.target._schema.arguments, n.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(a, torch.fx.Node):
                while a.op == "call_function" and isinstance(a.target, torch._ops.OpOverload) and a.args \
                        and isinstance(a.args[0], torch.fx.Node) \
                        and any(r.alias_info is not None for r in a.target._schema.returns):
                    a = a.args[0]  # a view: the write reaches its base
                if a.op == "get_attr":
                    written.add(a.target)
    return sorted(written)


@contextlib.contextmanager
def preserved(*modules: torch.nn.Module):
    """Run the body, then put every buffer of `modules` back to its value before it."""
    saved = [(m, [(n, b, b.detach().clone(), b._version) for n, b in _buffers(m)],
              [(n, p, p._version) for n, p in m.named_parameters()]) for m in modules]
    try:
        yield
    finally:
        for m, bufs, params in saved:
            for _name, b, copy, version in bufs:
                if b._version != version:
                    with torch.no_grad():
                        b.copy_(copy)
            changed = [n for n, p, v in params if p._version != v]
            if changed:
                raise InputError(
                    f"the model writes its parameter(s) {', '.join(changed)} in forward; translate() cannot run "
                    "such a model without changing it — register that state as a buffer "
                    "(self.register_buffer) instead of a Parameter")


def share(t: torch.Tensor) -> None:
    """Mark `t` as state that a translation writes where it is (own_mutable_state leaves it)."""
    if id(t) not in _SHARED or _SHARED[id(t)]() is not t:
        key = id(t)
        _SHARED[key] = weakref.ref(t, lambda _r, key=key: _SHARED.pop(key, None))


def is_shared(t) -> bool:
    ref = _SHARED.get(id(t))
    return ref is not None and ref() is t


def rebind(module: torch.nn.Module, old: torch.Tensor, new: torch.Tensor) -> int:
    """Every buffer slot of `module` (and its submodules) that holds `old` holds `new` instead."""
    done = 0
    for m in module.modules():
        for k, v in m._buffers.items():
            if v is old:
                m._buffers[k] = new
                done += 1
    return done


def own_mutable_state(gm: torch.fx.GraphModule) -> list[str]:
    """Give `gm` private copies of the tensors its graph writes in place, except shared ones
    (`share`); returns the names of all tensors it writes."""
    written = written_targets(gm)
    for target in written:
        owner, _, attr = target.rpartition(".")
        mod = gm.get_submodule(owner) if owner else gm
        t = getattr(mod, attr)
        if is_shared(t):
            continue
        copy = t.detach().clone()
        if isinstance(t, torch.nn.Parameter):
            setattr(mod, attr, torch.nn.Parameter(copy, requires_grad=t.requires_grad))
        elif attr in mod._buffers:
            mod._buffers[attr] = copy
        else:
            setattr(mod, attr, copy)
    return written
