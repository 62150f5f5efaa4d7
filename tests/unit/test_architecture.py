"""The architecture rules, checked on the source tree.

- Imports go one way (translator -> translator_kernels -> flydsl; flysim -> flydsl): the module
  import graph of the project (every import statement, module level or inside a function, read
  with ast) has no cycles, and translator_kernels / flysim never import translator.
- One toolbox: counters are bumped through `LowerCtx.count` (no `counters[` in lowerings), arguments
  are read with `translator.graph.arg` (no local `_arg` helpers, no `.args[` in a lowering), and the architectures are listed
  once (translator_kernels/arch.py; flysim, its own distribution, keeps the list it interprets).
- One tolerance table: tests take atol / rtol from translator.tolerances, never a number of their own
  (the two exceptions say why).
- Match once: no rule's rewrite calls (directly or through its module's helpers) a function its
  support check calls; the check hands its match to the rewrite (translator.registry).
  A support check records no reason on the context (ctx.not_lowered, ctx.reasons): it returns it,
  a Reason naming the other nodes it concerns.
- Folders too: the import graph of translator/'s subfolders (a module of translator/ itself is its
  own node) has no loop, which a file-level cycle test cannot see. api.py is orchestration only.
- Rule order never comes from import order: the lowerings imported in another order make the same
  rules fire on the same models (a subprocess each, so the registry is filled from scratch).
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"translator": ROOT / "translator", "translator_kernels": ROOT / "translator_kernels",
            "flysim": ROOT / "flysim" / "src" / "flysim", "bench": ROOT / "bench"}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = [pkg, *f.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _resolve(name: str, mods) -> str | None:
    """The longest project module `name` starts with (a name imported from a module is not one)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in mods:
            return cand
    return None


@functools.lru_cache(maxsize=None)
def _spelled_modules(path: Path) -> tuple:
    """Relative module names a module spells as strings (".api", ".frontends.serialize"): what its
    importlib.import_module calls may import."""
    tree = ast.parse(path.read_text(), str(path))
    return tuple(sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                         and re.fullmatch(r"\.[A-Za-z_][\w.]*", n.value)}))


def _relative(name: str, package: str) -> str:
    return package + name


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for mod, path in mods.items():
        g.add_node(mod)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name in `base`
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and "importlib" in \
                    ast.unparse(node.func):  # importlib.import_module(".x", __name__) and the names it is fed
                targets = [_relative(c, package) for c in _spelled_modules(path)]
            for t in targets:
                dep = _resolve(t, mods)
                if dep is not None and dep != mod:
                    g.add_edge(mod, dep)
    return g


GRAPH = import_graph()


def _cycles(prefix: str) -> list:
    sub = GRAPH.subgraph([m for m in GRAPH if m == prefix or m.startswith(prefix + ".")])
    return [sorted(c) for c in nx.simple_cycles(sub)]


def test_the_import_graph_sees_the_project():
    assert {"translator.api", "translator.graph", "translator.registry", "translator_kernels.arch",
            "flysim.toolchain"} <= set(GRAPH)
    assert GRAPH.has_edge("translator", "translator.frontends.compile_backend")  # importlib, lazily
    assert GRAPH.has_edge("translator.passes.partition", "translator.registry")
    assert GRAPH.has_edge("translator.lowerings.fold", "translator.graph")


@pytest.mark.parametrize("package", ["translator", "flysim", "bench"])
def test_no_import_cycles(package):
    assert _cycles(package) == []


def test_no_import_cycles_in_the_kernel_library():
    assert _cycles("translator_kernels") == []


def test_no_cycles_across_packages():
    between = nx.condensation(GRAPH)  # each strongly connected set becomes one node
    assert nx.is_directed_acyclic_graph(between)
    assert all(len(c) == 1 for c in nx.strongly_connected_components(GRAPH)), "an import cycle"


@pytest.mark.parametrize("package", ["translator_kernels", "flysim"])
def test_kernels_and_flysim_never_import_the_translator(package):
    bad = [(a, b) for a, b in GRAPH.edges if a.split(".")[0] == package and b.split(".")[0] == "translator"]
    assert bad == []


