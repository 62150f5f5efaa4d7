"""The translated module follows its model's weights: objects replaced by name, storages re-pointed.

A translation shares the weights it reads with the user's model (translator.state): the graph
module holds the very Parameter objects, and each prepared copy (a preshuffled GEMM weight, an
arranged gated weight, an einsum's permuted weight) remembers the tensors it was derived from.
Updates in place reach it through version counters (state.refresh_prepared). Two other changes
would leave the graph and the prepared copies computing with what they were given, a silent wrong
answer, so they are looked for when a forward starts (`follow`, before refresh_prepared):

- A parameter OBJECT replaced: `model.load_state_dict(sd, assign=True)`, `model.fc.weight =
  nn.Parameter(w)`, `model.fc = nn.Linear(...)`, a direct dict write `module._parameters[name] =
  new` (accelerate's set_module_tensor_to_device, quantization libraries, `.to()` under
  `torch.__future__.set_overwrite_module_params_on_conversion(True)`), the same on the translated
  module (`tm.load_state_dict(sd, assign=True)`, `tm.gm.wte.weight = ...`). Every one of them
  writes an entry of a `_parameters`, `_buffers` or `_modules` dict.
- A storage RE-POINTED under the same object: `m.double()`, `m.half()`, `m.to(device)` (torch's
  `_apply` sets `param.data`), `p.data = w`, a tied Parameter's `.data` re-pointed. The version
  counter does not move; the data pointer does.

What is watched (`_watch`, after translate() and after each look): every dict on the path of every
tracked name in the model, and in gm of the sources of prepared copies (gm's other weights are read
from its dicts on every forward anyway): the owner's `_parameters` / `_buffers` and the `_modules`
of each module above it, as a shallow snapshot compared with the dict, one C-level list-of-dicts
`==` that meets each value by identity first; the data pointer of each tracked tensor; and each
tracked storage through a weak reference whose callback notes its death (a storage freed and
another allocated at its address, which caching allocators do at once, would otherwise look
unchanged). Nothing process-wide: no torch registration hook (importing the translator used to
install global ones, bumped by any module of the process, which dynamo guarded on: a compiled HF
static cache, which registers buffers inside the compiled region, recompiled on every call), and
nothing dynamo traces (the look runs inside the translated forward, a backend's compiled callable).

When something moved, each name is resolved again. A name that resolves to another object:

- in `gm` (replaced on the translated module): that tensor is used;
- else in the model (replaced on the user's model): it is written into `gm` too (directly into
  the owner's parameter / buffer dict: the user's model is never written);

and the prepared copies made from the old tensor are rebuilt from the new one
(state.replace_source); a storage re-pointed rebuilds the copies made from it the same way. A copy
made from a view of a parameter (GPT-2's Conv1D weight is read as `weight.t()`) is tracked through
the view's base, and the same view (`as_strided`, same geometry) of the new object or storage
becomes its source. A weight whose shape, dtype or device is no longer the one it had at
translation (whether its object was replaced or its storage re-pointed), or a replacement that
unties weights the captured graph reads as one tensor, cannot be served by kernels specialized at
translation: a clear error asks to convert back or translate again, on every forward until undone.

Not seen: a write through `.data` (`p.data.copy_(w)`: `.data` is another tensor with its own
version counter; only reading the data would see it): `tm.refresh_weights()` re-reads everything.
A loaded translated module owns its weights; a deep copy follows its copied model the same way.
Per-forward cost: docs/host-overhead.md.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from . import state
from .errors import InputError

_TRACKED: dict = {}  # id(gm) -> _Tracked, dropped when gm dies (a plain dict: a weak-dict lookup costs ~1 us)
_PTR = torch.Tensor.data_ptr
# CUDA / ROCm builds of torch: the data pointers of a list of tensors compared with a list of ints in one
# C call (what CUDA-graph trees check their inputs with), ~10x fewer Python calls than map(data_ptr)
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


class _Tracked:
    __slots__ = ("model", "weights", "gm_own", "moved", "dicts", "snapshots", "singles", "objs", "ptrs", "refs",
                 "every")

    def __init__(self, model, weights, gm_own):
        self.model = weakref.ref(model)
        # [held tensor, its names in the model, its name in gm or None, model's object, None or the
        # geometry of the held tensor as a view of the model's object, (shape, dtype, device) of the
        # model's object at translation, its data pointer when last looked at]
        self.weights = weights
        self.gm_own = gm_own  # [(name, shape, dtype, device)] of gm's own tensors (prepared copies, constants)
        self.moved: set = set()  # indices of weights whose storage died; -1: tm.to() & co. (see changed)
        self.dicts: list = []  # the dicts on the paths of the tracked names (see _watch)
        self.snapshots: list = []  # a shallow copy of each, taken at the last look
        self.singles: list = []  # [(dict, key, tensor)] for one-element tensors (see _watch)
        self.objs: list = []  # the tracked tensors whose data pointers are compared
        self.ptrs: list = []
        self.every: list = []  # range(len(objs)) as a list: the indices _PTRS_EQUAL compares
        self.refs: list = []  # weak references to the tracked storages (their callbacks fill `moved`)

    def unchanged(self) -> bool:
        """No storage died, no dict entry replaced, no data pointer moved since the last look."""
        if self.moved:
            return False
        try:  # dict equality in C: the same objects compare equal without calling Tensor.__eq__
            if self.snapshots != self.dicts:
                return False
        except Exception:  # noqa: BLE001 — a replaced entry: Tensor.__eq__ of two tensors raised
            return False
        if self.singles and not all(d.get(k) is v for d, k, v in self.singles):
            return False
        if _PTRS_EQUAL is not None:
            return _PTRS_EQUAL(self.objs, self.ptrs, self.every)
        return list(map(_PTR, self.objs)) == self.ptrs


def _tensors(module):
    return itertools.chain(module.named_parameters(remove_duplicate=False),
                           module.named_buffers(remove_duplicate=False))


def _meta(t):
    return tuple(t.shape), t.dtype, state.device_of(t)  # a lazy prepared copy: its sources' device


def track(gm: torch.fx.GraphModule, model: torch.nn.Module) -> int:
    """Note the weights `gm` shares with `model` by name; returns how many."""
    in_model, in_gm = {}, {}
    for name, t in _tensors(model):
        in_model.setdefault(id(t), (t, []))[1].append(name)
    for name, t in _tensors(gm):
        in_gm.setdefault(id(t), name)
    held = {id(t): t for _, t in _tensors(gm)} | {id(t): t for t in state.sources(gm)}
    weights = [[t, in_model[i][1], in_gm.get(i), t, None, _meta(t), None] for i, t in held.items() if i in in_model]
    for i, t in held.items():  # a prepared copy made from a view of a parameter (GPT-2 Conv1D's weight.t())
        base = t._base
        if i not in in_model and base is not None and id(base) in in_model:
            geometry = (tuple(base.shape), base.stride(), tuple(t.shape), t.stride(),
                        t.storage_offset() - base.storage_offset())
            weights.append([t, in_model[id(base)][1], None, base, geometry, _meta(base), None])
    shared = {id(w[0]) for w in weights}
    gm_own = [(name, *_meta(t)) for name, t in _tensors(gm) if id(t) not in shared]
    if weights:
        if id(gm) not in _TRACKED:
            weakref.finalize(gm, _TRACKED.pop, id(gm), None)
        _TRACKED[id(gm)] = t = _Tracked(model, weights, gm_own)
        _watch(t, gm, model)
    return len(weights)


def changed(gm: torch.fx.GraphModule) -> None:
    """`gm`'s tensors were converted in bulk (TranslatedModule._apply): its next forward looks at all."""
    t = _TRACKED.get(id(gm))
    if t is not None:
        t.moved.add(-1)


