"""The kernel library's import rules, read from its source (no imports run):

- no import cycle among translator_kernels modules (function-level imports count too: a cycle
  hidden inside a function is still a cycle);
- translator_kernels never imports translator (imports go translator -> translator_kernels).

The emitted check scripts (which the library writes as text) are guarded by the emit tests:
they run in a subprocess where importing translator fails.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
LIB = "translator_kernels"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """Modules named by the file's import statements (resolved to a module of `modules` where one
    matches: `from pkg import mod` names pkg.mod when that is a module)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
    return out


def graph():
    files = sorted((ROOT / LIB).rglob("*.py"))
    modules = {module_name(f) for f in files}
    g = nx.DiGraph()
    outside = {}
    for f in files:
        me = module_name(f)
        g.add_node(me)
        for m in imported(f, modules):
            if m in modules and m != me:
                g.add_edge(me, m)
            elif m.split(".")[0] not in (LIB,):
                outside.setdefault(me, set()).add(m)
    return g, outside


def test_no_import_cycle_in_the_kernel_library():
    g, _ = graph()
    assert len(g) > 20, sorted(g)  # the walk found the library
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles}"


def test_kernel_library_never_imports_translator():
    _, outside = graph()
    bad = {m: sorted(x for x in names if x.split(".")[0] == "translator") for m, names in outside.items()}
    assert not any(bad.values()), bad


def test_the_check_finds_a_cycle(tmp_path, monkeypatch):
    """The walk sees function-level and relative imports (a check that finds nothing proves nothing)."""
    pkg = tmp_path / LIB / "codegen"
    pkg.mkdir(parents=True)
    (tmp_path / LIB / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from translator_kernels.codegen import b\n")
    (pkg / "b.py").write_text("from . import a\nimport translator.api\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    g, outside = graph()
    assert list(nx.simple_cycles(g)) and outside[f"{LIB}.codegen.b"] == {"translator.api"}