@pytest.mark.parametrize("package", ["translator_kernels", "flysim"])
def test_kernels_and_flysim_never_emit_translator_code(package):
    """Generated sources and check scripts are strings the ast walk does not see."""
    folder = PACKAGES[package]
    bad = [str(p.relative_to(ROOT)) for p, text in _sources(folder)
           if re.search(r"\b(from|import) translator(\.|\s|$)", text, re.M)]
    assert bad == []


def test_flysim_imports_no_other_project_package():
    bad = [(a, b) for a, b in GRAPH.edges if a.startswith("flysim") and not b.startswith("flysim")]
    assert bad == []


def _sources(folder: Path):
    return [(p, p.read_text()) for p in sorted(folder.rglob("*.py"))]


def test_lowerings_bump_counters_through_the_context():
    bad = [str(p.relative_to(ROOT)) for p, text in _sources(ROOT / "translator" / "lowerings") if "counters[" in text]
    assert bad == [], "use ctx.count(name) (translator.graph.LowerCtx)"


def test_no_local_argument_helpers():
    bad = [str(p.relative_to(ROOT)) for pkg in PACKAGES.values() for p, text in _sources(pkg)
           if re.search(r"^\s*def _arg\(|def kw_arg\(", text, re.M)]
    assert bad == [], "read aten arguments with translator.graph.arg(node, name)"




def test_lowerings_read_arguments_by_name():
    """No `.args[...]` in a lowering: arguments are read by schema name (translator.graph.arg, set_args,
    getitem_of), so a rule never depends on how a call passed them."""
    bad = {}
    for p, text in _sources(ROOT / "translator" / "lowerings"):
        lines = sorted({n.lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Subscript)
                        and isinstance(n.value, ast.Attribute) and n.value.attr == "args"})
        if lines:
            bad[str(p.relative_to(ROOT))] = lines
    assert bad == {}, "read arguments with translator.graph.arg(node, name) (lines listed)"


def test_one_list_of_architectures():
    where = [str(p.relative_to(ROOT)) for folder in (*PACKAGES.values(), ROOT / "tests") for p, text in _sources(folder)
             if re.search(r"^\s*(SUPPORTED_)?ARCHS\s*=", text, re.M)]
    assert sorted(where) == ["flysim/src/flysim/toolchain.py", "translator_kernels/arch.py"]


# --- match once: a rewrite never runs its check's matcher again -------------------------------------

LOWERINGS = ROOT / "translator" / "lowerings"


def _lowering_namespaces() -> dict:
    """{module stem: {name: FunctionDef}}: a lowerings module's top-level functions and those it
    imports from its sibling modules (`from .forms import find_qk`)."""
    trees = {p.stem: ast.parse(p.read_text()) for p in sorted(LOWERINGS.glob("*.py"))}
    own = {m: {n.name: n for n in t.body if isinstance(n, ast.FunctionDef)} for m, t in trees.items()}
    spaces = {}
    for m, t in trees.items():
        space = dict(own[m])
        for n in t.body:
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module in own:
                space.update({a.asname or a.name: own[n.module][a.name] for a in n.names if a.name in own[n.module]})
        spaces[m] = space
    return trees, spaces


