"""RMSNorm folded into the GEMM that reads it at decode shapes (translator/lowerings/norm_gemm.py): the rule
fired (counter `norm_gemm`), no RMSNorm launch is left, verification passes and the outputs match eager, on
a tiny HF Llama and the gpt-fast-style decoder at one token; prefill (M > norm_gemm.M_MAX) keeps the norm;
the folded weight W·diag(γ) follows the user's parameters (an in-place update, `tm.refresh_weights()`)
and the user's parameters are left as they were."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import translator
from translator.lowerings import norm_gemm
from translator.tolerances import model_tol

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_layer_launches import _gptfast, _hf_llama  # noqa: E402  (the per-layer test's two models)

RMS = torch.ops.flydsl.rms_norm.default


def _decode(make, layers=1, tokens=1):
    m, x = make(layers)
    ids = x[0][:, :tokens]
    return m, (ids,) + ((torch.arange(3, 3 + tokens),) if len(x) > 1 else ())


def _out(y):
    y = getattr(y, "logits", y)
    return y[0] if isinstance(y, (tuple, list)) else y


@pytest.mark.parametrize("make,dtype", [(_hf_llama, torch.bfloat16), (_gptfast, torch.float32)],
                         ids=["hf_llama-bf16", "gpt_fast-fp32"])
def test_decode_norms_fold_into_their_gemms_on_flysim(make, dtype):
    m, x = _decode(make)
    m = m.to(dtype)
    tm = translator.translate(m, x, backend="flysim", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("norm_gemm") == 3  # attention and MLP norms of the layer, and the final norm
    assert not [n for n in tm.gm.graph.nodes if n.target is RMS]
    with torch.no_grad():
        got, want = _out(tm(*x)), _out(m(*x))
    fams = [c.family for c in tm.last_calls]
    # QKV (+ attention norm), O proj, gate + up (+ MLP norm), down, LM head (+ final norm): no norm launch
    assert [f for f in fams if f in ("rms_norm", "gemm", "gemm_gated")] == ["gemm", "gemm", "gemm_gated", "gemm",
                                                                             "gemm"], fams
    assert all(c.launches for c in tm.last_calls if c.family in ("gemm", "gemm_gated"))
    torch.testing.assert_close(got, want, **model_tol(dtype))


def test_prefill_keeps_the_norm_kernel():
    m, x = _decode(_hf_llama, tokens=norm_gemm.M_MAX + 4)
    tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("norm_gemm", 0) == 0
    assert len([n for n in tm.gm.graph.nodes if n.target is RMS]) == 3


def test_folded_weight_follows_the_parameters_and_leaves_them_alone():
    m, x = _decode(_hf_llama)
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
    assert tm.report.counters.get("norm_gemm") == 3
    for k, v in m.state_dict().items():  # γ was folded into a copy, not into the user's weights
        assert torch.equal(v, before[k]), k
    layer = m.model.layers[0]
    with torch.no_grad():
        layer.input_layernorm.weight.mul_(1.5)  # seen by its version counter at the next forward
        layer.mlp.up_proj.weight.add_(0.01)
        torch.testing.assert_close(_out(tm(*x)), _out(m(*x)), **model_tol())
        layer.post_attention_layernorm.weight.data.copy_(torch.linspace(0.5, 2.0, 128))  # unseen: refresh
        assert tm.refresh_weights() > 0
        torch.testing.assert_close(_out(tm(*x)), _out(m(*x)), **model_tol())


@pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py
def test_compile_generation_folds_the_decode_graph_only():
    """torch.compile(dynamic=False): the prefill graph (8 tokens) keeps its norms, the decode graph (1 token) folds
    them; the greedy tokens are eager's and the user's cache holds what eager's does."""
    from bundled_models import load_module  # tests/ is on sys.path (tests/conftest.py)
    from translator.frontends import compile_backend

    D = load_module("_static_cache_decoder", "_norm_gemm")
    torch.manual_seed(0)
    m = D.Model("reshape", D.TINY).eval()
    prompt = torch.randint(0, D.TINY.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    D.reset_caches(m)
    tokens = D.generate(m, prompt, 4)
    caches = [c.clone() for c in D.caches(m)]
    D.reset_caches(m)
    cm = torch.compile(m, backend="flydsl", dynamic=False, options={"backend": "reference"})
    assert D.generate(cm, prompt, 4) == tokens
    for got, want in zip(D.caches(m), caches):
        torch.testing.assert_close(got, want, **model_tol())
    recs = compile_backend.reports()
    assert [r.calls_translated for r in recs] == [1, 3]  # prefill, then the decode graph
    folds = [r.translated[-1].report.counters.get("norm_gemm", 0) for r in recs]
    assert folds == [0, 2 * D.TINY.n_layer + 1], folds
