"""The matcher audit: attention blocks written afresh, in the styles of code outside this tree
(attention_audit_forms.py), each through translate() on flysim: its one attention chain became
flydsl.attention (the counter moved, the kernel launched, no softmax or bmm of the chain left)
and the output matches eager within the tolerance table.

The audit's two misses, fixed here (tests in the default run):
- nn.MultiheadAttention as cross attention with its default need_weights=True: export keeps
  the query's and the memory's batch sizes apart, so K / V's head_dim reads (8*s70)//s77 after
  ``k.view(Sk, bsz * H, head_dim)``; the chain was declined as "head_dim ... differs" although
  the view's literal 8 is the only size it can have (attention_forms.fixed_dim).
- older HF Bloom: ``alibi.baddbmm(q, kᵀ, alpha=1/sqrt(d))`` over [B*H, Sq, Sk], viewed as
  [B, H, Sq, Sk] for the masked_fill, bmm with V over [B*H]: the ALiBi bias lives in the
  product's frame, the mask in the view's; declined as "masks or scales apply to different
  views". Now the [B*H] mask is split with the operands.
- HF GPT-2 with reorder_and_upcast_attn: ``baddbmm(torch.empty(..), q, kᵀ, beta=0, alpha=c)``
  over [B*H] reshapes of [B, H, S, D] q / kᵀ, upcast to fp32, viewed back to [B, H, Sq, Sk] and
  multiplied by a [B, H, Sk, D] V: declined ("baddbmm with beta=0"); beta=0 is now a scale
  only, and the kernel reads the [B, H, S, D] q and k the reshapes came from.
- a softmax written out by hand, ``e = exp(s - s.amax(-1, keepdim=True)); e / e.sum(-1, keepdim=True)``:
  no softmax node, so not even a chain; now it becomes aten.softmax first (attention_softmax).
- a causal mask built in forward (j > i over aranges, torch.triu of ones or of -inf) ran as a
  bool / float mask tensor computed on every call; it is now the kernel's `causal` flag.
decode_kv_cache_cat (K / V from torch.cat) and timm_qkv_unbind (q, k, v from unbind) guard
fixed_dim: it once read an operand by name on every op and crashed the support check on them.
Every other form matched before the audit; they run with `-m slow` (table in docs/attention.md).
"""

from __future__ import annotations

import pytest
import torch

from translator import translate
from translator.tolerances import model_tol

from attention_audit_forms import (AnnotatedTransformer, ArangeCausal, ArangeKeep, BertAdditive,  # noqa: E402
                                   BloomBaddbmm, DecodeKVCache, DropoutEval, Einsum, FloatTypeAs, GQA, InplaceBias,
                                   InplaceMaskedFill, KPermute, KPermuteFromBSHD, MHA, MHACross, ManualSoftmax,
                                   ManualSoftmaxAlone, Plain, QPreScaled, ReorderUpcast, ScaleBuffer, ScaleFull, ScaleTensorSqrt, Sdpa, SoftCap,
                                   SoftmaxDim3, SoftmaxDtype, SoftmaxModule, SwinV2, T5, Temperature, TimmQKV,
                                   TriuBoolFill, TriuNegInf, WhereFinfoCausal, WhereInputMask, XTransformers,
                                   alibi_slopes, qkv, rnd)
from attention_helpers import ops  # noqa: E402
from attention_helpers import fused_or_reasoned, translate_and_enumerate  # noqa: E402

pytest.importorskip("flysim")

bf = torch.bfloat16
HW, SDPA = "attention_handwritten", "sdpa"


def _alibi(h, b, sk, dtype=torch.float32):
    return (alibi_slopes(h)[:, None, None] * torch.arange(sk)[None, None, :]).repeat(b, 1, 1).to(dtype)


