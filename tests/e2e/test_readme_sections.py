"""Every code block and command of README.md runs as a test, or, where it needs what CI has not (an AMD
GPU, a FlyDSL source checkout, torchrun over GPUs), its parts are checked to exist and its CPU equivalent
is named (issue 23, item 6).

`BLOCKS` maps each fenced block, by section and order, to the test that runs it: a block added to the
README without a test fails `test_every_readme_block_has_its_test`. Blocks run elsewhere:
- "torch.compile, save / load, ONNX, HuggingFace": tests/e2e/test_readme.py (every line, exec'd);
- "LLM generation": tests/e2e/test_generation_translate.py (exec'd, eager's tokens); its torchrun line
  (prose) here, `test_the_tensor_parallel_command`: gloo + flysim with 2 processes is
  tests/e2e/test_generation_tp.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks() -> list[tuple[str, str, str]]:
    """(section title, language, code) of every fenced block, in README order."""
    out, section = [], ""
    for part in re.split(r"^(## .*|```\w*\n(?:.*\n)*?```)$", README, flags=re.M):
        if part.startswith("## "):
            section = part[3:].strip()
        elif part.startswith("```"):
            lang, code = part.split("\n", 1)
            out.append((section, lang[3:], code.rsplit("```", 1)[0]))
    return out


def block(section: str, lang: str, index: int = 0) -> str:
    return [c for s, lang_, c in blocks() if s == section and lang_ == lang][index]


BLOCKS = {
    ("Two commands", "bash"): "test_two_commands",
    ("Python API", "python"): "test_python_api_section_runs",  # and test_python_api_as_written (slow)
    ("torch.compile, save / load, ONNX, HuggingFace", "python"): "test_readme.py::test_torch_compile_section_runs",
    ("LLM generation", "python"): "test_generation_translate.py (the section, exec'd)",
    ("CLI", "bash"): "test_cli_block_names_the_cli",
    ("flysim: run FlyDSL kernels without an AMD GPU", "python"): "test_flysim_section_runs",
    ("Benchmarks", "bash"): "test_benchmark_commands_exist",
    ("Running on a real AMD GPU", "python"): "test_hip_graph_block",
    ("Layout", ""): "test_layout_block_names_what_is_there",
}


def test_every_readme_block_has_its_test():
    found = [(s, lang) for s, lang, _ in blocks()]
    assert sorted(found) == sorted(BLOCKS), f"README blocks without a test here: {set(found) ^ set(BLOCKS)}"
    for name in BLOCKS.values():
        if name.startswith("test_") and "::" not in name and " " not in name:
            assert name in globals(), name


def test_two_commands():
    """`./run demo` runs the CLI on models/mini_gpt.py into out/mini_gpt (here its CPU run with the
    reference backend, into a temporary folder: ./run's setup would build a .venv; the full default run
    is test_demo_as_written, slow); `./run test` is CI's command (test_readme.py)."""
    code = block("Two commands", "bash")
    assert "./run demo" in code and "./run test" in code
    run = (ROOT / "run").read_text()
    assert 'exec "$venv/bin/flydsl-translate" convert models/mini_gpt.py --out out/mini_gpt "$@"' in run
    assert 'flydsl-translate = "translator.frontends.cli:main"' in (ROOT / "pyproject.toml").read_text()
    written = re.search(r"`\./run demo` writes `out/mini_gpt/\{([^}]*)\}`", README).group(1).split(", ")
    assert written == ["report.md", "report.json", "report.html", "translated.py"], written


def _demo(tmp_path, *extra):
    out = tmp_path / "mini_gpt"
    subprocess.run([sys.executable, "-m", "translator", "convert", "models/mini_gpt.py", "--out", str(out), "--quiet",
                    *extra], cwd=ROOT, check=True, timeout=900)
    for name in ("report.md", "report.json", "report.html", "translated.py"):
        assert (out / name).stat().st_size > 0, name
    return out


def test_demo_files_are_written(tmp_path):
    _demo(tmp_path, "--backend", "reference")


