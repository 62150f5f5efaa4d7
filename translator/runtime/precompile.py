"""Compile every FlyDSL kernel specialization a translated graph needs, before it runs.

A specialization is decided by a FlyDSL op's argument shapes, dtypes, strides and constant
arguments (translator.runtime.specializations groups the graph's nodes by them). For each
distinct one, the op family's kernel adapter — the code the rocm and flysim backends run — is
called once under `translator_kernels.launch.compile_only()`: it builds its launcher and
compiles it through the one launch path, and launches nothing. Arguments are the graph's own
constants (weights) and uninitialized tensors of the example shapes (dynamic dims take their
example hints); nothing is read from them.

`precompile(tm)` runs at translate time for the rocm and flysim backends (a rich progress bar
when stderr is a terminal). A shape met later that needs another specialization (another GEMM
M bucket, another elementwise size) is compiled on first sight by the launch module, which
logs it at INFO. FlyDSL's disk cache (FLYDSL_RUNTIME_CACHE_DIR) serves later processes: their
compiles find the code object on disk.
"""

from __future__ import annotations

import logging
import sys

import torch

from ..registry import FAMILIES
from ..state import settle
from .specializations import specializations

log = logging.getLogger(__name__)


def _hint(s) -> int:
    if isinstance(s, torch.SymInt):
        return int(s.node.hint) if s.node.hint is not None else int(s)
    return int(s)


def _value(gm, a, device):
    if isinstance(a, torch.fx.Node):
        if a.op == "get_attr":
            obj = gm
            for part in a.target.split("."):
                obj = getattr(obj, part)
            return obj
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            return torch.empty_strided([_hint(s) for s in v.shape], [_hint(s) for s in v.stride()],
                                       dtype=v.dtype, device=device)
        if isinstance(v, (torch.SymInt, int)):
            return _hint(v)
        raise ValueError(f"argument {a.name} has no example value")
    if isinstance(a, (list, tuple)):
        return type(a)(_value(gm, x, device) for x in a)
    if isinstance(a, dict):
        return {k: _value(gm, x, device) for k, x in a.items()}
    return a


def calls(gm, device="cpu") -> list[tuple[dict, tuple, dict]]:
    """(specialization, args, kwargs) per distinct FlyDSL specialization with a kernel, in graph order."""
    nodes = {n.name: n for n in gm.graph.nodes}
    out = []
    for spec in specializations(gm):
        if spec["key"] is None:
            continue
        node = nodes[spec["nodes"][0]]
        args = tuple(_value(gm, a, device) for a in node.args)
        kwargs = {k: _value(gm, v, device) for k, v in node.kwargs.items()}
        out.append((spec, args, kwargs))
    return out


def _progress(total: int):
    """A rich progress bar on a terminal, else nothing."""
    if total < 2 or not sys.stderr.isatty():
        return None
    from rich.progress import Progress

    return Progress(transient=True, console=None)


def precompile(tm, backend: str | None = None) -> list:
    """Compile the specializations of `tm`'s graph for `backend` (default: its own); returns the
    launch.Compiled records of the compiles this call performed (none when all were cached)."""
    from translator_kernels import launch

    from . import use_backend

    backend = backend or tm.backend
    settle(tm.gm, backend)  # the prepared weights the backend reads are made (the reference's may stay lazy)
    if backend == "reference":
        return []
    device = "cuda" if backend == "rocm" and torch.cuda.is_available() else "cpu"
    todo = calls(tm.gm, device)
    bar = _progress(len(todo))
    with use_backend(backend, tm.arch), launch.compile_only(), launch.collect() as (_uses, compiled):
        if bar is not None:
            bar.start()
            task = bar.add_task(f"compiling FlyDSL kernels ({tm.arch})", total=len(todo))
        try:
            for spec, args, kwargs in todo:
                try:
                    FAMILIES[spec["family"]].kernel(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 — the node's first call raises it again, where
                    # verification reports it with the node; translate itself must not die on it here
                    log.warning("precompiling flydsl.%s for %s failed (%s: %s); it is retried on first call",
                                spec["family"], ", ".join(spec["nodes"]), type(e).__name__, e)
                if bar is not None:
                    bar.advance(task)
        finally:
            if bar is not None:
                bar.stop()
    return compiled
