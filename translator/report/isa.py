"""Per-kernel ISA statistics for the report (`translate(..., isa=True)`, CLI `--isa`).

A specialization is one FlyDSL op family called with given argument shapes, dtypes, strides
and constant arguments: what decides which kernel FlyDSL compiles. For each distinct one in a
translated graph, the family's kernel adapter (`OpFamily.kernel`, the code the flysim / rocm
backends run) is called on zero tensors of those shapes inside translator_kernels.isa's child
process, under COMPILE_ONLY for the chosen arch, and the final ISA of every kernel it compiled
is parsed: registers, spills, LDS, occupancy (a model), static instruction mix. Shapes are the
example inputs' (the hints of dynamic dims); constants (weights) are read from the module.
All of a graph's specializations compile in one child; results are cached in-process per
(arch, specialization), so translating the same model twice compiles nothing new.
"""

from __future__ import annotations

import torch

from translator_kernels.isa import IsaCompileError, TensorSpec, compile_many

_CACHE: dict = {}  # (arch, key) -> list of row dicts


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


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, TensorSpec):
            parts.append("x".join(map(str, a.shape)) + f" {a.dtype}" + ("" if a.stride is None else " strided"))
        elif isinstance(a, list) and any(isinstance(x, TensorSpec) for x in a):
            parts.append("[" + _describe(a) + "]")
    return ", ".join(parts)


def specializations(gm) -> list[dict]:
    """Distinct FlyDSL specializations in a translated graph, in graph order:
    [{"family", "nodes", "args", "key"}] (or "error" when its shapes cannot be made concrete)."""
    from ..registry import FAMILIES

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


def run_family(family: str, *args, **kwargs):
    """Child-side entry: call the family's kernel adapter (the code the kernel backends run)."""
    from .. import lowerings  # noqa: F401  (importing the lowerings fills the registry)
    from ..registry import FAMILIES

    FAMILIES[family].kernel(*args, **kwargs)


def collect(gm, arch: str) -> list[dict]:
    """One row per compiled kernel of each distinct specialization: op, nodes, inputs and the
    statistics of translator_kernels.isa.IsaStats.summary(); a row with "error" when it failed."""
    specs = specializations(gm)
    todo = [s for s in specs if s["key"] is not None and (arch, s["key"]) not in _CACHE]
    jobs = [("translator.report.isa:run_family", (s["family"], *s["args"]), s["kwargs"]) for s in todo]
    for s, r in zip(todo, compile_many(jobs, arch) if jobs else []):
        if isinstance(r, IsaCompileError):
            _CACHE[(arch, s["key"])] = [{"error": _short(str(r))}]
        else:
            _CACHE[(arch, s["key"])] = [{c: v for c, v in k.summary().items() if c != "arch"} for k in r.kernels]
    rows = []
    for s in specs:
        head = {"op": f"flydsl.{s['family']}", "nodes": ", ".join(s["nodes"]), "inputs": _describe(s["args"])}
        if s["key"] is None:
            rows.append(dict(head, error=s["error"]))
        else:
            rows.extend(dict(head, **r) for r in _CACHE[(arch, s["key"])])
    return rows


def _short(msg: str, limit: int = 400) -> str:
    lines = [x for x in msg.strip().splitlines() if x.strip()]
    tail = lines[-1] if lines else msg
    return (lines[0] + (" … " + tail if tail != lines[0] else ""))[:limit] if lines else msg[:limit]


def clear_cache() -> None:
    _CACHE.clear()
