"""README's "Python API" and "torch.compile, save / load, ONNX, HuggingFace" sections, fast: the code
blocks exec'd as written on a tiny model (reference backend) and each promise of the prose beside them
(an option's name, an attribute, an error and its message) tried once. The full-size runs are
test_readme_sections.py (mini_gpt) and test_readme.py (the ONNX and HF generation lines too).
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import translator

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
API, COMPILE = "Python API", "torch.compile, save / load, ONNX, HuggingFace"


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def code(title: str) -> str:
    return "\n".join(b.split("\n```", 1)[0] for b in section(title).split("```python\n")[1:])


def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()


def test_every_name_the_sections_give_exists():
    """Each error class, `translator.X` and translate() keyword the two sections name is there (GradError
    was only in translator.errors)."""
    text = section(API) + section(COMPILE)
    errors = set(re.findall(r"`(?:translator\.)?(\w+Error)`", text))
    assert {"GradError", "StrictError", "InputError"} <= errors, errors
    for name in errors | set(re.findall(r"translator\.(\w+)\(", text)):
        assert hasattr(translator, name), name
        assert name in translator.__all__, name
    params = inspect.signature(translator.translate).parameters
    kwargs = set(re.findall(r"(\w+)=", code(API))) | set(re.findall(r"^- `(\w+)(?:=[^`]*)?`", section(API), re.M))
    assert {"backend", "precision", "strict", "dynamic_shapes", "isa"} <= kwargs, kwargs
    assert kwargs <= set(params), kwargs - set(params)
    for opt in re.findall(r'"(\w+)":', re.search(r"options=\{[^}]*\}", code(COMPILE)).group(0)):
        assert opt in params, opt


def test_python_api_block(monkeypatch, capsys):
    """The block as written, `models.mini_gpt` a tiny model and backend "reference" for "auto"."""
    mod = types.ModuleType("models.mini_gpt")
    mod.Model = lambda: tiny()
    mod.get_init_inputs = lambda: []
    mod.get_inputs = lambda: [torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))]
    monkeypatch.setitem(sys.modules, "models.mini_gpt", mod)
    block = code(API)
    assert block.count('backend="auto"') == 1
    ns: dict = {}
    exec(compile(block.replace('backend="auto"', 'backend="reference"'), "README.md", "exec"), ns)  # noqa: S102
    tm = ns["tm"]
    out = capsys.readouterr().out
    assert "verification PASSED" in out and "torch.ops.flydsl" in out
    assert tm.report.verification.passed and tm.report.backend == "reference"
    x = mod.get_inputs()[0]
    torch.testing.assert_close(ns["y"], ns["model"](x))
    torch.testing.assert_close(tm(x[:1, :3]), ns["model"](x[:1, :3]))  # "batch / sequence dims may differ"
    assert tm.report.to_markdown() and tm.report.to_json()
    for name in ("last_calls", "last_launches", "refresh_weights", "specialize", "fast_path"):
        assert hasattr(tm, name), name
    assert tm.report.launches == {} and len(tm.report.without_launch()) == 2  # reference: no launch recorded
    assert len(tm.last_calls) == 2 and tm.report.kernel_view() == []


def test_python_api_promises():
    """The bullets under the block: rocm without a GPU, strict, GradError, dynamic_shapes=None, training
    mode, weights followed / refresh_weights, a weight of another dtype."""
    m, x = tiny(), torch.randn(4, 16)
    if not translator.runtime.rocm_gpu_present():
        with pytest.raises(translator.InputError, match="backend='rocm' needs an AMD GPU.*'flysim'"):
            translator.translate(m, (x,), backend="rocm", verify=False)
    with pytest.raises(translator.StrictError, match=r"linear \(aten.linear\): flydsl.gemm"):
        translator.translate(m, (x,), backend="reference", strict=True, verify=False)
    tm = translator.translate(m, (x,), backend="reference", verify=False, dynamic_shapes=None)
    with pytest.raises(translator.GradError, match="no backward"):
        tm(x.clone().requires_grad_())
    with pytest.raises(translator.ShapeError):
        tm(torch.randn(5, 16))
    m.train()
    tm = translator.translate(m, (x,), backend="reference", verify=False)
    assert m.training and "eval mode" in tm.report.to_markdown()
    x5 = torch.randn(5, 16)
    torch.testing.assert_close(tm(x5), m.eval()(x5))  # dynamic_shapes="auto": another batch
    with torch.no_grad():
        m[0].weight.add_(1.0)  # seen: a version counter records it
    torch.testing.assert_close(tm(x), m(x))
    with torch.no_grad():
        m[0].weight.data.copy_(torch.randn(32, 16))  # not seen until refresh_weights()
    assert not torch.allclose(tm(x), m(x))
    tm.refresh_weights()
    torch.testing.assert_close(tm(x), m(x))
    m.half()
    with pytest.raises(translator.TranslatorError, match="0.weight|0.bias"):
        tm(x)


def test_torch_compile_block(tmp_path, monkeypatch, fresh_dynamo):
    """Every line of the block but the ONNX and HF ones (test_readme.py runs those), as written."""
    monkeypatch.chdir(tmp_path)
    model, x = tiny(), torch.randn(4, 16)
    ns = {"torch": torch, "model": model, "x": x, "tm": translator.translate(model, (x,), backend="reference",
                                                                           verify=False)}
    lines = [ln for ln in code(COMPILE).splitlines() if ln.strip() and not ln.lstrip().startswith("#")
             and not re.search(r"hf_model|onnx|for r in|print\(r", ln)]
    assert len(lines) == 7, lines
    with torch.no_grad():
        exec(compile("\n".join(lines), "README.md", "exec"), ns)  # noqa: S102
    torch.testing.assert_close(ns["y"], model(x))
    torch.testing.assert_close(ns["tm2"](x), model(x))
    recs = translator.compile_reports()
    assert [r.calls_translated for r in recs] == [1] and not recs[0].calls_pytorch
    (tmp_path / "junk.pt2").write_text("not ours")
    with pytest.raises(translator.InputError, match="not a file written by translator.save"):
        translator.load("junk.pt2")


@pytest.mark.parametrize("opts, match", [({"backend": "rocm"}, "needs an AMD GPU"), ({"arch": "gfx90a"}, "gfx942"),
                                         ({"bakend": "reference"}, "does not know the option")])
def test_torch_compile_bad_option_is_an_error(fresh_dynamo, opts, match):
    """A wrong option is the user's error at once, as in translate(); it ran the graph in eager PyTorch
    with a warning before."""
    if opts.get("backend") == "rocm" and translator.runtime.rocm_gpu_present():
        pytest.skip("a ROCm GPU is present")
    cm = torch.compile(tiny(), backend="flydsl", options=opts)
    with pytest.raises(Exception, match=match) as info:
        cm(torch.randn(4, 16))
    assert isinstance(getattr(info.value, "inner_exception", info.value), translator.InputError), info.value


def test_auto_backend_rule():
    """`auto`: rocm with a ROCm GPU, else flysim when it can run here and the model has a FlyDSL op, else
    reference (not "when every FlyDSL op has a kernel": nothing checks that)."""
    from translator import runtime
    from translator.api import choose_backend

    if runtime.rocm_gpu_present():
        pytest.skip("a ROCm GPU is present")
    assert choose_backend("auto", set())[0] == "reference"
    want = "reference" if runtime.flysim_available() else "flysim"
    assert choose_backend("auto", {"gemm"})[0] == want
    assert "auto" in section(API) and "it needs `ld.lld`" in section(API)
