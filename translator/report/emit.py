"""Take-away kernel sources: `flydsl-translate convert ... --emit-kernels DIR`.

Writes, for a translated model that has run on a kernel backend (flysim or rocm — verification
runs it), every generated FlyDSL kernel its last call used (fused elementwise chains and reductions: the
exact source that was compiled, with a check script that runs it on a GPU if present, else
on flysim, against the torch reference) and a KERNELS.md index that also names the library
kernels (GEMM, attention, norms, softmax) by module and entry point.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..registry import FAMILIES


def emit_kernels(tm, directory) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    used = sorted({n.meta["flydsl"]["family"] for n in tm.gm.graph.nodes if "flydsl" in n.meta})
    written: list[Path] = []
    if tm.backend != "reference":
        from translator_kernels.codegen.emit import emit_sources

        written += emit_sources(out, names=tm.last_generated_kernels)
    lines = ["# FlyDSL kernels of this translation", "",
             f"backend: {tm.backend}; arch: {tm.arch}", ""]
    if tm.backend == "reference":
        lines += ["Generated kernels are written only when a kernel backend ran the model (use --backend flysim);",
                  "this translation ran on the torch reference.", ""]
    lines += ["| FlyDSL op | kernel entry | source |", "|---|---|---|"]
    for fam in used:
        mod, _, fn = FAMILIES[fam].kernel_entry.partition(":")
        src = Path(importlib.import_module(mod).__file__)
        lines.append(f"| flydsl.{fam} | `{mod}.{fn}` | {src} |")
    gen = [p.name for p in written if p.suffix == ".py" and not p.name.startswith("check_")]
    if gen:
        lines += ["", "Generated here (each with `check_<name>.py`):", *[f"- {g}" for g in gen]]
    index = out / "KERNELS.md"
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [index, *written]
