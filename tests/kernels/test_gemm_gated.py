"""Gated MLPs in one GEMM (translator/lowerings/gated_mlp.py, translator_kernels/gemm/gated.py):
the pattern's counter and the gemm_gated node, numerics vs eager on flysim (the FlyDSL kernel's
gated epilogue) and on the reference backend, SwiGLU / GeGLU with and without bias, the bundled
Llama block and a HF Llama config."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator import translate
from translator_kernels import gemm as G
from translator_kernels.gemm.gated import gated_shape, gated_weight, unarrange_gated

REPO = Path(__file__).resolve().parents[2]
GATED = torch.ops.flydsl.gemm_gated.default


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) as Llama / Mistral / Qwen (silu) and Gemma (gelu tanh) write it."""

    def __init__(self, d=64, f=96, act="silu", bias=False, up_first=False):
        super().__init__()
        self.gate, self.up = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias)
        self.down = nn.Linear(f, d, bias=bias)
        self.act = {"silu": nn.SiLU(), "gelu_tanh": nn.GELU(approximate="tanh"), "gelu": nn.GELU()}[act]
        self.up_first = up_first

    def forward(self, x):
        h = self.up(x) * self.act(self.gate(x)) if self.up_first else self.act(self.gate(x)) * self.up(x)
        return x + self.down(h)


def _gated_nodes(tm):
    return [n for n in tm.gm.graph.nodes if n.target is GATED]


@pytest.mark.parametrize("backend", ["flysim", "reference"])
@pytest.mark.parametrize("act,bias,up_first", [("silu", False, False), ("silu", True, True),
                                                ("gelu_tanh", False, False), ("gelu", True, False)],
                         ids=["swiglu", "swiglu-bias-up-first", "geglu-tanh", "geglu-bias"])
def test_gated_mlp_becomes_one_gemm(backend, act, bias, up_first):
    torch.manual_seed(0)
    m = GatedMLP(act=act, bias=bias, up_first=up_first).eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend=backend)
    assert tm.report.counters["gated_mlp"] == 1, tm.report.counters
    (g,) = _gated_nodes(tm)
    assert g.args[5] == act and (g.args[4] is not None) == bias
    left = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert "aten.mul.Tensor" not in left and "aten.linear.default" not in left, left
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol())


def test_not_gated_when_the_inputs_differ():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False)

        def forward(self, x, y):
            return F.silu(self.gate(x)) * self.up(y)

    tm = translate(TwoInputs().eval(), (torch.randn(3, 32), torch.randn(3, 32)), backend="reference")
    assert "gated_mlp" not in tm.report.counters and not _gated_nodes(tm)
    assert tm.report.verification.passed


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gated_kernel_flysim(arch):
    """The kernel alone: bf16, N = 200 (not a multiple of 16 or of the tile), K tail, biases; one
    launch whose MFMA count covers the 2 x N16 arranged columns."""
    g = torch.Generator().manual_seed(0)
    m, n, k = 19, 200, 250
    x = (torch.randn(m, k, generator=g) / 16).to(torch.bfloat16)
    wg, wu = torch.randn(n, k, generator=g).to(torch.bfloat16), torch.randn(n, k, generator=g).to(torch.bfloat16)
    bg, bu = torch.randn(n, generator=g), torch.randn(n, generator=g)
    w = gated_weight(wg, wu)
    b = gated_weight(bg, bu)
    rg, ru, rbg, rbu = unarrange_gated(w, b, n, k)
    assert torch.equal(rg, wg) and torch.equal(ru, wu) and torch.equal(rbg, bg) and torch.equal(rbu, bu)
    with executors.current().run(arch) as ex:
        out = G.gemm_gated(ex.put(x), ex.put(w), n, k, "silu", bias=ex.put(b))
    (rec,) = ex.launches
    n_cat = gated_shape(n, k)[0]
    cfg = G.choose_config(G.m_bucket(m), n_cat, k, "bf16", arch)
    cfg = G.GemmConfig(cfg.bm, max(cfg.bn, 128), cfg.bk)
    if ex.counts:  # flysim counts the MFMAs it executed
        assert sum(rec.counters["mfma_by_kind"].values()) == G.expected_mfma_count(m, n_cat, k, "bf16", arch, cfg)
    ref = F.silu(x.float() @ wg.float().T + bg) * (x.float() @ wu.float().T + bu)
    torch.testing.assert_close(out.cpu().float(), ref.to(torch.bfloat16).float(), atol=3e-2, rtol=1.6e-2)


def test_llama_block_swiglu_on_flysim():
    """models/llama_block.py: its SwiGLU MLP is one gated GEMM; the whole block matches eager on flysim."""
    sys.path.insert(0, str(REPO / "models"))
    mod = importlib.import_module("llama_block")
    torch.manual_seed(0)
    m = mod.Model(*mod.get_init_inputs()).eval()
    inputs = tuple(mod.get_inputs())
    tm = translate(m, inputs, backend="flysim")
    assert tm.report.counters["gated_mlp"] == 1, tm.report.counters
    (g,) = _gated_nodes(tm)
    assert g.args[5] == "silu" and g.args[2] == mod.intermediate_size
    assert tm.report.verification.passed, tm.report.verification.message


def test_hf_llama_config_every_layer_gated():
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    m = T.LlamaForCausalLM(cfg).eval()
    m.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 100, (2, 8))
    tm = translate(m, (ids,), backend="reference")
    assert tm.report.counters["gated_mlp"] == 2, tm.report.counters
    assert len(_gated_nodes(tm)) == 2 and all(g.args[5] == "silu" for g in _gated_nodes(tm))
    assert tm.report.verification.passed, tm.report.verification.message
