"""HF `generate()` with a static cache on families nobody fitted the translator to (issue 23 item 5).

Tried as a new user would: tiny random-init configs (2 layers, so that alternating layers alternate),
greedy tokens and the KV cache compared with eager's, through `translate_for_generation` and through
`model.forward = torch.compile(model.forward, backend="flydsl")` with the caller's StaticCache.

- Qwen3 (q/k RMSNorm before RoPE), OLMo2 (q/k norm over all heads), GPT-NeoX (partial rotary,
  parallel residual): eager's tokens and cache on both paths.
- Gemma2 (attention logit soft-capping: transformers runs it only with attn_implementation="eager",
  so the scores are an explicit matmul / tanh / softmax chain; final logit soft-capping), Gemma3
  (q/k norm, sliding and full layers alternating): eager's tokens and cache on both paths; with Gemma2's
  window shorter than the generation, torch.compile serves the hybrid cache, and translate_for_generation
  refuses (its recipe makes every layer a plain static one).
- Phi3 (fused qkv_proj, fused gate_up_proj; RoPE written as `cat(rot, pass)`): tokens were right, but
  `generation.cache_tensors` gave the values where the keys belong: RoPE fused the V cache write while
  K's write stayed separate, so V was written first in the graph, and the list followed the writes.
- Falcon with multi_query=True: the recipe sizes its cache from `num_key_value_heads` (absent: the
  query head count), the model writes one K/V head; refused naming the config field to set, and with
  it set, eager's tokens.
flysim (slow): the same on FlyDSL kernels for Qwen3, Gemma2 (also its sliding layers, torch.compile) and Phi3.
"""

from __future__ import annotations

import pytest
import torch

import translator
from translator.errors import InputError
from translator.frontends import compile_backend
from translator.frontends.generation import cache_tensors

transformers = pytest.importorskip("transformers")
PROMPT, MAX_LEN = 6, 32


def _model(family: str, window: int = 64):
    T = transformers
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    gqa = dict(common, num_key_value_heads=2)
    cfg, cls, attn = {
        "qwen3": (lambda: T.Qwen3Config(head_dim=16, **gqa), T.Qwen3ForCausalLM, "sdpa"),
        "olmo2": (lambda: T.Olmo2Config(**gqa), T.Olmo2ForCausalLM, "sdpa"),
        "gpt_neox": (lambda: T.GPTNeoXConfig(rotary_pct=0.25, **common), T.GPTNeoXForCausalLM, "sdpa"),
        "gemma2": (lambda: T.Gemma2Config(head_dim=16, sliding_window=window, **gqa), T.Gemma2ForCausalLM, "eager"),
        "gemma3": (lambda: T.Gemma3TextConfig(head_dim=16, sliding_window=window, sliding_window_pattern=2, **gqa),
                   T.Gemma3ForCausalLM, "sdpa"),
        "phi3": (lambda: T.Phi3Config(pad_token_id=0, **gqa), T.Phi3ForCausalLM, "sdpa"),
        "falcon": (lambda: T.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          multi_query=True, parallel_attn=True, max_position_embeddings=64),
                   T.FalconForCausalLM, "sdpa"),
    }[family]
    torch.manual_seed(0)
    return cls._from_config(cfg(), attn_implementation=attn).eval()


def _ids():
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))


def _greedy(model, ids, n, **kw):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)[0, PROMPT:].tolist()


def _eager_run(model, ids, n):
    """Eager's tokens and StaticCache (max_cache_len MAX_LEN) after n greedy tokens."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
    return _greedy(model, ids, n, cache=cache), cache


def _kv(cache):
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _assert_same_cache(got, want, upto):
    """Keys where eager has keys, values where eager has values, at the positions generate wrote."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        torch.testing.assert_close(g[:, :, :upto], w[:, :, :upto], msg=lambda m, i=i: f"cache tensor {i}: {m}")


def _translated(family, n, backend="reference"):
    model, ids = _model(family), _ids()
    want, cache = _eager_run(model, ids, n)
    gen = translator.translate_for_generation(model, ids, max_cache_len=MAX_LEN, backend=backend)
    return gen, _greedy(gen, ids, n), want, cache


def _compiled(family, n, backend="reference", window=64):
    model, ids = _model(family, window), _ids()
    want, eager_cache = _eager_run(model, ids, n)
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
    model.forward = torch.compile(model.forward, backend="flydsl", options={"backend": backend})
    return _greedy(model, ids, n, cache=cache), want, cache, eager_cache