def _called(fn) -> set:
    """Names a function's body calls (not its decorators)."""
    return {n.func.id for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _reachable(fn, space) -> set:
    """Names of the lowerings' functions `fn` calls, directly or through them."""
    seen, todo = set(), [fn]
    while todo:
        for name in _called(todo.pop()) & set(space):
            if name not in seen:
                seen.add(name)
                todo.append(space[name])
    return seen


def _rules(trees, spaces):
    """(rule name, rewrite FunctionDef, support check FunctionDef, its module's namespace) of every
    @rule in the lowerings whose check is a function of the lowerings."""
    for m, t in trees.items():
        space = spaces[m]
        for fn in (n for n in t.body if isinstance(n, ast.FunctionDef)):
            for deco in fn.decorator_list:
                if not (isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "rule"):
                    continue
                check = next(k.value for k in deco.keywords if k.arg == "supported")
                root = check.func if isinstance(check, ast.Call) else check  # a factory: supported=_for("rms")
                if isinstance(root, ast.Name) and root.id in space:
                    yield f"{m}.{fn.name}", fn, space[root.id], space


def rules_that_match_twice() -> dict:
    twice = {}
    for name, fn, check, space in _rules(*_lowering_namespaces()):
        again = _called(check) & set(space) & _reachable(fn, space)
        if again:
            twice[name] = sorted(again)
    return twice


def test_the_match_once_check_sees_the_rules():
    trees, spaces = _lowering_namespaces()
    assert {"find_qk", "product_of", "manual_softmax"} <= set(spaces["attention_softmax"]) | set(spaces["forms"])
    assert "_fold_prologue" in _reachable(spaces["fold"]["fold_reduce_prologue"], spaces["fold"])


def test_no_rewrite_runs_its_checks_matcher_again():
    """The support check returns the match and the rewrite receives it (registry.Rule.apply)."""
    assert rules_that_match_twice() == {}


WRITES_REASONS = {"not_lowered", "reasons"}  # LowerCtx members that record a node's reason


def checks_that_write_reasons(trees=None, spaces=None) -> dict:
    """{rule: [what]}: a rule whose support check (or a lowerings function it reaches) records a reason
    on the context (ctx.not_lowered, ctx.reasons) instead of returning it (a Reason names other nodes)."""
    found = {}
    for name, _fn, check, space in _rules(*((trees, spaces) if trees is not None else _lowering_namespaces())):
        bodies = [check] + [space[n] for n in _reachable(check, space)]
        writes = sorted({f"{b.name}: .{n.attr}" for b in bodies for n in ast.walk(b)
                         if isinstance(n, ast.Attribute) and n.attr in WRITES_REASONS})
        if writes:
            found[name] = writes
    return found


def test_support_checks_return_their_reasons():
    """A support check never writes a reason onto another node: it returns a Reason naming them."""
    assert checks_that_write_reasons() == {}


def test_the_reason_check_sees_a_check_that_writes(tmp_path):
    tree = ast.parse("def helper(node, ctx):\n    ctx.not_lowered(node.args[0], 'no')\n\n"
                     "def check(node, ctx):\n    return helper(node, ctx)\n\n"
                     "@rule(Stage.MATCH, aten.add.Tensor, family='x', supported=check)\n"
                     "def lower_x(node, ctx, m):\n    pass\n")
    space = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert checks_that_write_reasons({"probe": tree}, {"probe": space}) == {"probe.lower_x": ["helper: .not_lowered"]}


def test_generic_forms_import_no_family():
    """forms.py is usable by any family: it imports graph helpers only, never a family module."""
    assert sorted(b for a, b in GRAPH.edges if a == "translator.lowerings.forms") == ["translator.graph"]


def _folder(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and (ROOT / "/".join(parts)).is_dir()) \
        else parts[0] if len(parts) == 1 else mod


def folder_graph() -> nx.DiGraph:
    """translator/'s subfolders (translator.lowerings, ...) and top-level modules as nodes."""
    g = nx.DiGraph()
    for a, b in GRAPH.edges:
        if a.split(".")[0] == b.split(".")[0] == "translator":
            fa, fb = _folder(a), _folder(b)
            g.add_nodes_from((fa, fb))
            if fa != fb:
                g.add_edge(fa, fb)
    return g


def test_no_loops_between_folders():
    g = folder_graph()
    assert {"translator.lowerings", "translator.passes", "translator.runtime", "translator.frontends"} <= set(g)
    assert [sorted(c) for c in nx.simple_cycles(g)] == []


def test_api_is_orchestration_only():
    """api.py runs capture -> passes -> backend -> verify -> report and defines no class: the translated
    module lives in translator/translated.py, which imports no orchestration (translate reaches it as an
    argument of `_share`)."""
    tree = ast.parse((ROOT / "translator" / "api.py").read_text())
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == []
    assert "translator.api" not in set(GRAPH.successors("translator.translated"))
    assert ".translated" in _spelled_modules(ROOT / "translator" / "__init__.py")  # translator.TranslatedModule


# Tests that test a bench program itself may import it; every other test reads our kernels' ISA, traffic
# and hot-loop models from the kernel library (translator_kernels.measure, .hotloop, .traffic): bench/ prints.
TESTS_OF_BENCH = {
    "test_bench.py": "runs the bench programs (kernels, models, roofline, isa, rocm, weights_look) and checks what they print",
    "test_hf_families.py": "bench.hf_coverage's measure and audit are the HF coverage harness under test",
    "test_generation_bench.py": "runs python -m bench.generate end to end and checks its MODEL table and what it prints",
    "test_isa_fp8_decode.py": "bench.isa_fp8's decode rows: the chooser's split-K tiles and the upstream reasons it prints",
    "test_bench_calibration_print.py": "runs python -m bench.calibration and checks that it prints every point",
    "test_bench_report_only.py": "bench.report --only reruns one section of BENCHMARKS.md and keeps the others",
    "test_decode_model_limits.py": "bench.generate's decode MODEL rows against both HBM limits (issue 23)",
    "test_readme_sections.py": "the README's bench commands: each module exists and takes the flags shown",
}


def _bench_uses(path: Path) -> list:
    """Where a test file imports bench, or names a bench module for a child process to import."""
    tree = ast.parse(path.read_text(), str(path))
    uses = []
    for n in ast.walk(tree):
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else []
        uses += [f"line {n.lineno}: import {m}" for m in names if m == "bench" or m.startswith("bench.")]
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"bench\.\w+(:\w+)?", n.value):
            uses.append(f"line {n.lineno}: {n.value!r}")
    return uses


