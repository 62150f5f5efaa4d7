"""The rewrites that bring HF families' decode layers to Llama's launch count, each on its own small form.

- gated_packed.py: a gated MLP over one packed [2N, K] gate/up weight (Phi-3's `gate_up_proj`, split by
  `chunk`, `split` or two slices, with or without a bias) is one `gemm_gated` launch;
- rope_pass.py: `cat([rope(x), x[..., D:]])` with an empty pass-through part is the rotation (Phi-3's full
  rotary), so the rotated k reaches the cache write from the RoPE launch;
- rope_norm.py: a per-head RMSNorm read only by a rotation (Qwen3's q_norm / k_norm) rides in the RoPE launch;
  a norm whose output is also read elsewhere stays.
Each: the counter moved, the launches recorded (flysim) or the FlyDSL nodes (reference), eager's numbers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import translator
from translator.tolerances import model_tol

transformers = pytest.importorskip("transformers")

from test_generation_hf_more import PROMPT, _assert_same_cache, _eager_run, _greedy, _ids, _kv, _model  # noqa: E402
from translator.frontends.generation import cache_tensors  # noqa: E402


class PackedMLP(torch.nn.Module):
    """Phi-3's MLP (`up * silu(gate)` after one projection), with the split written three ways."""

    def __init__(self, form: str, bias: bool = False, k: int = 32, n: int = 16):
        super().__init__()
        self.form = form
        self.gate_up = torch.nn.Linear(k, 2 * n, bias=bias)
        self.down = torch.nn.Linear(n, k, bias=False)

    def forward(self, x):
        y = self.gate_up(x)
        n = y.shape[-1] // 2
        if self.form == "chunk":
            gate, up = y.chunk(2, dim=-1)
        elif self.form == "split":
            gate, up = y.split(n, dim=-1)
        else:
            gate, up = y[..., :n], y[..., n:]
        return self.down(up * F.silu(gate))


def _flydsl_nodes(tm):
    return [str(n.target).split(".")[1] for n in tm.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("flydsl.")]


@pytest.mark.parametrize("form,bias", [("chunk", False), ("split", True), ("slices", False)])
def test_packed_gate_up_is_one_gated_gemm(form, bias):
    torch.manual_seed(0)
    model, x = PackedMLP(form, bias).eval(), torch.randn(2, 3, 32)
    tm = translator.translate(model, (x,), backend="reference")
    assert tm.report.counters.get("gated_mlp_packed") == 1, tm.report.counters
    assert _flydsl_nodes(tm) == ["gemm_gated", "gemm"], _flydsl_nodes(tm)
    with torch.no_grad():
        torch.testing.assert_close(tm(x), model(x), **model_tol())


def test_flysim_packed_gate_up_launches_one_gated_gemm():
    torch.manual_seed(0)
    model, x = PackedMLP("chunk").eval(), torch.randn(2, 3, 32)
    tm = translator.translate(model, (x,), backend="flysim")
    with torch.no_grad():
        got = tm(x)
    # the gated GEMM's kernel is the GEMM kernel with a gating epilogue (its name is gemm's): each op's launches
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [("gemm_gated", 1), ("gemm", 1)], tm.last_calls
    assert len(tm.last_launches) == 2
    torch.testing.assert_close(got, model(x), **model_tol())


def test_a_gate_half_read_elsewhere_keeps_the_gemm():
    """The packed output's gate half also returned: the [M, 2N] product is needed, no gated GEMM."""

    class Leaky(PackedMLP):
        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(up * F.silu(gate)), gate

    torch.manual_seed(0)
    model, x = Leaky("chunk").eval(), torch.randn(2, 3, 32)
    tm = translator.translate(model, (x,), backend="reference")
    assert "gated_mlp_packed" not in tm.report.counters
    with torch.no_grad():
        for g, w in zip(tm(x), model(x)):
            torch.testing.assert_close(g, w, **model_tol())


def test_phi3_layer_rewrites_fire_and_keep_eagers_tokens_and_cache():
    """Phi-3 (full rotary): the packed gate_up is one gated GEMM per layer, the empty pass-through cats are
    gone, both cache writes ride in the RoPE launch; eager's tokens and StaticCache."""
    model, ids = _model("phi3"), _ids()
    n = 6
    want, cache = _eager_run(model, ids, n)
    gen = translator.translate_for_generation(model, ids, max_cache_len=32, backend="reference")
    c = gen.translated.report.counters
    assert c.get("gated_mlp_packed") == 2 and c.get("rope_empty_pass") == 4 and c.get("rope_cache_write") == 2, c
    assert "cache_write" not in _flydsl_nodes(gen.translated)[5:]  # only the step's counter reset, before layer 0
    assert _greedy(gen, ids, n) == want
    _assert_same_cache(cache_tensors(gen.translated), _kv(cache), PROMPT + n - 1)


class QKNormRope(torch.nn.Module):
    """A per-head RMSNorm then rotate-half RoPE (Qwen3's attention before its cache write), written by hand;
    `leak`: the normalized q is also returned, so its norm must stay."""

    def __init__(self, heads=4, d=16, leak=False):
        super().__init__()
        self.heads, self.d, self.leak = heads, d, leak
        self.w = torch.nn.Parameter(torch.randn(d))
        ang = torch.randn(8, d // 2)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, x):
        b, s, _ = x.shape
        qn = F.rms_norm(x.view(b, s, self.heads, self.d), (self.d,), self.w, 1e-6)
        q = qn.transpose(1, 2)
        h = self.d // 2
        cos, sin = self.cos[:s], self.sin[:s]
        out = q * cos + torch.cat((-q[..., h:], q[..., :h]), -1) * sin
        return (out, qn) if self.leak else out


@pytest.mark.parametrize("leak", [False, True])
def test_head_norm_before_rope_folds_unless_read_elsewhere(leak):
    torch.manual_seed(0)
    model, x = QKNormRope(leak=leak).eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="reference")
    assert tm.report.counters.get("rope_norm") == (None if leak else 1), tm.report.counters
    assert _flydsl_nodes(tm) == (["rms_norm", "rope"] if leak else ["rope"]), _flydsl_nodes(tm)
    with torch.no_grad():
        got, want = tm(x), model(x)
    for g, w in zip(got if leak else [got], want if leak else [want]):
        torch.testing.assert_close(g, w, **model_tol())


def test_flysim_head_norm_and_rope_are_one_launch():
    torch.manual_seed(0)
    model, x = QKNormRope().eval(), torch.randn(1, 5, 64)
    tm = translator.translate(model, (x,), backend="flysim")
    with torch.no_grad():
        got = tm(x)
    assert [(c.family, len(c.launches)) for c in tm.last_calls] == [("rope", 1)], tm.last_calls
    assert [ln.kernel.split("_kernel")[0] for ln in tm.last_launches] == ["rope_cache"]
    torch.testing.assert_close(got, model(x), **model_tol())
