"""Launches per decoder layer of translate_for_generation's step, per HF family (tiny random-init configs).

A layer's launches are counted between two consecutive attention launches (the first layer's attention up
to the second's): the prefix before layer 0 and the LM head are not per layer. The default tests count the
FlyDSL op nodes of the translated graph (reference backend: each such node is one launch); the slow ones
count what flysim recorded for one decode step, and check that the two agree.

What the counts were before each change (docs/state.md, "Launches per decode step"):
- every family: transformers' export recipe keeps one `cumulative_length` counter per layer, reset per layer
  at the step's start (a one-element scatter) and read and bumped in each layer's cache update (a functional
  add and an in-place add): 3 one-element launches per layer. StaticCacheStep(one_counter=True) shares one
  counter: 3 per step.
- Qwen3 / Gemma3: q_norm and k_norm (an RMSNorm per head row) between the QKV GEMM and RoPE were two row-norm
  launches, and the rotations, reading two norm outputs, were two RoPE launches with only K's write fused
  (V's a separate scatter). rope_norm.py folds the norms into the RoPE launch, which then pairs q and k and
  takes both cache writes: a Qwen3 layer is Llama's 8.
- Phi-3: the packed gate_up_proj was a GEMM and a SiLU-multiply kernel, K's write a scatter after a `cat` with
  an empty pass-through part: gated_packed.py and rope_pass.py make it Llama's 8
  (tests/e2e/test_generation_launches_patterns.py).
- GPT-NeoX (rotary_pct 0.25): the pass-through part was a real `cat` after each rotation, so q's and k's
  rotations were 2 RoPE launches and K's and V's writes 2 scatters (11 per layer); rope_pass.py folds the
  `cat` into the rotation (`rot_dim`) and rope_cache.py pairs them with both writes: Llama's 8.
- OLMo2: q_norm / k_norm run over the projection's whole row (all heads) before the split into heads: 2 row
  norms, then 2 RoPE launches and 2 scatters (15 per layer). rope_norm.py folds a norm whose row the views split
  into whole dims of the rotated tensor (`norm_dims`; the kernel reduces each row in one workgroup) and
  rope_cache.py pairs the rotations with both writes: 10 (its post-norms and their residual adds are left).
- Gemma2 / Gemma3 / OLMo2's last layer: the post-feedforward norm and add (`norm_add`), then the final norm: 2
  launches; norm_sandwich.py folds the three into one `norm_add_rms_norm` (its sum unread).
"""

from __future__ import annotations

import pytest
import torch

import translator

transformers = pytest.importorskip("transformers")

from test_generation_hf_more import (  # noqa: E402  (tests/e2e is on sys.path)
    PROMPT, _assert_same_cache, _compiled, _eager_run, _greedy, _ids, _kv, _model)
from translator.frontends import compile_backend  # noqa: E402
from translator.frontends.generation import cache_tensors  # noqa: E402

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _family(name):
    if name == "llama":
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**LLAMA),
                                                          attn_implementation="sdpa").eval()
    return _model(name)


def _graph_launches(tm):
    """The FlyDSL op nodes of the translated graph, in order (one launch each)."""
    return [str(n.target).split(".")[1] for n in tm.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("flydsl.")]


def _per_layer(names, attention):
    at = [i for i, k in enumerate(names) if attention in k]
    assert len(at) == 2, names
    return names[at[0]:at[1]]


# family -> launches per layer at decode (docs/state.md lists what they are)
PER_LAYER = {
    "llama": 8,
    "qwen3": 8,
    "gemma3": 8,
    "phi3": 8,
    "gemma2": 8,
    "gpt_neox": 8,
    "olmo2": 8,
}


@pytest.mark.parametrize("family", sorted(set(PER_LAYER) - {"gemma2"}))  # gemma2's 10 s: the flysim test below
def test_launches_per_layer(family):
    model, ids = _family(family), _ids()
    gen = translator.translate_for_generation(model, ids, max_cache_len=32, backend="reference", verify=False)
    layer = _per_layer(_graph_launches(gen.translated), "attention")
    assert len(layer) == PER_LAYER[family], layer
    assert "elementwise_" not in layer, layer  # no per-layer counter update


# torch.compile: dynamo's graphs (prefill and decode), the caller's StaticCache; a layer also keeps its own
# counter's 2 one-element launches (the positions' add and the in-place add: the user's state)
COMPILED_PER_LAYER = {"olmo2": 10, "gpt_neox": 10, "gemma3": 10}


def _tail(names):
    """The launches from the last attention launch to the graph's end (the last layer, the final norm, the LM head)."""
    return names[max(i for i, k in enumerate(names) if "attention" in k):]


