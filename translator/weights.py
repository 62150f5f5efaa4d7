"""The translated module follows its model's weights by name, when parameter objects are replaced.

A translation shares the weights it reads with the user's model (translator.state): the graph
module holds the very Parameter objects, and each prepared copy (a preshuffled GEMM weight, an
arranged gated weight, an einsum's permuted weight) remembers the tensors it was derived from.
Updates in place reach it through version counters (state.refresh_prepared). A parameter OBJECT
replaced is another matter: `model.load_state_dict(sd, assign=True)`, `model.fc.weight =
nn.Parameter(w)`, `model.fc = nn.Linear(...)`, the same on the translated module
(`tm.load_state_dict(sd, assign=True)`, `tm.gm.wte.weight = ...`), or `tm.to()` under
`torch.__future__.set_overwrite_module_params_on_conversion(True)`. Left alone, the graph and the
prepared copies would keep computing with the old tensors: a silent wrong answer.

So `track(gm, model)` notes, at the end of translate(), each weight the translation holds (read by
the graph or a source of a prepared copy) with its names in the user's model and in `gm`.
`follow(gm)` (run before refresh_prepared on every forward) re-resolves those names when some
module in the process registered a parameter, buffer or submodule since its last look (torch's
global registration hooks bump one counter), or when an entry of a dict that holds one of them
was replaced behind those hooks: `module._parameters[name] = new` (accelerate's
set_module_tensor_to_device, quantization libraries, torch's `.to()` under
overwrite_module_params_on_conversion) or `module._buffers[name] = new`. For those, the dicts
involved (the model's owners of every tracked name; gm's owners of the weights prepared copies are
made from: gm's other weights are read from its dicts on every forward anyway) are snapshotted
after each look and compared with their snapshots, one C-level list-of-dicts comparison that
meets each value by identity first (see `_watch`). A name that resolves to another object:

- in `gm` (replaced on the translated module): that tensor is used;
- else in the model (replaced on the user's model): it is written into `gm` too (directly into
  the owner's parameter / buffer dict: the user's model is never written);

and the prepared copies made from the old tensor are rebuilt from the new one
(state.replace_source). A copy made from a view of a parameter (GPT-2's Conv1D weight is read as
`weight.t()`) is tracked through the view's base, and the same view (`as_strided`, same
geometry) of the new object becomes its source. A replacement of another shape, dtype or device, or one that unties
weights the captured graph reads as one tensor, cannot be served by kernels specialized at
translation: a clear error asks to translate again, on every forward until the replacement is
undone.

Not seen: a submodule replaced straight in a `_modules` dict (its new tensors are in dicts no
snapshot holds), and copies of the translated module (a deep copy or a loaded one owns its
weights). Per-forward cost: docs/host-overhead.md.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from . import state
from .errors import InputError

_GENERATION = [0]  # bumped by every parameter / buffer / submodule registration in the process
_TRACKED: dict = {}  # id(gm) -> _Tracked, dropped when gm dies (a plain dict: a weak-dict lookup costs ~1 us)


def changed(*_args) -> None:
    """Some module's parameter, buffer or submodule was (re)registered: the next forward looks."""
    _GENERATION[0] += 1


for _register in (torch.nn.modules.module.register_module_parameter_registration_hook,
                  torch.nn.modules.module.register_module_buffer_registration_hook,
                  torch.nn.modules.module.register_module_module_registration_hook):
    _register(changed)


class _Tracked:
    __slots__ = ("model", "weights", "generation", "dicts", "snapshots", "singles")

    def __init__(self, model, weights):
        self.model = weakref.ref(model)
        # [held tensor, its names in the model, its name in gm or None, model's object, None or the
        # geometry of the held tensor as a view of the model's object]
        self.weights = weights
        self.generation = _GENERATION[0]
        self.dicts: list = []  # the parameter / buffer dicts that hold those weights (see _watch)
        self.snapshots: list = []  # a shallow copy of each, taken when the weights were last resolved
        self.singles: list = []  # [(dict, key, tensor)] for one-element tensors (see _watch)

    def unchanged(self) -> bool:
        """No registration since the last look, and no dict entry replaced behind torch's back."""
        if self.generation != _GENERATION[0]:
            return False
        try:  # dict equality in C: the same objects compare equal without calling Tensor.__eq__
            if self.snapshots != self.dicts:
                return False
        except Exception:  # noqa: BLE001 — a replaced entry: Tensor.__eq__ of two tensors raised
            return False
        return not self.singles or all(d.get(k) is v for d, k, v in self.singles)


def _tensors(module):
    return itertools.chain(module.named_parameters(remove_duplicate=False),
                           module.named_buffers(remove_duplicate=False))


