"""torch.compile(backend="flydsl"): every bundled model with fullgraph=True, graph breaks,
shape changes, the entry point, options, and one small flysim case (kernel evidence)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

import translator  # noqa: F401  (registers the backend)
from translator.frontends import compile_backend
import translator.lowerings  # noqa: F401  (fills the registry)
from translator.registry import FAMILIES

from bundled_models import MODELS, load_model  # noqa: E402


class FlydslOps:
    """Counts the flydsl ops that actually run (on the reference backend), by family."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name, fam in FAMILIES.items():
            monkeypatch.setattr(fam, "reference", self._counting(name, fam.reference))

    def _counting(self, name, fn):
        def run(*args):
            self.calls.append(name)
            return fn(*args)
        return run


@pytest.fixture
def flydsl_ops(monkeypatch):
    return FlydslOps(monkeypatch)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


@pytest.mark.parametrize("name", MODELS)
def test_fullgraph_on_bundled_models(name, flydsl_ops):
    model, mod = load_model(name)
    compiled = torch.compile(model, backend="flydsl", fullgraph=True, options={"backend": "reference"})
    x = tuple(mod.get_inputs())
    with torch.no_grad():
        got = compiled(*x)
    recs = compile_backend.reports()
    assert len(recs) == 1 and recs[0].fallback_reason is None
    assert recs[0].report.verification.passed
    assert "gemm" in flydsl_ops.calls, "the compiled model ran no flydsl.gemm"
    torch.testing.assert_close(got, model(*x), **model_tol())


def seeded_compile(cls):
    """(model, input [4, 32], the model under torch.compile with the flydsl backend on the reference
    backend) of cls(), built after seeding torch with 0."""
    torch.manual_seed(0)
    m = cls().eval()
    return m, torch.randn(4, 32), torch.compile(m, backend="flydsl", options={"backend": "reference"})


class WithBreak(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.a = nn.Linear(32, hidden)
        self.b = nn.Linear(hidden, 32)

    def forward(self, x):
        h = F.gelu(self.a(x))
        torch._dynamo.graph_break()
        return torch.softmax(self.b(h), -1)


def test_graph_break_gives_two_translated_graphs(flydsl_ops):
    m, x, compiled = seeded_compile(WithBreak)
    with torch.no_grad():
        compiled(x)  # first call: translate (and verify) each graph
        flydsl_ops.calls.clear()
        got = compiled(x)
    recs = compile_backend.reports()
    assert len(recs) == 2 and all(r.report and r.fallback_reason is None for r in recs)
    assert flydsl_ops.calls.count("gemm") == 2
    assert [r.calls_translated for r in recs] == [2, 2] and not any(r.calls_pytorch for r in recs)
    assert any("graph_break" in b for r in recs for b in r.graph_breaks), [r.line() for r in recs]  # dynamo's reason
    torch.testing.assert_close(got, m(x), **model_tol(check="few_ops"))


class BreakInBlock(WithBreak):
    def __init__(self):
        super().__init__(hidden=32)

    def forward(self, x):
        h = self.a(x)
        torch._dynamo.graph_break()
        return x + self.b(torch.relu(h))


class Stack(nn.Module):
    """Dynamo compiles BreakInBlock's two halves once and calls them per block, each time with
    that block's parameters: the backend must not serve every block with the first one's."""

    def __init__(self, n=3):
        super().__init__()
        self.blocks = nn.ModuleList([BreakInBlock() for _ in range(n)])

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


def test_a_graph_reused_across_blocks_uses_each_blocks_weights(flydsl_ops):
    m, x, compiled = seeded_compile(Stack)
    with torch.no_grad():
        first = compiled(x)
        flydsl_ops.calls.clear()
        again = compiled(x)
        want = m(x)
    recs = compile_backend.reports()
    assert len(recs) == 2 and all(len(r.translated) == 3 and r.calls_pytorch == 0 for r in recs), [r.line() for r in recs]
    assert flydsl_ops.calls.count("gemm") == 6  # every block's two linears ran as flydsl ops
    torch.testing.assert_close(first, want, **model_tol(check="few_ops"))
    torch.testing.assert_close(again, want, **model_tol(check="few_ops"))


def test_weight_sets_past_the_limit_run_in_pytorch_with_their_own_weights(monkeypatch):
    monkeypatch.setattr(compile_backend, "MAX_WEIGHT_SETS", 1)
    m, x, compiled = seeded_compile(Stack)
    with pytest.warns(UserWarning, match="more than 1 sets of weights"), torch.no_grad():
        got = compiled(x)
    recs = compile_backend.reports()
    assert all(r.calls_translated == 1 and r.calls_pytorch == 2 and r.weight_sets_reason for r in recs)
    assert "sets of weights" in recs[0].line()
    torch.testing.assert_close(got, m(x), **model_tol(check="few_ops"))


def test_new_shapes_are_translated_again():
    model, _ = load_model("mini_gpt")
    compiled = torch.compile(model, backend="flydsl", options={"backend": "reference"})
    with torch.no_grad():
        for shape in [(2, 16, 128), (3, 16, 128), (2, 8, 128)]:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), model(x), **model_tol())
    recs = compile_backend.reports()
    assert recs and all(r.fallback_reason is None and r.translated for r in recs)