# The last layer: the post-feedforward norm, the residual add and the model's final norm (the sum read by it alone)
# were `norm_add` then `rms_norm`; one `norm_add_rms_norm` now (norm_sandwich.py). OLMo2's post-attention norm
# and add stay one `norm_add` (no norm after them). translate_for_generation's step ends with the step counter's
# bump (one elementwise launch).
GEMMA_TAIL = ["attention", "gemm", "norm_add_rms_norm", "gemm_gated", "gemm", "norm_add_rms_norm", "gemm"]
TAILS = {"gemma3": GEMMA_TAIL, "gemma2": GEMMA_TAIL,
         "olmo2": ["attention", "gemm", "norm_add", "gemm_gated", "gemm", "norm_add_rms_norm", "gemm"]}


@pytest.mark.parametrize("family", sorted(TAILS))
def test_last_post_norm_add_and_final_norm_are_one_launch(family):
    """translate_for_generation's step: the last layer's tail and the final norm in one launch, eager's tokens."""
    model, ids = _family(family), _ids()
    want = _greedy(model, ids, 4)
    gen = translator.translate_for_generation(model, ids, max_cache_len=32, backend="reference")
    tail = _tail(_graph_launches(gen.translated))
    assert tail == TAILS[family] + ["elementwise_"], tail
    assert _greedy(gen, ids, 4) == want


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("family", sorted(COMPILED_PER_LAYER))
def test_compiled_launches_per_layer(family):
    n = 3
    got, want, cache, eager_cache = _compiled(family, n)
    assert got == want
    _assert_same_cache(_kv(cache), _kv(eager_cache), PROMPT + n - 1)
    tms = [tm for rec in compile_backend.reports() for tm in rec.translated]
    assert tms
    for tm in tms:
        layer = _per_layer(_graph_launches(tm), "attention")
        assert len(layer) == COMPILED_PER_LAYER[family], layer
        if family in TAILS:
            assert _tail(_graph_launches(tm)) == TAILS[family], _graph_launches(tm)


def test_one_counter_per_step_keeps_the_caches_and_the_counter():
    """StaticCacheStep(one_counter=True) against the recipe's per-layer counters: the same logits, the same
    K / V caches, every layer's counter at cache_position[0] + S after each step."""
    from translator.frontends.generation import StaticCacheStep

    model, ids = _family("llama"), _ids()
    recipe, one = StaticCacheStep(model, 1, 32), StaticCacheStep(model, 1, 32, one_counter=True)
    with torch.no_grad():
        for tok, pos in ((ids, torch.arange(6)), (ids[:, -1:], torch.tensor([6])), (ids[:, :1], torch.tensor([7]))):
            torch.testing.assert_close(one(tok, pos), recipe(tok, pos))
            for a, b in zip(one.step.static_cache.layers, recipe.step.static_cache.layers):
                torch.testing.assert_close(a.keys, b.keys)
                torch.testing.assert_close(a.values, b.values)
                assert int(a.cumulative_length) == int(b.cumulative_length) == int(pos[-1]) + 1


@pytest.mark.parametrize("family,counter", [("qwen3", "rope_norm"), ("olmo2", "rope_norm_all_heads")])
def test_q_k_norm_folds_into_the_rope_and_cache_write_launch(family, counter):
    """The q / k norm (Qwen3: per head; OLMo2: over all heads of a token) folded for q and k of both layers, the
    RoPE launches then took both cache writes; no norm of a piece of the QKV output is left (every RMSNorm
    left reads a hidden-size row: a residual stream or an O / down GEMM's output); eager's tokens and cache."""
    model, ids = _family(family), _ids()
    n = 6
    want, cache = _eager_run(model, ids, n)
    gen = translator.translate_for_generation(model, ids, max_cache_len=32, backend="reference")
    counters = gen.translated.report.counters
    assert counters.get(counter) == 4 and counters.get("rope_cache_write") == 2, counters
    norms = [nd for nd in gen.translated.gm.graph.nodes if str(nd.target) == "flydsl.rms_norm.default"]
    assert all(list(nd.args[1]) == [model.config.hidden_size] and "slice" not in str(nd.args[0].target)
               for nd in norms), [(nd.args[0], nd.args[1]) for nd in norms]
    assert _greedy(gen, ids, n) == want
    _assert_same_cache(cache_tensors(gen.translated), _kv(cache), PROMPT + n - 1)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PER_LAYER))
def test_flysim_launches_per_layer(family):
    """One decode step on flysim: the recorded launches per layer are the graph's, and the tokens eager's."""
    model, ids = _family(family), _ids()
    want = _greedy(model, ids, 3)
    gen = translator.translate_for_generation(model, ids, max_cache_len=32, backend="flysim", verify=False)
    assert _greedy(gen, ids, 3) == want
    kernels = [ln.kernel for ln in gen.translated.last_launches]
    layer = _per_layer(kernels, "attention_fwd")
    assert len(layer) == PER_LAYER[family], layer
    assert len(kernels) == len(_graph_launches(gen.translated)), (kernels, _graph_launches(gen.translated))