def track(gm: torch.fx.GraphModule, model: torch.nn.Module) -> int:
    """Note the weights `gm` shares with `model` by name; returns how many."""
    in_model, in_gm = {}, {}
    for name, t in _tensors(model):
        in_model.setdefault(id(t), (t, []))[1].append(name)
    for name, t in _tensors(gm):
        in_gm.setdefault(id(t), name)
    held = {id(t): t for _, t in _tensors(gm)} | {id(t): t for t in state.sources(gm)}
    weights = [[t, in_model[i][1], in_gm.get(i), t, None] for i, t in held.items() if i in in_model]
    for i, t in held.items():  # a prepared copy made from a view of a parameter (GPT-2 Conv1D's weight.t())
        base = t._base
        if i not in in_model and base is not None and id(base) in in_model:
            geometry = (tuple(base.shape), base.stride(), tuple(t.shape), t.stride(),
                        t.storage_offset() - base.storage_offset())
            weights.append([t, in_model[id(base)][1], None, base, geometry])
    if weights:
        if id(gm) not in _TRACKED:
            weakref.finalize(gm, _TRACKED.pop, id(gm), None)
        _TRACKED[id(gm)] = t = _Tracked(model, weights)
        _watch(t, gm, model)
    return len(weights)


def _watch(t: _Tracked, gm, model) -> None:
    """Snapshot the dicts a direct write would change: the model's owner `_parameters` / `_buffers`
    of every tracked name, and gm's of those that prepared copies are made from (gm's other
    weights are read from gm's dicts on every forward). `snapshots == dicts` compares each value
    by identity first, in C; a replaced multi-element tensor makes Tensor.__eq__ raise (also
    "changed"), but a one-element one could compare equal by value, so those are checked one by one."""
    sources = {id(s) for s in state.sources(gm)}
    owners = {}
    for held, names, gm_name, *_ in t.weights:
        for module, name in [(model, n) for n in names] + ([(gm, gm_name)] if gm_name and id(held) in sources else []):
            owner = _owner(module, name)
            if owner is not None:
                owners.setdefault(id(owner[0]), owner)
    dicts = [d for d, _ in owners.values()]
    t.singles = [(d, k, v) for d in dicts for k, v in d.items() if isinstance(v, torch.Tensor) and v.numel() == 1]
    one = {id(d) for d, _, _ in t.singles}
    t.dicts = [d for d in dicts if id(d) not in one]
    t.snapshots = [dict(d) for d in t.dicts]


def follow(gm: torch.fx.GraphModule) -> None:
    """Adopt weights replaced (by name) since the last look; see the module docstring."""
    t = _TRACKED.get(id(gm))
    if t is None or t.unchanged():
        return
    generation, model = _GENERATION[0], t.model()
    for w in t.weights:
        held, names, gm_name, seen, view = w
        new = _resolve(gm, gm_name) if gm_name else held
        now = seen
        if new is held and model is not None:
            found = {id(o): o for o in (_resolve(model, n) for n in names) if o is not None}
            if len(found) > 1:
                raise InputError(f"the model's {', '.join(names)} were one tensor when it was translated and are "
                                 "now different tensors: the translated graph reads them as one; translate again")
            now = next(iter(found.values()), seen)
            if now is not seen:
                new = _view_of(now, view, names[0]) if view else now
        if new is not held and isinstance(new, torch.Tensor):
            _check_like(new, held, gm_name or names[0])
            if now is not seen and gm_name:
                _assign(gm, gm_name, now)
            state.replace_source(gm, held, new)
            w[0], w[3] = new, now  # only once checked: after an error the next forward raises it again
    t.generation = generation  # only once all were adopted: after an error the next forward looks again
    if model is not None:
        _watch(t, gm, model)


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
    if tuple(base.shape) != shape:
        raise InputError(f"{name} was replaced by a tensor of shape {list(base.shape)}; the translation was made for "
                         f"shape {list(shape)} (its kernels and prepared weights are specialized to it): translate "
                         "again with the new weights")
    if base.stride() != stride:
        raise InputError(f"{name} was replaced by a tensor with strides {base.stride()}, the translation reads it "
                         f"with strides {stride}: assign a contiguous tensor (w.contiguous()), or translate again")
    with torch.no_grad():
        return base.as_strided(size, view_stride, base.storage_offset() + offset)


def _check_like(new, old, name):
    if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
        raise InputError(
            f"{name} was replaced by a tensor of shape {list(new.shape)} {str(new.dtype)[6:]} on {new.device}; the "
            f"translation was made for shape {list(old.shape)} {str(old.dtype)[6:]} on {old.device} (its kernels and "
            "prepared weights are specialized to it): translate again with the new weights")
