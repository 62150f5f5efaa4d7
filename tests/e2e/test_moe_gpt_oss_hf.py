"""HF gpt-oss's experts (biases, x @ W weights, interleaved gate/up columns, the clamped SwiGLU) on
`flydsl.moe_experts`: the grouped-mm form matched at the model level (translator/lowerings/moe_gpt_oss.py),
the router on `moe_topk`, nothing but layout left in PyTorch, verified against eager."""

from __future__ import annotations

import pytest
import torch

from translator import translate
from translator.tolerances import model_tol


def _gpt_oss(scale: float = 0.0):
    """A one-layer HF gpt-oss tiny (random init); `scale` > 0 redraws the experts' weights and biases
    large enough that the gate / up values reach the clamps (limit 7)."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.GptOssConfig(vocab_size=100, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                         num_experts_per_tok=2, layer_types=["full_attention"])
    m = T.GptOssForCausalLM(cfg).eval()
    m.config._attn_implementation = "eager"
    if scale:
        with torch.no_grad():
            for p in m.model.layers[0].mlp.experts.parameters():
                p.normal_(0, scale)
    return m, torch.randint(0, 100, (2, 6))


def _check(tm):
    c = tm.report.counters
    assert c.get("moe_topk") == 1 and c.get("moe_experts_gpt_oss") == 1, c
    assert tm.report.verification.passed, tm.report.verification.message
    left = {r.op for r in tm.report.rows if r.where == "pytorch" and not r.layout}
    assert left == set(), left
    names = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert not names & {"aten.sort.default", "aten.histc.default", "aten.index_put_.default", "aten.clamp.default",
                        "aten.sigmoid.default"}, names
    assert not any("grouped_mm" in s for s in names), names


def _clamped(m, ids) -> bool:
    """Whether the experts' gate / up values reach the clamps on these inputs (HF's own forward, hooked)."""
    seen = []
    experts = m.model.layers[0].mlp.experts
    orig = experts._apply_gate
    experts._apply_gate = lambda gu: (seen.append(gu.abs().max().item()), orig(gu))[1]
    try:
        with torch.no_grad():
            m(ids)
    finally:
        del experts._apply_gate
    return max(seen) > experts.limit


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_hf_gpt_oss_experts_on_moe_experts_reference(dt):
    m, ids = _gpt_oss(scale=0.6)
    assert _clamped(m, ids)  # the clamps change the numbers here: a missing clamp would fail verification
    m = m.to(dt)
    tm = translate(m, (ids,), backend="reference")
    _check(tm)
    experts = m.model.layers[0].mlp.experts
    with torch.no_grad():
        torch.testing.assert_close(tm(ids).logits, m(ids).logits, **model_tol(dt))
        if dt == torch.float32:  # the prepared weights and biases follow a parameter changed after translation
            experts.down_proj_bias.add_(1.0)
            experts.gate_up_proj_bias.mul_(-1.0)
            experts.gate_up_proj.mul_(0.5)
            torch.testing.assert_close(tm(ids).logits, m(ids).logits, **model_tol(dt))


def test_hf_gpt_oss_experts_on_flysim():
    m, ids = _gpt_oss(scale=0.6)
    tm = translate(m, (ids,), backend="flysim")
    _check(tm)
    rows = [r for r in tm.report.rows if not r.layout and r.where not in ("pytorch",)]
    assert not [r.node for r in rows if r.where in ("flydsl-reference", "flydsl-op")]  # all from launches
    with torch.no_grad():
        got = tm(ids).logits
    names = [getattr(ln, "kernel", str(ln)) for ln in tm.last_launches]
    for part in ("moe_align", "moe_gather", "moe_unpermute"):
        assert any(part in n for n in names), names
    with torch.no_grad():
        torch.testing.assert_close(got, m(ids).logits, **model_tol())
