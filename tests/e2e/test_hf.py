"""HuggingFace models from tiny random configs (no download) through translate(): BERT,
GPT-2, Llama, ViT, T5 encoder in attn_implementation "eager" and "sdpa"; decoders with
their cache turned off for the user; an attention implementation we cannot capture."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol
import transformers as T

import translator
from translator import InputError


def build(kind, attn):
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 8))
    if kind == "bert":
        cfg = T.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=64)
        m = T.BertModel(cfg, add_pooling_layer=False)
    elif kind == "gpt2":
        cfg = T.GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                           eos_token_id=0)
        m = T.GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = T.LlamaConfig(vocab_size=100, hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
        m = T.LlamaForCausalLM(cfg)
    elif kind == "vit":
        cfg = T.ViTConfig(image_size=16, patch_size=8, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=128)
        m = T.ViTModel(cfg, add_pooling_layer=False)
        ids = torch.randn(2, 3, 16, 16)
    else:
        cfg = T.T5Config(vocab_size=100, d_model=64, d_kv=32, d_ff=128, num_layers=1, num_heads=2)
        m = T.T5EncoderModel(cfg)
    m.config._attn_implementation = attn
    return m.eval(), ids


def main_output(out):
    return out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state


def in_flydsl(report, aten_op):
    rows = [r for r in report.rows if r.op == aten_op]
    return bool(rows) and all(r.where != "pytorch" for r in rows)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "vit", "t5"])
def test_hf_model_translates_and_verifies(kind, attn):
    m, x = build(kind, attn)
    tm = translator.translate(m, (x,), backend="reference")
    r = tm.report
    assert r.verification.passed, r.verification.message
    families = {row.detail.split()[0] for row in r.rows if row.where != "pytorch"}
    assert "flydsl.gemm" in families  # linears (GPT-2's Conv1D addmm included)
    assert any("norm" in f for f in families)  # LayerNorm / T5 and Llama RMSNorm
    if attn == "sdpa":
        assert in_flydsl(r, "aten.scaled_dot_product_attention")
    else:
        assert in_flydsl(r, "aten.softmax") or in_flydsl(r, "aten._softmax")
    assert sum(r.counters.get(k, 0) for k in ("linear", "addmm", "matmul", "qkv_merged_linears")) >= 4
    with torch.no_grad():
        want = main_output(m(x))  # the user's call, cache and all
        got = main_output(tm(x))
    torch.testing.assert_close(got, want, **model_tol())
    if kind in ("gpt2", "llama"):
        assert any("use_cache=False" in n for n in r.capture_notes)


def test_user_model_is_not_modified():
    m, x = build("gpt2", "sdpa")
    translator.translate(m, (x,), backend="reference")
    assert m.config.use_cache is not False
    with torch.no_grad():
        assert m(x).past_key_values is not None


def test_unsupported_attention_implementation_is_one_clear_error():
    m, x = build("bert", "sdpa")
    m.config._attn_implementation = "flex_attention"
    with pytest.raises(InputError, match=r"attn_implementation='flex_attention'.*sdpa"):
        translator.translate(m, (x,), backend="reference")
