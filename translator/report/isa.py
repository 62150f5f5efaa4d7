"""Per-kernel ISA statistics for the report (`translate(..., isa=True)`, CLI `--isa`).

A specialization is one FlyDSL op family called with given argument shapes, dtypes, strides
and constant arguments: what decides which kernel FlyDSL compiles. For each distinct one in a
translated graph, the family's kernel adapter (`OpFamily.kernel`, the code the flysim / rocm
backends run) is called on zero tensors of those shapes inside translator_kernels.isa's child
process, under COMPILE_ONLY for the chosen arch, and the final ISA of every kernel it compiled
is parsed: registers, spills, LDS, occupancy (a model), static instruction mix. Shapes are the
example inputs' (the hints of dynamic dims); constants (weights) are read from the module.
Which specializations a graph launches is the runtime's to say (translator.runtime.specializations,
which precompile uses too); this module compiles and reads them. All of a graph's specializations
compile in one child; results are cached in-process per (arch, specialization), so translating the
same model twice compiles nothing new.
"""

from __future__ import annotations

from translator_kernels.isa import IsaCompileError, TensorSpec, compile_many

from ..runtime.specializations import specializations

_CACHE: dict = {}  # (arch, key) -> list of row dicts


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, TensorSpec):
            parts.append("x".join(map(str, a.shape)) + f" {a.dtype}" + ("" if a.stride is None else " strided"))
        elif isinstance(a, list) and any(isinstance(x, TensorSpec) for x in a):
            parts.append("[" + _describe(a) + "]")
    return ", ".join(parts)


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