@pytest.mark.slow  # ~90 s on the shared 2-core host (flysim); test_demo_files_are_written runs by default
def test_demo_as_written(tmp_path):
    out = _demo(tmp_path)
    rep = json.loads((out / "report.json").read_text())
    assert rep["backend"] == "flysim" and rep["verification"]["passed"], rep["verification"]


def _python_api(monkeypatch, backend=None) -> dict:
    """The block, exec'd on models/mini_gpt.py at 1 layer (its module's n_layer); `backend`: in place of
    the block's "auto"."""
    from bundled_models import load_module

    mod = load_module("mini_gpt", prefix="_readme")
    mod.n_layer = 1
    monkeypatch.setitem(sys.modules, "models.mini_gpt", mod)
    code = block("Python API", "python")
    if backend is not None:
        assert code.count('backend="auto"') == 1
        code = code.replace('backend="auto"', f'backend="{backend}"')
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 — our own README
    tm = ns["tm"]
    assert tm.report.verification.passed, tm.report.verification.message
    assert ns["y"].shape == ns["get_inputs"]()[0].shape
    return ns


def test_python_api_section_runs(monkeypatch, capsys):
    """Every line, the backend reference instead of "auto" (which picks flysim: test_python_api_as_written)."""
    _python_api(monkeypatch, "reference")
    assert "torch.ops.flydsl" in capsys.readouterr().out  # print(tm.code)


@pytest.mark.slow  # ~30 CPU s (flysim); test_python_api_section_runs runs every other line by default
def test_python_api_as_written(monkeypatch):
    assert _python_api(monkeypatch)["tm"].report.backend == "flysim"  # every op of mini_gpt has a kernel


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))


def test_cli_block_names_the_cli(capsys):
    """Every option of the block is one `convert` takes, with the block's choices; `ops` and `python -m
    translator` are the same CLI (both run in tests/e2e/test_cli.py)."""
    from translator.frontends import cli

    code = block("CLI", "bash")
    try:
        cli.main(["convert", "--help"])
    except SystemExit as e:
        assert e.code in (0, None)
    helptext = capsys.readouterr().out
    assert _flags(code) <= _flags(helptext), _flags(code) - _flags(helptext)
    options = re.findall(r"\[(--\w+) (\w+\|[\w|]+)\]", code)  # [--arch gfx942|gfx950]
    assert [o for o, _ in options] == ["--arch", "--backend", "--precision"], options
    for opt, choices in options:
        for c in choices.split("|"):
            assert c in helptext, (opt, c)
    assert ".venv/bin/flydsl-translate ops" in code and "python -m translator convert" in code
    assert (ROOT / "translator" / "__main__.py").exists()


def _parser_of(module) -> argparse.ArgumentParser:
    """The ArgumentParser a bench module's main() builds (caught at parse_args)."""
    seen = {}

    class Caught(Exception):
        pass

    def grab(self, args=None, namespace=None):
        seen["p"] = self
        raise Caught

    orig = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = grab
    try:
        module.main([])
    except Caught:
        pass
    finally:
        argparse.ArgumentParser.parse_args = orig
    return seen.get("p")


def test_benchmark_commands_exist():
    """Each `python -m bench.X [flags]` line (the README's Benchmarks block and the AMD section's
    host-overhead line): the module is there, its parser takes every flag written, and FLYDSL_SRC is read
    where the line sets it. Running them is the job of tests/e2e/test_bench.py (smoke sizes) and of a
    ROCm node (bench.rocm)."""
    lines = [ln for ln in block("Benchmarks", "bash").splitlines() if "-m bench." in ln]
    lines.append(re.search(r"`(python -m bench\.host_overhead[^`]*)`", README).group(1).replace("[", "").replace("]", ""))
    assert len(lines) >= 8, lines
    for ln in lines:
        cmd = ln.split("#", 1)[0]
        name = re.search(r"-m (bench\.\w+)", cmd).group(1)
        mod = importlib.import_module(name)
        src = Path(mod.__file__).read_text()
        if "FLYDSL_SRC" in cmd:
            assert "FLYDSL_SRC" in src, name
        flags = [t for t in shlex.split(cmd.replace("<", "").replace(">", "")) if t.startswith("--")]
        if not flags:
            continue
        p = _parser_of(mod)
        assert p is not None, f"{name}: no argparse parser for {flags}"
        known = {o for a in p._actions for o in a.option_strings}
        assert set(flags) <= known, (name, set(flags) - known)