# name: (build the model, its inputs, the counter that must move)
CASES = {
    # fixed by the audit
    "mha_cross_default_weights": (MHACross, lambda: (rnd(2, 3, 32), rnd(2, 9, 32, seed=5)), HW),
    "mha_cross_bf16": (lambda: MHACross(64, 2).to(bf), lambda: (rnd(2, 5, 64, dtype=bf), rnd(2, 4, 64, seed=5, dtype=bf)),
                       HW),
    "bloom_baddbmm_alibi": (lambda: BloomBaddbmm(2), lambda: (
        rnd(4, 5, 16, seed=1), rnd(4, 5, 16, seed=2), rnd(4, 5, 16, seed=3), _alibi(2, 2, 5),
        torch.ones(5, 5, dtype=torch.bool).triu(1)), HW),
    "bloom_bf16_sq_ne_sk": (lambda: BloomBaddbmm(4), lambda: (
        rnd(8, 3, 16, seed=1, dtype=bf), rnd(8, 6, 16, seed=2, dtype=bf), rnd(8, 6, 16, seed=3, dtype=bf),
        _alibi(4, 2, 6, bf), torch.zeros(3, 6, dtype=torch.bool)), HW),
    "gpt2_reorder_upcast": (ReorderUpcast, lambda: (*qkv(h=3, sq=6, sk=9, d=24), rnd(1, 1, 6, 9, seed=6)), HW),
    "gpt2_reorder_upcast_bf16": (ReorderUpcast, lambda: (*qkv(sq=5, dtype=bf), rnd(1, 1, 5, 5, seed=6)), HW),
    "manual_softmax_amax": (ManualSoftmax, lambda: qkv(sq=6, sk=9, d=24), HW),
    "manual_softmax_max_values_bf16": (lambda: ManualSoftmax("max"), lambda: qkv(sq=5, dtype=bf), HW),
    # matched before the audit
    "where_finfo_causal_d24": (WhereFinfoCausal, lambda: qkv(h=3, sq=9, d=24), HW),
    "where_finfo_causal_bf16_sq_lt_sk": (WhereFinfoCausal, lambda: qkv(sq=5, sk=11, dtype=bf), HW),
    "where_bool_input_sq_ne_sk": (WhereInputMask, lambda: (*qkv(b=2, sq=5, sk=9, d=32),
                                                           rnd(2, 1, 5, 9, seed=4) > -0.5), HW),
    "scale_full_d40": (ScaleFull, lambda: qkv(sq=9, d=40), HW),
    "scale_tensor_sqrt_bf16": (ScaleTensorSqrt, lambda: qkv(sq=6, d=64, dtype=bf), HW),
    "scale_buffer": (lambda: ScaleBuffer(16), lambda: qkv(), HW),
    "mha_default_weights_batch_first": (MHA, lambda: (rnd(2, 7, 48),), HW),
    "mha_default_weights_seq_first": (lambda: MHA(batch_first=False), lambda: (rnd(7, 2, 48),), HW),
    "mha_need_weights_false": (lambda: MHA(need_weights=False), lambda: (rnd(2, 5, 48),), SDPA),
    "mha_cross_need_weights_false": (lambda: MHACross(need_weights=False),
                                     lambda: (rnd(2, 3, 32), rnd(2, 9, 32, seed=5)), SDPA),
    "mha_float_attn_mask": (MHA, lambda: (rnd(2, 5, 48), torch.triu(torch.full((5, 5), float("-inf")), 1)), HW),
    "mha_bool_attn_mask_seq_first": (lambda: MHA(batch_first=False),
                                     lambda: (rnd(5, 2, 48), torch.ones(5, 5, dtype=torch.bool).triu(1)), HW),
    "mha_key_padding_mask": (MHA, lambda: (rnd(2, 6, 48), None, torch.arange(6).expand(2, 6) > 3), HW),
    "softcap_bf16": (SoftCap, lambda: qkv(sq=9, d=32, dtype=bf), HW),
    "swin_v2_cosine": (lambda: SwinV2(3), lambda: qkv(h=3), HW),
    "gqa_repeat_interleave": (lambda: GQA("repeat_interleave", 2), lambda: qkv(h=4, hkv=2, sq=5), HW),
    "gqa_expand_reshape_bf16": (lambda: GQA("expand_reshape", 3), lambda: qkv(h=6, hkv=2, sq=5, dtype=bf), HW),
    "mqa_repeat_kv_sq_ne_sk": (lambda: GQA("repeat_kv", 4), lambda: qkv(h=4, hkv=1, sq=3, sk=8), HW),
    "inplace_bias_add": (InplaceBias, lambda: (*qkv(sq=6), rnd(1, 2, 6, 6, seed=7)), HW),
    "inplace_masked_fill": (InplaceMaskedFill, lambda: (*qkv(b=2, sq=5), torch.arange(5).expand(2, 5) > 2), HW),
    **{f"head_dim_{d}": (Plain, (lambda d=d: qkv(sq=5, d=d)), HW) for d in (8, 12, 16, 24, 40, 72, 256)},
    "sdpa_is_causal_d24": (lambda: Sdpa(is_causal=True), lambda: qkv(sq=9, d=24), SDPA),
    "sdpa_scale_sq_ne_sk": (lambda: Sdpa(scale=0.3), lambda: qkv(sq=5, sk=7), SDPA),
    "sdpa_bool_mask": (Sdpa, lambda: (*qkv(sq=5, sk=6), rnd(1, 1, 5, 6, seed=8) > 0), SDPA),
    "sdpa_float_mask_bf16": (Sdpa, lambda: (*qkv(sq=5, dtype=bf), rnd(1, 2, 5, 5, seed=8, dtype=bf)), SDPA),
    "sdpa_enable_gqa": (lambda: Sdpa(enable_gqa=True), lambda: qkv(h=4, hkv=2, sq=5), SDPA),
    "sdpa_head_dim_12": (Sdpa, lambda: qkv(sq=5, d=12), SDPA),
    "softmax_dim3": (SoftmaxDim3, lambda: qkv(sq=6), HW),
    "softmax_float_type_as_bf16": (FloatTypeAs, lambda: qkv(sq=6, dtype=bf), HW),
    "softmax_dtype_float32_bf16": (SoftmaxDtype, lambda: qkv(sq=6, dtype=bf), HW),
    "dropout_eval": (DropoutEval, lambda: qkv(sq=6), HW),
    "einsum_sq_ne_sk": (Einsum, lambda: qkv(sq=6, sk=4), HW),
    "k_permute": (KPermute, lambda: qkv(sq=6), HW),
    "k_permute_from_bshd": (KPermuteFromBSHD, lambda: (qkv(sq=6)[0], rnd(1, 6, 2, 16, seed=3),
                                                       rnd(1, 6, 2, 16, seed=4)), HW),
    "t5_position_bias": (T5, lambda: (*qkv(sq=6), rnd(1, 2, 6, 6, seed=9)), HW),
    "q_prescaled": (QPreScaled, lambda: qkv(sq=6), HW),
    "arange_causal_masked_fill": (ArangeCausal, lambda: qkv(sq=5, sk=8), HW),
    "arange_causal_where": (ArangeKeep, lambda: qkv(), HW),
    "triu_neg_inf_added": (TriuNegInf, lambda: qkv(), HW),
    "triu_bool_masked_fill": (TriuBoolFill, lambda: qkv(), HW),
    "decode_kv_cache_cat": (DecodeKVCache, lambda: (rnd(1, 2, 1, 16), *(rnd(1, 2, n, 16, seed=s) for n, s in
                                                                        ((7, 1), (7, 2), (1, 3), (1, 4)))), HW),
    "timm_qkv_unbind": (TimmQKV, lambda: (rnd(2, 7, 32),), HW),
    "annotated_transformer_eq0": (AnnotatedTransformer, lambda: (
        *qkv(b=2, sq=5), torch.tensor([[1] * 5, [1] * 3 + [0] * 2])[:, None, None, :]), HW),
    "nn_softmax_module": (SoftmaxModule, lambda: qkv(sq=5), HW),
    "xtransformers_sq_lt_sk": (XTransformers, lambda: qkv(sq=3, sk=6), HW),
    "learned_temperature_div": (Temperature, lambda: qkv(sq=5), HW),
    "bert_additive_mask": (BertAdditive, lambda: (*qkv(b=2, sq=6), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])), HW),
}
FAST = ["mha_cross_default_weights", "bloom_baddbmm_alibi", "arange_causal_masked_fill", "decode_kv_cache_cat",
        "gpt2_reorder_upcast", "manual_softmax_amax"]
