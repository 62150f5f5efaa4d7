"""The registry: one entry per FlyDSL op family, one entry per lowering (pattern).

An `OpFamily` is a FlyDSL op as the translated graph sees it (`torch.ops.flydsl.<name>`):
its reference math, the adapter that launches our FlyDSL kernel (importable or not yet
landed), sample inputs and tolerance overrides. A `Lowering` says which graph nodes
become that op: the aten targets it looks at, a pure support check returning None or a
reason string (quoted verbatim in the report), and the rewrite.

Adding an op is one file in translator/lowerings that calls `register_family` and
`register_lowering`; nothing else is edited. The supported-op table in the README is
generated from here (`python -m translator.registry`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

# A support check: (node, ctx) -> None when the lowering applies, else the reason it does not.
SupportCheck = Callable[[torch.fx.Node, Any], Optional[str]]


@dataclass
class OpFamily:
    name: str  # "gemm" -> torch.ops.flydsl.gemm
    description: str
    reference: Callable[..., Any]  # ref_<op>(*op_args): plain torch math, never reported as a kernel
    kernel: Callable[..., Any]  # adapter: same signature as the op, launches our FlyDSL kernel
    kernel_entry: str  # "translator_kernels.rows.softmax:softmax": the kernel library entry it needs
    sample_inputs: Callable[[torch.dtype], tuple] | None = None
    # per-dtype (atol, rtol) overrides of translator.tolerances.TOLERANCES, with the reason
    tolerance_overrides: dict[torch.dtype, tuple[float, float, str]] = field(default_factory=dict)

    @property
    def op(self):
        return getattr(torch.ops.flydsl, self.name)

    def kernel_available(self) -> bool:
        """True when our kernel library provides this family's FlyDSL kernel."""
        return kernel_entry_available(self.kernel_entry)

    def status(self) -> str:
        return "kernel" if self.kernel_available() else "reference-only"


@dataclass
class Lowering:
    name: str  # counter name, e.g. "linear"
    family: str
    targets: tuple  # aten OpOverloads (or callables) this lowering inspects
    supported: SupportCheck
    rewrite: Callable[[torch.fx.Node, Any], torch.fx.Node]
    doc: str = ""
    stage: str = "lower"  # the pass that applies it (see translator.passes.PIPELINE)


FAMILIES: dict[str, OpFamily] = {}
LOWERINGS: list[Lowering] = []
# aten ops kept in PyTorch by design: conv, pooling, batchnorm
BY_DESIGN: set = set()


def register_family(fam: OpFamily) -> OpFamily:
    if fam.name in FAMILIES:
        raise ValueError(f"op family {fam.name!r} registered twice")
    FAMILIES[fam.name] = fam
    return fam


def register_lowering(low: Lowering) -> Lowering:
    if low.family not in FAMILIES:
        raise ValueError(f"lowering {low.name!r} names unknown family {low.family!r}")
    LOWERINGS.append(low)
    return low


def lowerings_for(stage: str) -> list[Lowering]:
    return [low for low in LOWERINGS if low.stage == stage]


_AVAILABLE: dict[str, bool] = {}


def kernel_entry_available(entry: str) -> bool:
    if entry not in _AVAILABLE:
        mod, _, attr = entry.partition(":")
        try:
            _AVAILABLE[entry] = callable(getattr(importlib.import_module(mod), attr, None))
        except ModuleNotFoundError as e:
            if e.name != mod:  # the kernel module exists but is broken: that is a bug to see, not hide
                raise
            _AVAILABLE[entry] = False
    return _AVAILABLE[entry]


def load_all() -> None:
    """Import every lowering module so the registry is complete."""
    from . import lowerings  # noqa: F401  (registers on import)


def supported_ops_markdown() -> str:
    """The supported-op table, generated from the registry."""
    load_all()
    lines = [
        "| FlyDSL op | status | PyTorch forms lowered to it | kernel entry |",
        "|---|---|---|---|",
    ]
    for fam in FAMILIES.values():
        forms = []
        for low in LOWERINGS:
            if low.family == fam.name:
                names = list(dict.fromkeys(_target_name(t) for t in low.targets))  # overloads share a name
                forms.append(f"{low.name} ({', '.join(names)})")
        status = "FlyDSL kernel" if fam.kernel_available() else "reference only (kernel not landed)"
        lines.append(f"| `flydsl.{fam.name}` | {status} | {'; '.join(forms)} | `{fam.kernel_entry}` |")
    lines.append("")
    lines.append("Kept in PyTorch by design: " + ", ".join(sorted(_target_name(t) for t in BY_DESIGN)) + ".")
    return "\n".join(lines)


def _target_name(t) -> str:
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t._opname}" if t.namespace == "aten" else str(t)
    if isinstance(t, torch._ops.OpOverloadPacket):
        return f"aten.{t._qualified_op_name.split('::')[-1]}"
    return getattr(t, "__name__", str(t))


BEGIN, END = "<!-- ops-table:begin (generated: python -m translator.registry --update-readme) -->", "<!-- ops-table:end -->"


def readme_with_table(text: str) -> str:
    """README text with the generated table between the markers."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{supported_ops_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from translator import registry as _reg  # the registry the lowerings fill, not this __main__ copy

    if "--update-readme" in sys.argv:
        p = Path(__file__).resolve().parent.parent / "README.md"
        p.write_text(_reg.readme_with_table(p.read_text()))
        print(f"updated {p}")
    else:
        print(_reg.supported_ops_markdown())
