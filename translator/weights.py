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
the graph or a source of a prepared copy) with its names in the captured model and in `gm`.
`follow(gm)` (run before refresh_prepared on every forward) re-resolves those names, but only
when some module in the process registered a parameter, buffer or submodule since its last look
(torch's global registration hooks bump one counter; the per-forward cost is a dict lookup and an
integer compare, ~0.5 us measured). A name that resolves to another object:

- in `gm` (replaced on the translated module): that tensor is used;
- else in the model (replaced on the user's model): it is written into `gm` too (directly into
  the owner's parameter / buffer dict: the user's model is never written);

and the prepared copies made from the old tensor are rebuilt from the new one
(state.replace_source). A replacement of another shape, dtype or device, or one that unties
weights the captured graph reads as one tensor, cannot be served by kernels specialized at
translation: a clear error asks to translate again.

Not seen: a replacement written straight into a module's `_parameters` dict on the user's model
(torch's `.to()` under overwrite_module_params_on_conversion does that; on the translated module
`TranslatedModule._apply` announces it), and copies of the translated module (a deep copy or a
loaded one owns its weights).
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
    __slots__ = ("model", "weights", "generation")

    def __init__(self, model, weights):
        self.model = weakref.ref(model)
        self.weights = weights  # [held tensor, its names in the model, its name in gm or None, model's object]
        self.generation = _GENERATION[0]


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
    weights = [[t, in_model[i][1], in_gm.get(i), t] for i, t in held.items() if i in in_model]
    if weights:
        if id(gm) not in _TRACKED:
            weakref.finalize(gm, _TRACKED.pop, id(gm), None)
        _TRACKED[id(gm)] = _Tracked(model, weights)
    return len(weights)


def follow(gm: torch.fx.GraphModule) -> None:
    """Adopt weights replaced (by name) since the last look; see the module docstring."""
    t = _TRACKED.get(id(gm))
    if t is None or t.generation == _GENERATION[0]:
        return
    generation, model = _GENERATION[0], t.model()
    for w in t.weights:
        held, names, gm_name, seen = w
        new = _resolve(gm, gm_name) if gm_name else held
        if new is held and model is not None:
            found = {id(o): o for o in (_resolve(model, n) for n in names) if o is not None}
            if len(found) > 1:
                raise InputError(f"the model's {', '.join(names)} were one tensor when it was translated and are "
                                 "now different tensors: the translated graph reads them as one; translate again")
            now = next(iter(found.values()), seen)
            if now is not seen:
                w[3] = new = now
                if gm_name:
                    _assign(gm, gm_name, now)
        if new is not held and isinstance(new, torch.Tensor):
            _check_like(new, held, gm_name or names[0])
            state.replace_source(gm, held, new)
            w[0] = new
    t.generation = generation  # only once all were adopted: after an error the next forward looks again


def _resolve(module, name):
    *path, leaf = name.split(".")
    for p in path:
        module = module._modules.get(p) if isinstance(module, torch.nn.Module) else None
    if not isinstance(module, torch.nn.Module):
        return None
    got = module._parameters.get(leaf)
    return got if got is not None else module._buffers.get(leaf)


def _assign(gm, name, tensor):
    """Point gm's `name` at `tensor`, without announcing it as a new registration."""
    owner, _, leaf = name.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = tensor


def _check_like(new, old, name):
    if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
        raise InputError(
            f"{name} was replaced by a tensor of shape {list(new.shape)} {str(new.dtype)[6:]} on {new.device}; the "
            f"translation was made for shape {list(old.shape)} {str(old.dtype)[6:]} on {old.device} (its kernels and "
            "prepared weights are specialized to it): translate again with the new weights")
