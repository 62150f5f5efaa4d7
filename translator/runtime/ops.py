"""Dispatch of `torch.ops.flydsl.*` calls to the active backend, and what each call launched.

Each lowering file defines its op with `torch.library.custom_op("flydsl::<name>")` whose
body is `dispatch("<name>", ...)`, and a fake implementation for tracing. Custom ops must
not return an alias of an input, so a reference that returns a view is copied.

The kernel adapter runs through its per-call replay (translator_kernels.replay): the first call with
a signature (tensor dtypes, shapes, strides; other arguments; the launch target) runs the adapter
and records it, later ones replay only the allocations and the compiled launches.

Every call appends an `OpCall` to the active `ExecState.calls`: the op family and the kernel
launches the call made, read from the backend's launch log around the call (under flysim,
the simulation's `LaunchRecord`s). This is the evidence the report uses to say a graph
node "runs on a FlyDSL kernel": a call that launched nothing (the reference backend, or an
adapter that quietly computed in torch) is never reported as a kernel. `launches` is None
where the backend keeps no launch log (rocm, until the launch module records device
launches), and the report says so rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from translator_kernels.replay import call as replayed_call

from ..registry import FAMILIES
from ..state import resolve_lazy
from . import current


@dataclass
class OpCall:
    family: str
    launches: list | None  # launch records this call made; None where the backend records none
    node: str | None = None  # the translated graph's node, set by TranslatedModule.forward


def dispatch(name: str, *args):
    fam = FAMILIES[name]
    st = current()
    if st.backend == "reference" or _empty(args):  # no elements (a batch of 0): eager's result, nothing to launch
        out = fam.reference(*args)
        st.calls.append(OpCall(name, []))
        return _no_alias(out, args)
    log = _launch_log(st)
    first = len(log) if log is not None else 0
    args = resolve_lazy(args)  # a prepared weight left unmade for the reference backend: made for this call
    out = replayed_call(fam.kernel, args, None, True)  # the adapter's per-signature replay; no result aliases an input
    st.calls.append(OpCall(name, log[first:] if log is not None else None))
    return out


def _empty(args) -> bool:
    """Some tensor input has no elements: the kernels refuse (an empty reduction) or launch an empty grid."""
    return any((type(a) is torch.Tensor and a.numel() == 0)
               or (type(a) in (list, tuple) and any(type(t) is torch.Tensor and t.numel() == 0 for t in a))
               for a in args)


def _launch_log(st):
    """The list the backend appends launch records to while the call runs, or None."""
    return st.launches if st.backend in ("flysim", "rocm") else None


def _no_alias(out, args):
    if out is None:  # an op that writes its argument in place (flydsl.cache_write) returns nothing
        return None
    ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.numel()}
    if isinstance(out, torch.Tensor):
        return out.clone() if out.numel() and out.untyped_storage().data_ptr() in ptrs else out
    return type(out)(_no_alias(o, args) for o in out)