def test_tests_do_not_import_bench():
    found = {str(p.relative_to(ROOT)): u for p in sorted((ROOT / "tests").rglob("*.py"))
             if p.name not in TESTS_OF_BENCH and (u := _bench_uses(p))}
    assert found == {}, "move what the test needs into the kernel library (translator_kernels.measure)"
    assert all((ROOT / "tests" / "e2e" / name).is_file() for name in TESTS_OF_BENCH)


def test_the_bench_import_check_sees_one(tmp_path):
    (tmp_path / "t.py").write_text("def f():\n    from bench.isa_gemm import isa_stats\n    return 'bench._isa_child:ours'\n")
    assert _bench_uses(tmp_path / "t.py") == ["line 2: import bench.isa_gemm", "line 3: 'bench._isa_child:ours'"]


# --- one table of hardware facts, one dtype-name map --------------------------------------------

ARCH_NAMES = {"gfx942", "gfx950"}
# tables keyed by arch that hold measurements, not facts of the hardware
ARCH_KEYED_MEASUREMENTS = {"FLYDSL_AT_EQUAL_TILE": "FlyDSL's own GEMM measured by bench.kernels (tests/kernels)"}
SHORT_DTYPES = {"f32", "bf16", "f16", "bool", "i32", "i64"}  # kernel names ("fp16" / "fp32" name precisions)
FACTS = {5.3e12, 8.0e12, 2.1e9, 2.4e9, 1307e12, 2517e12, 163.4e12, 157.3e12}  # HBM B/s, clocks, peaks
LDS_SIZES = {64 * 1024, 160 * 1024}


def _number(n) -> bool:
    """A number written out: a constant, or arithmetic of constants (64 * 1024)."""
    if isinstance(n, ast.Constant):
        return isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
    if isinstance(n, ast.UnaryOp):
        return _number(n.operand)
    return isinstance(n, ast.BinOp) and _number(n.left) and _number(n.right)


def _value(n):
    return eval(compile(ast.Expression(n), "<fact>", "eval"), {})  # constants only (checked by _number)


def _torch_dtype(n) -> bool:
    """torch.float32, or its name spelled as a string ("float32")."""
    return isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "torch" or \
        isinstance(n, ast.Constant) and n.value in ("float32", "bfloat16", "float16")