def test_unknown_option_is_one_clear_error():
    m = nn.Linear(8, 8)
    with pytest.raises(Exception, match="does not know the option"):
        torch.compile(m, backend="flydsl", options={"archh": "gfx942"})(torch.randn(2, 8))


def test_graph_translate_cannot_take_runs_as_given_with_reason(monkeypatch):
    import translator.api as api

    def no_capture(*a, **k):
        raise translator.CaptureError("could not capture the model: (simulated)")

    monkeypatch.setattr(api, "capture", no_capture)
    m = nn.Linear(8, 8).eval()
    x = torch.randn(2, 8)
    with pytest.warns(UserWarning, match="runs in PyTorch as dynamo captured it: CaptureError"):
        got = torch.compile(m, backend="flydsl", options={"backend": "reference"})(x)
    torch.testing.assert_close(got, m(x))
    rec = compile_backend.reports()[0]
    assert "simulated" in rec.fallback_reason
    assert (rec.calls_translated, rec.calls_pytorch) == (0, 1) and "1 in PyTorch" in rec.line()


def test_backend_name_works_without_importing_translator():
    code = ("import sys, torch\n"
            "m = torch.nn.Sequential(torch.nn.Linear(16, 16)).eval()\n"
            "x = torch.randn(2, 16)\n"
            "assert 'translator' not in sys.modules\n"
            "y = torch.compile(m, backend='flydsl', options={'backend': 'reference'})(x)\n"
            "assert 'translator' in sys.modules\n"
            "from translator.frontends import compile_backend\n"
            "assert compile_backend.reports()[0].report.verification.passed\n"
            "print('ok', float((y - m(x)).abs().max()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")


def test_flysim_runs_the_gemm_kernel():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 16)).eval()
    x = torch.randn(4, 32)
    compiled = torch.compile(m, backend="flydsl", fullgraph=True, options={"backend": "flysim"})
    with torch.no_grad():
        got = compiled(x)
    tm = compile_backend.reports()[0].translated[0]
    assert tm.backend == "flysim"
    assert [r for r in tm.report.rows if r.where == "flydsl-kernel"]
    assert tm.last_launches, "flysim recorded no kernel launch"
    torch.testing.assert_close(got, m(x), **model_tol())


@pytest.mark.parametrize("path", ["translated", "runs as given"])
def test_weights_are_frozen_at_compile_time(path, monkeypatch):
    """In-place updates of the model's weights after compiling change nothing (README: frozen)."""
    if path == "runs as given":
        import translator.api as api

        def no_capture(*a, **k):
            raise translator.CaptureError("could not capture the model: (simulated)")

        monkeypatch.setattr(api, "capture", no_capture)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)).eval()
    x = torch.randn(3, 16)
    compiled = torch.compile(m, backend="flydsl", options={"backend": "reference"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "runs as given" case warns, as it should
        before = compiled(x)
        m[0].weight.add_(1.0)  # a training step, in place
        m[1].weight.mul_(3.0)
        m[1].bias.add_(0.5)
        after = compiled(x)
    assert not torch.allclose(m(x), before)  # the model did change
    torch.testing.assert_close(after, before)  # the compiled one did not
    rec = compile_backend.reports()[0]
    assert (rec.fallback_reason is not None) == (path == "runs as given")