def _watch(t: _Tracked, gm, model) -> None:
    """Snapshot what a change would move (see the module docstring). `snapshots == dicts` compares
    each value by identity first, in C; a replaced multi-element tensor makes Tensor.__eq__ raise
    (also "changed"), but a one-element one could compare equal by value, so those are checked one by one."""
    sources = {id(s) for s in state.sources(gm)}
    dicts = {}
    for held, names, gm_name, *_ in t.weights:
        mine = [(gm, gm_name)] if gm_name and id(held) in sources else []
        for module, name in ([(model, n) for n in names] if model is not None else []) + mine:
            for d in _path_dicts(module, name):
                dicts.setdefault(id(d), d)
    dicts = list(dicts.values())
    t.singles = [(d, k, v) for d in dicts for k, v in d.items() if isinstance(v, torch.Tensor) and v.numel() == 1]
    one = {id(d) for d, _, _ in t.singles}
    t.dicts = [d for d in dicts if id(d) not in one]
    t.snapshots = [dict(d) for d in t.dicts]
    objs, refs, moved = {}, [], t.moved
    for i, w in enumerate(t.weights):
        seen = w[3]
        try:
            w[6] = seen.data_ptr()
            storage = seen.untyped_storage()
        except Exception:  # noqa: BLE001 — a tensor subclass without storage: its object is still followed
            w[6] = None
            continue
        objs.setdefault(id(seen), seen)
        if w[0] is not seen:
            objs.setdefault(id(w[0]), w[0])
        refs.append(weakref.ref(storage, lambda _ref, i=i: moved.add(i)))
    t.objs = list(objs.values())
    t.ptrs = list(map(_PTR, t.objs))
    t.every = list(range(len(t.objs)))
    t.refs = refs
    moved.clear()


