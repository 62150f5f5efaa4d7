"""Which FlyDSL specializations a translated graph launches.

A specialization is one FlyDSL op family called with given argument shapes, dtypes, strides and
constant arguments: what decides which kernel FlyDSL compiles. `specializations` groups a graph's
flydsl nodes by it, in graph order; `precompile` compiles each once before the first call, and the
report's ISA statistics (translator.report.isa) compile each for an arch. Shapes are the example
inputs' (the hints of dynamic dims); constants (weights) are read from the module.
"""

from __future__ import annotations

import torch

from translator_kernels.isa import TensorSpec

from ..registry import FAMILIES


class _NoHint(Exception):
    pass


def _int(s) -> int:
    if isinstance(s, torch.SymInt):
        if not s.node.expr.free_symbols:
            return int(s)
        if s.node.hint is None:
            raise _NoHint(str(s))
        return int(s.node.hint)
    return int(s)


def _tensor_spec(t: torch.Tensor) -> TensorSpec:
    shape = tuple(_int(s) for s in t.shape)
    stride = tuple(_int(s) for s in t.stride())
    contiguous = stride == torch.empty(shape, device="meta").stride() if shape else True
    return TensorSpec(shape, str(t.dtype).replace("torch.", ""), None if contiguous else stride)


def _arg_spec(gm, a):
    """A graph argument as something the child can rebuild: TensorSpec, int, or the literal."""
    if isinstance(a, torch.fx.Node):
        if a.op == "get_attr":  # a constant (weights): its real shape, not a fake one
            obj = gm
            for part in a.target.split("."):
                obj = getattr(obj, part)
            return _tensor_spec(obj) if isinstance(obj, torch.Tensor) else obj
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            return _tensor_spec(v)
        if isinstance(v, (torch.SymInt, int)):
            return _int(v)
        raise _NoHint(f"argument {a.name} has no example value")
    if isinstance(a, (list, tuple)):
        return [_arg_spec(gm, x) for x in a]
    if isinstance(a, dict):
        return {k: _arg_spec(gm, x) for k, x in a.items()}
    return a


def specializations(gm) -> list[dict]:
    """Distinct FlyDSL specializations in a translated graph, in graph order:
    [{"family", "nodes", "args", "key"}] (or "error" when its shapes cannot be made concrete)."""
    out: dict = {}
    for n in gm.graph.nodes:
        info = n.meta.get("flydsl")
        if n.op != "call_function" or not info or info["family"] not in FAMILIES:
            continue
        fam = info["family"]
        try:
            args = [_arg_spec(gm, a) for a in n.args]
            kwargs = {k: _arg_spec(gm, v) for k, v in n.kwargs.items()}
            key = repr((fam, args, sorted(kwargs.items())))
        except _NoHint as e:
            out[("error", n.name)] = {"family": fam, "nodes": [n.name], "args": [], "kwargs": {}, "key": None,
                                      "error": f"no concrete size for {e}"}
            continue
        spec = out.setdefault(key, {"family": fam, "nodes": [], "args": args, "kwargs": kwargs, "key": key})
        spec["nodes"].append(n.name)
    return list(out.values())
