"""Kernels that ship without Python: `export_kernels(tm, dir)`, CLI `convert --export-kernels DIR`.

Each FlyDSL kernel specialization a translated graph needs is compiled for the module's arch
(no GPU: with COMPILE_ONLY off, `flyc.compile` given placeholder tensors returns FlyDSL's
`CompiledFunction` without touching a device; it is never called here) and written through
`CompiledFunction.export_to_c`: an object file holding the code object and its host launcher,
and a C header declaring the entry `<symbol>(void **args)`, the module lifecycle functions
(`<symbol>__module_init/load/unload`) and typed wrappers `<symbol>_call` / `<symbol>_call_auto`.
Linking needs the HIP runtime only (the header names the flags); neither FlyDSL nor Python.

`manifest.json` says what a host program needs to call them in the graph's order:
  - "kernels": per symbol, its files, the builder and arguments that made it, and its argument
    layout: per C argument slot, the launcher parameter it comes from and its kind (tensor
    data pointer; tensor layout bytes holding the run-time sizes/strides listed; int32 / f32
    scalar; stream);
  - "nodes": per FlyDSL node of the graph, in graph order, the symbols its op calls (a GEMM
    node calls one, a two-stage reduction two) with the example call's arguments (shapes,
    strides, scalar values) — sizes other than the example's pass through the same slots.
Symbols are `<kernel family>_<hash of the specialization key>`: stable across runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import InputError
from ..registry import FAMILIES


def _symbol(use) -> str:
    from translator_kernels import launch

    origin = launch.origin(use.launcher)
    digest = hashlib.sha256(repr((origin, use.key[2], use.key[1][0])).encode()).hexdigest()[:10]
    return f"{launch.kernel_name(use.launcher)}_{digest}"


def _layout(fn) -> list[dict]:
    spec, error = fn._aot_spec, fn._aot_error
    if spec is None:
        raise InputError(f"FlyDSL cannot export this kernel: {error[1] if error else 'no AOT signature'}")
    slots = []
    for index, name, info, ctype in spec[0]:
        slots.append({"param": name, "param_index": index, "ctype": ctype.__name__,
                      **{k: (list(v) if isinstance(v, tuple) else v) for k, v in info.items()}})
    return slots


def export_kernels(tm, directory) -> Path:
    """Write every kernel specialization of `tm` as C (object + header) into `directory` and a
    manifest.json; returns the manifest's path."""
    from translator_kernels import launch

    from ..runtime.precompile import calls
    from ..runtime.stub import rocm_compile_env

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    kernels, nodes = {}, []
    with rocm_compile_env(tm.arch):
        for spec, args, kwargs in calls(tm.gm, "cpu"):
            with launch.compile_only(), launch.collect() as (uses, _compiled):
                FAMILIES[spec["family"]].kernel(*args, **kwargs)
            symbols = []
            for use in uses:
                sym = _symbol(use)
                symbols.append({"symbol": sym, "arguments": [list(a) if isinstance(a, tuple) else a
                                                             for a in use.args]})
                if sym not in kernels:
                    use.fn.export_to_c(str(out), sym)
                    kernels[sym] = {"object": f"{sym}.o", "header": f"{sym}.h", "builder": launch.origin(use.launcher),
                                    "target": use.key[1][0], "arguments": _layout(use.fn)}
            for name in spec["nodes"]:
                nodes.append({"node": name, "op": f"flydsl.{spec['family']}", "calls": symbols})
    order = {n.name: i for i, n in enumerate(tm.gm.graph.nodes)}
    nodes.sort(key=lambda n: order.get(n["node"], 0))
    import flydsl

    manifest = {"arch": tm.arch, "flydsl": flydsl.__version__, "toolchain_key": launch.toolchain_key(),
                "kernels": kernels, "nodes": nodes}
    path = out / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1, default=str))
    return path
