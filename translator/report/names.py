"""How the report names a node: its op, its shapes (dynamic dims marked *) and its dtype."""

from __future__ import annotations

import re

import torch

# shape / view / metadata ops: no arithmetic, nothing to translate (views are also found
# from the op's schema: see report.cost.is_view)
LAYOUT_OPS = {
    "view", "reshape", "_unsafe_view", "transpose", "t", "numpy_T", "permute", "unsqueeze", "squeeze", "expand",
    "contiguous", "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "flatten", "unflatten",
    "getitem", "clone", "alias", "detach", "size", "sym_size", "lift_fresh_copy", "_assert_tensor_metadata",
    "dropout", "to", "_to_copy", "type_as", "narrow", "movedim", "repeat", "cat", "stack", "arange", "zeros", "ones",
    "full", "empty", "scalar_tensor", "_guards_fn", "_assert_scalar", "sym_constrain_range_for_size",
    "broadcast_tensors", "expand_as", "view_as", "as_strided", "swapaxes", "swapdims", "mT", "mH", "adjoint",
}


# a size followed by * is a dynamic dim shown at its example size (_fmt_dim); `2*s0` (an expression
# without a hint) is not one
DYNAMIC_DIM = re.compile(r"\d\*(?=x|,|\)|\s|\[|$)")


def op_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._opname}"
    if node.op == "call_module":
        return f"module {t}"
    return getattr(t, "__name__", str(t))


def _fmt_shape(v) -> str:
    """Example sizes; a dynamic dim is marked with * (e.g. 2*x16*x128)."""
    if isinstance(v, torch.Tensor):
        return "x".join(_fmt_dim(s) for s in v.shape) or "scalar"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_fmt_shape(x) for x in v) + ")"
    return ""


def _fmt_dim(s) -> str:
    if isinstance(s, torch.SymInt):
        if not s.node.expr.free_symbols:
            return str(int(s))
        hint = s.node.hint
        return f"{hint}*" if hint is not None else str(s)
    return str(s)


def describe_shapes(node: torch.fx.Node) -> str:
    """Input shapes -> output shapes; a size no capture can know (`x[x > 0]`) is named data-dependent,
    with its recorded bound (report.cost.data_dependent); the FLOPs and bytes of such a node are
    those of the example inputs' run."""
    from .cost import data_dependent

    ins = [a.meta.get("val") for a in node.all_input_nodes if a.op != "get_attr"]
    out = node.meta.get("val")
    text = ", ".join(f for f in (_fmt_shape(v) for v in ins) if f) + " -> " + _fmt_shape(out)
    dd = data_dependent(out, node)
    return f"{text} [{dd}]" if dd else text


def node_dtype(node) -> str:
    v = node.meta.get("val")
    if isinstance(v, (list, tuple)) and v:
        v = v[0]
    return str(getattr(v, "dtype", "")).replace("torch.", "")