NOT_A_CHAIN = {"manual_softmax_amax", "manual_softmax_max_values_bf16"}
CAUSAL = ["arange_causal_masked_fill", "arange_causal_where", "triu_neg_inf_added", "triu_bool_masked_fill"]


def audit(name, monkeypatch):
    """(translated module, its output, eager's output) of one form, with its chain checked."""
    build, inputs, counter = CASES[name]
    torch.manual_seed(0)
    model, x = build().eval(), inputs()
    bf16 = any(isinstance(t, torch.Tensor) and t.dtype == bf for t in x)
    tm, chains = translate_and_enumerate(model, x, monkeypatch, backend="flysim", precision="bf16" if bf16 else "fp32")
    assert tm.report.counters.get(counter) == 1, tm.report.counters
    if name not in NOT_A_CHAIN:  # (a hand-written softmax is not a softmax node: no chain to enumerate)
        assert len(chains) == 1 and fused_or_reasoned(tm, chains) == (chains, {}), chains
    assert not [op for op in ops(tm) if op in ("softmax", "bmm")], tm.code
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        got, want = tm(*x), model(*x)
    assert any("attention" in str(getattr(c, "kernel", c)) for c in tm.last_launches), tm.last_launches
    torch.testing.assert_close(got, want, **model_tol("bf16" if bf16 else "fp32", "few_ops"))
    return tm, got, want


