"""Batched generate() on left-padded prompts through translator.translate_for_generation (docs/state.md, "Padded
prompts").

The step takes each row's first real slot (`key_start`) and HF's per-row positions as inputs; HF's mask over the
padding that key_start implies becomes the attention's `k_start` (attention_cache.padding_start): each row's key
loop starts at its first real key, no mask tensor. Expected: eager generate's tokens and logits on the same padded
batch (HF with a static cache and the mask, and each prompt alone), the translation's cache equal to eager's
StaticCache, the same FlyDSL ops as an unpadded batch runs (one graph: key_start = 0 there), every compute op a
FlyDSL op. Right padding is refused naming the fix. Tiny random-init Llama and Phi3, 2 layers; flysim (slow): the
same with FlyDSL kernels, the attention launched every step, as many launches per step as unpadded.
"""

from __future__ import annotations

import pytest
import torch

import translator
from translator.errors import InputError
from translator.frontends.generation import cache_tensors

transformers = pytest.importorskip("transformers")
from test_generation_padded import LENGTHS, NEW, _model, each_alone, generate_padded, padded_batch  # noqa: E402
from translator.tolerances import model_tol  # noqa: E402

MAX_LEN = 16


def _flydsl_ops(tm):
    return [str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("flydsl")]


def _eager_cache(model, ids, mask):
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                       pad_token_id=0, cache=cache)
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _translated(family, backend="reference"):
    model = _model(family)
    ids, mask = padded_batch()
    gen = translator.translate_for_generation(model, ids, max_cache_len=MAX_LEN, batch_size=len(LENGTHS),
                                              backend=backend)
    return model, ids, mask, gen


@pytest.fixture(scope="module")
def llama():
    return _translated("llama")


@pytest.mark.parametrize("family", ["llama", pytest.param("phi3", marks=pytest.mark.slow)])  # phi3: 6 s more
def test_translated_padded_batch_gives_eagers_tokens_and_cache(family, llama):
    model, ids, mask, gen = llama if family == "llama" else _translated(family)
    want, want_logits = generate_padded(model, ids, mask, cache_implementation="static")
    assert want == each_alone(model, ids, mask)
    for kw in ({"cache_implementation": "static"}, {}):
        got, logits = generate_padded(gen, ids, mask, **kw)
        assert got == want, kw
        torch.testing.assert_close(logits, want_logits)
    written = ids.shape[1] + NEW - 1
    for a, b in zip(cache_tensors(gen.translated), _eager_cache(model, ids, mask), strict=True):
        torch.testing.assert_close(a[:, :, :written], b[:, :, :written])  # pads' slots too: HF's position 0
    tm = gen.translated
    atts = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.attention.default]
    # no mask tensor: the causal offset (q_pos) and the key starts, the step's own input
    assert len(atts) == 2 and all(n.args[3] is None and n.args[11].name == "key_start" for n in atts), atts
    assert tm.report.counters.get("sdpa_cache_key_start") == 2, tm.report.counters
    assert not [r.op for r in tm.report.rows if r.where == "pytorch" and not r.layout]


def test_an_unpadded_batch_runs_the_same_graph_and_eagers_tokens(llama):
    model, ids, mask, gen = llama
    full = torch.randint(1, 128, ids.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.generate(full, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
        got = gen.generate(full, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    assert torch.equal(got, want)
    assert len(_flydsl_ops(gen.translated)) == 26  # 13 per layer, as before key_start (docs/state.md)


def test_a_step_given_cache_position_and_the_mask_computes_hfs_positions(llama):
    """transformers 4's generate passes cache_position, no position_ids: the step's positions are HF's, from the
    mask (the slot less the row's start; RoPE leaves the scores unchanged by a shift per row, not the keys it
    rotates into the cache): the prompt's logits and cache are eager's forward with HF's position_ids."""
    model, ids, mask, gen = llama
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
    with torch.no_grad():
        want = model(ids, attention_mask=mask, position_ids=pos, cache=cache).logits
        got = gen(input_ids=ids, attention_mask=mask, cache_position=torch.arange(ids.shape[1])).logits
    real = mask.bool()  # a pad's row attends to nothing: its logits are not compared
    torch.testing.assert_close(got[real], want[real])
    eager = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    for a, b in zip(cache_tensors(gen.translated), eager, strict=True):
        torch.testing.assert_close(a[:, :, :ids.shape[1]], b[:, :, :ids.shape[1]])


def test_right_padding_and_a_row_of_pads_are_refused(llama):
    model, ids, mask, gen = llama
    right = torch.flip(mask, [1])
    with pytest.raises(InputError, match="not a left-padded batch.*padding_side = 'left'"):
        generate_padded(gen, torch.flip(ids, [1]), right)
    empty = mask.clone()
    empty[2] = 0
    with pytest.raises(InputError, match="at least one real token"):
        generate_padded(gen, ids, empty)


@pytest.mark.slow  # ~60 s: flysim interprets every kernel of 2 x 4 steps; the reference tests above cover the graph
@pytest.mark.flysim_only("counts flysim's recorded launches")
def test_flysim_padded_and_unpadded_steps_launch_the_same_kernels():
    model, ids, mask, gen = _translated("llama", backend="flysim")
    inner, steps = gen.forward.tm, []

    def step(*args):
        out = inner(*args)
        steps.append([ln.kernel.split("_kernel")[0] for ln in inner.last_launches])
        return out

    gen.forward.tm = step
    want, want_logits = generate_padded(model, ids, mask, cache_implementation="static")
    got, logits = generate_padded(gen, ids, mask)
    assert got == want
    torch.testing.assert_close(logits, want_logits, **model_tol())
    padded = list(steps)
    full = ids.clone()
    full[full == 0] = 5
    steps.clear()
    generate_padded(gen, full, torch.ones_like(mask))
    assert len(padded) == len(steps) == NEW and all(sum("attention_fwd" in k for k in ks) == 2 for ks in padded)
    assert [len(ks) for ks in padded] == [len(ks) for ks in steps], (padded, steps)
