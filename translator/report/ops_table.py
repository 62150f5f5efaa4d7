"""The README's supported-op table, generated from the registry (every family, the rules that
lower to it, its kernel entry, and the ops kept in PyTorch by design).

    python -m translator.report.ops_table [--update-readme]
"""

from __future__ import annotations

import torch

from .. import lowerings  # noqa: F401  (importing the lowerings fills the registry)
from ..registry import BY_DESIGN, FAMILIES, REGION_RULES, RULES, Stage


def supported_ops_markdown() -> str:
    """The supported-op table, generated from the registry."""
    lines = [
        "| FlyDSL op | PyTorch forms lowered to it | kernel entry |",
        "|---|---|---|",
    ]
    for fam in sorted(FAMILIES.values(), key=lambda f: f.name):  # never the order modules were imported in
        forms = []
        for r in sorted(RULES, key=lambda r: (list(Stage).index(r.stage), -r.priority, r.name)):
            if r.family == fam.name:
                names = list(dict.fromkeys(_target_name(t) for t in r.targets))  # overloads share a name
                forms.append(f"{r.name} ({', '.join(names)})")
        for r in sorted(REGION_RULES, key=lambda r: r.name):
            if r.family == fam.name:
                names = sorted({_target_name(t) for t in r.targets})
                forms.append(f"{r.name}: regions of ({', '.join(names)})")
        lines.append(f"| `flydsl.{fam.name}` | {'; '.join(forms)} | `{fam.kernel_entry}` |")
    lines.append("")
    lines.append("Kept in PyTorch by design: " + ", ".join(sorted(_target_name(t) for t in BY_DESIGN)) + ".")
    return "\n".join(lines)


def _target_name(t) -> str:
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t._opname}" if t.namespace == "aten" else str(t)
    if isinstance(t, torch._ops.OpOverloadPacket):
        return f"aten.{t._qualified_op_name.split('::')[-1]}"
    return getattr(t, "__name__", str(t))


BEGIN, END = "<!-- ops-table:begin (generated: python -m translator.report.ops_table --update-readme) -->", "<!-- ops-table:end -->"


def readme_with_table(text: str) -> str:
    """README text with the generated table between the markers."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{supported_ops_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if "--update-readme" in sys.argv:
        p = Path(__file__).resolve().parents[2] / "README.md"
        p.write_text(readme_with_table(p.read_text()))
        print(f"updated {p}")
    else:
        print(supported_ops_markdown())
