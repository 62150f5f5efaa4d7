"""Dispatch of `torch.ops.flydsl.*` calls to the active backend.

Each lowering file defines its op with `torch.library.custom_op("flydsl::<name>")` whose
body is `dispatch("<name>", ...)`, and a fake implementation for tracing. Custom ops must
not return an alias of an input, so a reference that returns a view is copied.
"""

from __future__ import annotations

import torch

from . import current


def dispatch(name: str, *args):
    from ..registry import FAMILIES

    fam = FAMILIES[name]
    st = current()
    if st.backend == "reference":
        out = fam.reference(*args)
    else:
        out = fam.kernel(*args)
    return _no_alias(out, args)


def _no_alias(out, args):
    ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.numel()}
    if isinstance(out, torch.Tensor):
        return out.clone() if out.numel() and out.untyped_storage().data_ptr() in ptrs else out
    return type(out)(_no_alias(o, args) for o in out)