def hardware_fact_copies() -> list:
    """Places outside translator_kernels/arch.py that write a hardware fact or the dtype-name map again:
    a dict keyed by arch with numbers (or dicts of numbers) as values, a dict between torch dtypes and
    short names, an LDS size (64 * 1024, 160 * 1024) or a known clock / bandwidth / peak."""
    found = []
    for folder in (*PACKAGES.values(), ROOT / "tests"):
        for p, text in _sources(folder):
            rel = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name
            if rel in ("translator_kernels/arch.py", "tests/unit/test_architecture.py") or rel.startswith("flysim/"):
                continue
            tree = ast.parse(text)
            measured = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                        and any(getattr(t, "id", "") in ARCH_KEYED_MEASUREMENTS for t in n.targets)}
            for n in ast.walk(tree):
                where = f"{rel}:{getattr(n, 'lineno', 0)}"
                if isinstance(n, ast.Dict) and n.keys and id(n) not in measured:
                    keys = [k.value for k in n.keys if isinstance(k, ast.Constant)]
                    if set(keys) & ARCH_NAMES and all(_number(v) or isinstance(v, ast.Dict) and all(map(_number, v.values))
                                                      for v in n.values):
                        found.append(f"{where} a table of arch facts")
                    pairs = list(zip(n.keys, n.values))
                    if sum(_torch_dtype(k) and isinstance(v, ast.Constant) and v.value in SHORT_DTYPES or
                           _torch_dtype(v) and isinstance(k, ast.Constant) and k.value in SHORT_DTYPES
                           for k, v in pairs) >= 2:
                        found.append(f"{where} a dtype-name map")
                elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and _number(n) and \
                        _value(n) in LDS_SIZES and "1024" in ast.unparse(n):
                    found.append(f"{where} an LDS size")
                elif isinstance(n, ast.Constant) and isinstance(n.value, float) and n.value in FACTS:
                    found.append(f"{where} a clock, bandwidth or peak")
    return found


def test_hardware_facts_and_dtype_names_are_written_once():
    """translator_kernels/arch.py holds them (GPUS, DTYPE_NAMES); everything else reads it."""
    assert hardware_fact_copies() == []


def test_the_fact_check_sees_a_copy(tmp_path):
    copy = tmp_path / "copy.py"
    copy.write_text('import torch\nCUS = {"gfx942": 304, "gfx950": 256}\nLDS = 64 * 1024\n'
                    'DT = {torch.float32: "f32", torch.bfloat16: "bf16"}\nBW = 5.3e12\nN = {"f32": "float32", "f16": "float16"}\n')
    saved = dict(PACKAGES)
    PACKAGES.clear()
    PACKAGES["probe"] = tmp_path
    try:
        got = hardware_fact_copies()
    finally:
        PACKAGES.clear()
        PACKAGES.update(saved)
    assert sorted(g.split(" ", 1)[1] for g in got) == ["a clock, bandwidth or peak", "a dtype-name map",
                                                        "a dtype-name map", "a table of arch facts", "an LDS size"]


# tolerances a test still writes as numbers, with the reason the table has no entry for them
OWN_TOLERANCES = {
    "tests/kernels/test_gemm_gated.py": "bf16 product of two GEMMs against an fp32 reference rounded once",
    "tests/unit/test_scan.py": "a bf16 model's cumsum of 300 terms: the error grows with the running sum",
    "tests/unit/test_verify_truth.py": "two fp64 runs of one model summing in another order: fp64 roundings (~1e-16), "
                                       "where an fp32 step anywhere would show ~1e-7",
}


def test_tests_take_tolerances_from_the_one_table():
    """atol= / rtol= numbers in tests come from translator.tolerances (op_tol, op_tolerance, model_tol);
    0 (an exact comparison) is not a tolerance."""
    found = set()
    for p, text in _sources(ROOT / "tests"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.keyword) and node.arg in ("atol", "rtol") and \
                    isinstance(node.value, ast.Constant) and node.value.value not in (0, 0.0):
                found.add(str(p.relative_to(ROOT)))
    assert found == set(OWN_TOLERANCES), "use translator.tolerances (op_tol / model_tol, or a named entry)"