def _assert_all_translated(n):
    recs = compile_backend.reports()
    assert sum(r.calls_translated for r in recs) == n and not any(r.calls_pytorch for r in recs), \
        compile_backend.summary()
    assert not any(r.dynamo_fallback or r.fallback_reason for r in recs), compile_backend.summary()


@pytest.mark.parametrize("family", ["phi3", "gemma2", "gpt_neox"])
def test_translate_for_generation_gives_eagers_tokens_and_cache(family):
    """Phi3 is the regression: keys and values were swapped in cache_tensors (module notes)."""
    n = 12
    gen, got, want, cache = _translated(family, n)
    assert got == want
    assert gen.translated.report.verification.passed
    _assert_same_cache(cache_tensors(gen.translated), _kv(cache), PROMPT + n - 1)
    assert not [r.op for r in gen.translated.report.rows if r.where == "pytorch" and not r.layout]


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_compile_generation_gives_eagers_tokens_and_cache(family):
    n = 8
    got, want, cache, eager_cache = _compiled(family, n)
    assert got == want
    _assert_all_translated(n)
    _assert_same_cache(_kv(cache), _kv(eager_cache), PROMPT + n - 1)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_serves_gemma2s_sliding_window_layers():
    """A window of 8 under a 6 + 12 token generation: the hybrid cache's sliding layers roll (eager's
    StaticSlidingWindowLayer), the full layers do not; translate_for_generation refuses the same model."""
    n = 12
    got, want, cache, eager_cache = _compiled("gemma2", n, window=8)
    assert got == want
    _assert_all_translated(n)
    _assert_same_cache(_kv(cache), _kv(eager_cache), PROMPT + n - 1)
    with pytest.raises(InputError, match="sliding window of 8 tokens.*max_cache_len <= 8"):
        translator.translate_for_generation(_model("gemma2", window=8), _ids(), max_cache_len=MAX_LEN)


def test_falcon_multi_query_is_refused_naming_the_config_field():
    with pytest.raises(InputError, match=r"num_key_value_heads.*Falcon with multi_query=True: 1"):
        translator.translate_for_generation(_model("falcon"), _ids(), max_cache_len=MAX_LEN)


@pytest.mark.slow
def test_falcon_multi_query_with_the_named_fix_gives_eagers_tokens():
    model, ids = _model("falcon"), _ids()
    want = _greedy(model, ids, 6)
    model.config.num_key_value_heads = 1  # the fix the message names
    gen = translator.translate_for_generation(model, ids, max_cache_len=MAX_LEN)
    assert _greedy(gen, ids, 6) == want


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "olmo2", "gemma3"])
def test_translate_for_generation_more_families(family):
    n = 12
    gen, got, want, cache = _translated(family, n)
    assert got == want
    _assert_same_cache(cache_tensors(gen.translated), _kv(cache), PROMPT + n - 1)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gemma2", "phi3"])
def test_flysim_translate_for_generation_16_tokens(family):
    n = 16
    gen, got, want, cache = _translated(family, n, backend="flysim")
    assert got == want
    launched = [ln.kernel for ln in gen.translated.last_launches]
    assert any("gemm" in k for k in launched) and any("scatter" in k for k in launched), launched
    _assert_same_cache(cache_tensors(gen.translated), _kv(cache), PROMPT + n - 1)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("family", ["qwen3", "gemma2", "phi3"])
def test_flysim_compile_generation_16_tokens(family):
    n = 16
    got, want, cache, eager_cache = _compiled(family, n, backend="flysim")
    assert got == want
    _assert_all_translated(n)
    _assert_same_cache(_kv(cache), _kv(eager_cache), PROMPT + n - 1)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_flysim_compile_serves_gemma2s_sliding_window_layers():
    """Window 8 under 6 + 12 tokens on FlyDSL kernels: three graphs (prefill, decode before the sliding
    layers' window is full, decode after), eager's tokens and cache."""
    n = 12
    got, want, cache, eager_cache = _compiled("gemma2", n, backend="flysim", window=8)
    assert got == want
    _assert_all_translated(n)
    _assert_same_cache(_kv(cache), _kv(eager_cache), PROMPT + n - 1)