def test_the_tensor_parallel_command():
    """`torchrun --nproc-per-node 2 -m bench.generate --tp` needs 2 GPUs; its parts: torchrun is torch's
    launcher, bench.generate takes --tp, and the CPU run of the same ranks (gloo + flysim, 2 processes) is
    tests/e2e/test_generation_tp.py."""
    assert "torchrun --nproc-per-node 2 -m bench.generate --tp" in README
    importlib.import_module("torch.distributed.run")
    p = _parser_of(importlib.import_module("bench.generate"))
    assert "--tp" in {o for a in p._actions for o in a.option_strings}
    tp = (ROOT / "tests" / "e2e" / "test_generation_tp.py").read_text()
    assert "gloo" in tp and "flysim" in tp


def test_flysim_section_runs():
    """The block as written, with `launch`, `a`, `b`, `c` a small add kernel of flysim's tests."""
    sys.path.insert(0, str(ROOT / "flysim" / "tests"))
    try:
        from flysim_kernels import build_add
    finally:
        sys.path.remove(str(ROOT / "flysim" / "tests"))
    add = build_add()
    a, b, c = torch.randn(256), torch.randn(256), torch.zeros(256)
    ns = {"launch": lambda a, b, c: add(a, b, c, a.numel()), "a": a, "b": b, "c": c}
    exec(compile(block("flysim: run FlyDSL kernels without an AMD GPU", "python"), "README.md", "exec"), ns)  # noqa: S102
    assert torch.equal(c, a + b)
    assert ns["rec"] is ns["sim"].launches[-1] and ns["rec"].counters, ns["rec"]


def test_hip_graph_block():
    """Needs a ROCm GPU (backend "rocm" and a HIP graph); CI has none, so here the block compiles and names
    only what exists. On a ROCm machine it runs as written on a small MLP."""
    code = block("Running on a real AMD GPU", "python")
    compile(code, "README.md", "exec")
    assert "torch.cuda.CUDAGraph()" in code and 'backend="rocm"' in code
    if not (torch.version.hip and torch.cuda.is_available()):
        return
    import translator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    x, new_x = torch.randn(8, 64), torch.randn(8, 64).cuda()
    ns = {"torch": torch, "translator": translator, "model": model, "x": x, "new_x": new_x}
    exec(compile(code, "README.md", "exec"), ns)  # noqa: S102
    torch.cuda.synchronize()
    with torch.no_grad():
        want = ns["tm"](new_x)
    torch.testing.assert_close(ns["static_y"], want, rtol=0, atol=0)


def test_layout_block_names_what_is_there():
    code = block("Layout", "")
    for folder in re.findall(r"^(\S+/)", code, flags=re.M):
        assert (ROOT / folder).is_dir(), folder
    for name in re.findall(r"\b([\w/]+\.py)\b", code):
        hits = list(ROOT.glob(f"*/{name}")) + list(ROOT.glob(name))
        assert hits, name
    for sub in re.findall(r"\b(\w+)/(?=[ ,(])", code):
        assert list(ROOT.glob(f"*/{sub}")) or (ROOT / sub).is_dir(), sub


def test_flysim_speed_line_needs_flydsl_src(tmp_path, monkeypatch, capsys):
    """README's bench.flysim_speed line sets FLYDSL_SRC: the bench runs FlyDSL's own kernels, and without a
    checkout it says so in one line (it was a ModuleNotFoundError on `kernels` after the table's header)."""
    import bench.flysim_speed as speed

    line = next(ln for ln in README.splitlines() if "-m bench.flysim_speed" in ln)
    assert line.startswith("FLYDSL_SRC=")
    monkeypatch.setattr(speed, "SRC", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["flysim_speed", "softmax"])
    with pytest.raises(SystemExit, match="FLYDSL_SRC=.* has no kernels/ folder"):
        speed.main()
    assert capsys.readouterr().out == ""