# --- rule order does not depend on import order ---------------------------------------------------

ORDER_CHILD = r'''
import importlib, json, random, sys, types
from pathlib import Path

root, how = Path(sys.argv[1]), sys.argv[2]
names = sorted(p.stem for p in (root / "translator" / "lowerings").glob("*.py") if p.stem != "__init__")
if how == "reversed":
    names.reverse()
else:
    random.Random(int(how)).shuffle(names)
# an empty package first: the submodules are then imported in this order, not __init__'s
stub = types.ModuleType("translator.lowerings")
stub.__path__ = [str(root / "translator" / "lowerings")]
stub.__package__ = "translator.lowerings"
sys.modules["translator.lowerings"] = stub
for n in names:
    importlib.import_module("translator.lowerings." + n)
sys.path.insert(0, str(root / "tests" / "unit"))
from test_architecture import order_fingerprint
print(json.dumps(order_fingerprint()))
'''


@functools.lru_cache(maxsize=1)
def _fingerprint_here() -> str:
    return json.dumps(order_fingerprint())  # this process: lowerings/__init__.py's import order


def order_fingerprint() -> dict:
    """Counters, FlyDSL ops and report rows of a few models that exercise every stage."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from translator import translate

    class Block(nn.Module):  # layer norm, GEMM + gelu epilogue, residual, add + norm
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(32), nn.LayerNorm(32)
            self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

        def forward(self, x, r):
            h = x + r
            y = self.fc2(F.gelu(self.fc1(self.ln1(h))))
            return self.ln2(h + y * 0.5) + h

    class Attn(nn.Module):  # hand-written RMSNorm and attention, softmax, einsum
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.rand(64) + 0.5)

        def forward(self, q, k, v):
            q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
            a = (q @ k.transpose(-2, -1)) * 0.125
            o = F.softmax(a, dim=-1) @ v
            return o + torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1) @ v

    class Stats(nn.Module):  # loss decomposition, reduce prologue / epilogue, scans
        def forward(self, x, y):
            s = torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1))
            z = x * (y > 0)
            c = torch.cumsum(z, -1) - z
            return F.mse_loss(x, y) + s.mean() + c.flip(-1).cumsum(-1).flip(-1).sum()

    torch.manual_seed(0)
    cases = {"block": (Block(), (torch.randn(2, 5, 32), torch.randn(2, 5, 32))),
             "attn": (Attn(), tuple(torch.randn(1, 2, 8, 64) for _ in range(3))),
             "stats": (Stats(), (torch.randn(4, 24), torch.randn(4, 24)))}
    out = {}
    for name, (m, inputs) in cases.items():
        tm = translate(m.eval(), inputs, backend="reference", verify=False)
        ops = [n.target._opname for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]
        out[name] = {"counters": tm.report.counters, "ops": ops,
                     "rows": [(r.node, r.where, r.detail, r.flydsl_node) for r in tm.report.rows]}
    return out


@pytest.mark.parametrize("how", ["7", pytest.param("reversed", marks=pytest.mark.slow)])
def test_import_order_does_not_change_which_rules_fire(how):
    child = subprocess.run([sys.executable, "-c", ORDER_CHILD, str(ROOT), how], capture_output=True, text=True,
                           timeout=600, cwd=ROOT)
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    want = json.loads(_fingerprint_here())
    assert got == want
    assert {"epilogue_activation", "attention_handwritten", "rms_norm_handwritten", "loss_mse_loss",
            "reduce_prologue_fused", "reduce_epilogue_fused", "scan_exclusive", "scan_reversed", "add_layer_norm"} <= set(want["block"]["counters"]) | \
        set(want["attn"]["counters"]) | set(want["stats"]["counters"])


def test_test_files_have_unique_basenames():
    """pytest imports test files by basename (no packages under tests/): two files of one name in two
    folders make one of them a collection error ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for p in sorted([*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "flysim" / "tests").rglob("test_*.py")]):
        seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))  # both of pyproject's testpaths
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}