def follow(gm: torch.fx.GraphModule, force: bool = False) -> None:
    """Adopt weights replaced or re-pointed since the last look (all of them with `force`); see the
    module docstring."""
    t = _TRACKED.get(id(gm))
    if t is None or (not force and t.unchanged()):
        return
    model, moved = t.model(), set(t.moved)
    for name, *meta in t.gm_own if -1 in moved else ():  # tm.half() converts the prepared copies too
        own = _resolve(gm, name)
        if isinstance(own, torch.Tensor):
            _check_meta(own, meta, f"the translated module's own {name}")
    for i, w in enumerate(t.weights):
        held, names, gm_name, seen, view, meta, ptr = w
        new = _resolve(gm, gm_name) if gm_name else held
        now = seen
        if new is held and model is not None:
            found = {id(o): o for o in (_resolve(model, n) for n in names) if o is not None}
            if len(found) > 1:
                raise InputError(f"the model's {', '.join(names)} were one tensor when it was translated and are "
                                 "now different tensors: the translated graph reads them as one; translate again")
            now = next(iter(found.values()), seen)
        if isinstance(now, torch.Tensor):
            _check_meta(now, meta, names[0])
        repointed = force or i in moved or ptr is None or now is not seen or _ptr(now) != ptr
        if view and repointed and isinstance(now, torch.Tensor):
            new = _view_of(now, view, names[0])
        elif new is held and now is not seen:
            new = now
        if new is not held and isinstance(new, torch.Tensor):
            _check_meta(new, meta if not view else _meta(held), gm_name or names[0])
            if now is not seen and gm_name:
                _assign(gm, gm_name, now)
            state.replace_source(gm, held, new)
            w[0], w[3] = new, now  # only once checked: after an error the next forward raises it again
        elif repointed:
            state.replace_source(gm, held, held)  # its storage changed: the copies made from it are remade
    _watch(t, gm, model)  # only once all were adopted: after an error the next forward looks again


def _ptr(t):
    try:
        return t.data_ptr()
    except Exception:  # noqa: BLE001
        return None


def _path_dicts(module, name):
    """The dicts a change of `name` in `module` writes: `_modules` of each module above its owner,
    and the owner's `_parameters` / `_buffers` (where the name resolves)."""
    *path, leaf = name.split(".")
    out = []
    for p in path:
        if not isinstance(module, torch.nn.Module):
            return out
        out.append(module._modules)
        module = module._modules.get(p)
    if isinstance(module, torch.nn.Module):
        out.append(module._parameters if module._parameters.get(leaf) is not None else module._buffers)
    return out


def _owner(module, name):
    """(the dict that holds `name`'s tensor, its key), or None where the name does not resolve."""
    *path, leaf = name.split(".")
    for p in path:
        module = module._modules.get(p) if isinstance(module, torch.nn.Module) else None
    if not isinstance(module, torch.nn.Module):
        return None
    return (module._parameters if module._parameters.get(leaf) is not None else module._buffers), leaf


def _resolve(module, name):
    owner = _owner(module, name)
    return owner[0].get(owner[1]) if owner is not None else None


def _assign(gm, name, tensor):
    """Point gm's `name` at `tensor`, without announcing it as a new registration."""
    owner, _, leaf = name.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = tensor


def _view_of(base, geometry, name):
    """The view of the new `base` that the translation's copy was made from, as it was of the old one."""
    shape, stride, size, view_stride, offset = geometry
    if base.stride() != stride:
        raise InputError(f"{name} now has strides {base.stride()}, the translation reads it with strides {stride}: "
                         "assign a contiguous tensor (w.contiguous()), or translate again")
    with torch.no_grad():
        return base.as_strided(size, view_stride, base.storage_offset() + offset)


def _check_meta(new, meta, name):
    shape, dtype, device = meta
    if (tuple(new.shape), new.dtype, new.device) != (shape, dtype, device):
        raise InputError(
            f"{name} is now a tensor of shape {list(new.shape)} {str(new.dtype)[6:]} on {new.device}; the translation "
            f"was made for shape {list(shape)} {str(dtype)[6:]} on {device} (its kernels and prepared weights are "
            "specialized to it). The model was converted (m.double(), m.half(), m.to(...)) or given a weight of "
            "another shape, dtype or device after translate(): convert it back, or translate again with the "
            "model as it is now")