@pytest.mark.parametrize("name", [*FAST, *(pytest.param(n, marks=pytest.mark.slow) for n in CASES if n not in FAST)])
def test_audited_form_becomes_flydsl_attention(name, monkeypatch):
    audit(name, monkeypatch)



def _attention_args(tm):
    (node,) = [n for n in tm.gm.graph.nodes if getattr(n.target, "_opname", "") == "attention"]
    return node.args


@pytest.mark.parametrize("name", [CAUSAL[0], *(pytest.param(n, marks=pytest.mark.slow) for n in CAUSAL[1:])])
def test_causal_mask_built_in_forward_is_the_causal_flag(name, monkeypatch):
    tm, _, _ = audit(name, monkeypatch)
    mask, causal = _attention_args(tm)[3:5]
    assert mask is None and causal is True, _attention_args(tm)
    assert not [n for n in tm.gm.graph.nodes if n.op == "call_function" and "arange" in str(n.target)], tm.code


def test_triu_other_than_causal_stays_a_mask():
    """triu(ones, diagonal=2) keeps one key past the diagonal: a bool mask, not `causal`."""
    model, x = TriuBoolFill(diagonal=2).eval(), qkv()
    tm = translate(model, x, backend="reference")
    assert tm.report.counters.get(HW) == 1, tm.report.counters
    mask, causal = _attention_args(tm)[3:5]
    assert mask is not None and causal is False, _attention_args(tm)
    torch.testing.assert_close(tm(*x), model(*x), **model_tol("fp32", "few_ops"))


def test_hf_gpt2_reorder_and_upcast_attn_is_taken(monkeypatch):
    """The real HF GPT-2 attention with reorder_and_upcast_attn=True (reference backend: the
    kernel's numerics on this form are gpt2_reorder_upcast above)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=2, n_positions=64,
                                  reorder_and_upcast_attn=True)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.config._attn_implementation = "eager"
    ids = (torch.randint(0, 100, (2, 9)),)
    tm, chains = translate_and_enumerate(model, ids, monkeypatch)
    assert tm.report.counters.get(HW) == 1, tm.report.counters
    assert len(chains) == 1 and fused_or_reasoned(tm, chains) == (chains, {}), chains
    assert tm.report.verification.passed, tm.report.verification.message


def test_manual_softmax_outside_attention_is_left_alone():
    model, x = ManualSoftmaxAlone().eval(), (rnd(3, 7),)
    tm = translate(model, x, backend="reference")
    assert "attention_manual_softmax" not in tm.report.counters, tm.report.counters
    torch.testing.assert_close(tm(*x), model(*x), **model_tol("fp32", "few_ops"))
