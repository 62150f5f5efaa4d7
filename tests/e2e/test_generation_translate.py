"""HF `generate()` through translate() (issue 23 item 5): translator.translate_for_generation.

The README's "LLM generation" section runs as written (reference backend) and gives eager's greedy
tokens; the run is one prefill call and then one single-token decode call per new token on the one
translation (its cache, not the user's model, is written). Refusals are InputErrors that name the
fix. The translation saved and loaded (`translated=`) generates the same tokens, and the translation's
cache holds what eager's StaticCache holds after the same generate call. flysim: tiny Llama, Qwen2
and Mistral generate eager's 32 greedy tokens with FlyDSL launches on every step, the cache writes
among them, and a loaded translation does too (slow: a flysim step interprets every kernel on CPU).
"""

from __future__ import annotations

import pytest
import torch

import translator
from translator.errors import InputError
from translator.frontends.generation import cache_tensors

transformers = pytest.importorskip("transformers")
PROMPT = 6


def _model(family: str = "llama", **extra):
    names = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
             "mistral": ("MistralConfig", "MistralForCausalLM")}[family]
    cfg = getattr(transformers, names[0])(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          **extra)
    torch.manual_seed(0)
    return getattr(transformers, names[1])._from_config(cfg, attn_implementation="sdpa").eval()


def _ids(batch=1):
    return torch.randint(0, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(1))


def _greedy(model, ids, n):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[:, ids.shape[1]:]


def _eager_cache(model, ids, n, max_len):
    """Eager's StaticCache tensors (keys, values per layer) after `generate` of n greedy tokens."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache=cache)
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _same_cache(tm, want, upto):
    """tm's cache equals eager's at the positions a generate call wrote (0 .. upto - 1)."""
    got = cache_tensors(tm)
    assert len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want))
    for g, w in zip(got, want):
        torch.testing.assert_close(g[:, :, :upto], w[:, :, :upto])


def _readme_code() -> str:
    from test_readme import _section_code  # tests/e2e/test_readme.py

    return _section_code("LLM generation")


@pytest.fixture(scope="module")
def readme_run():
    """The README section, executed once on a tiny Llama: (namespace, eager's tokens, the steps' input shapes)."""
    hf_model, input_ids = _model(), _ids()
    want = _greedy(hf_model, input_ids, 8)
    before = {k: v.clone() for k, v in hf_model.state_dict().items()}
    ns = {"torch": torch, "translator": translator, "hf_model": hf_model, "input_ids": input_ids}
    code = _readme_code()
    head, tail = code.split("out = ", 1)
    exec(compile(head, "README.md", "exec"), ns)  # noqa: S102 — our own README
    shapes = []
    tm = ns["gen"].translated
    forward = ns["gen"].forward
    inner = forward.tm
    forward.tm = lambda ids, pos, *rest: (shapes.append((tuple(ids.shape), pos.tolist())), inner(ids, pos, *rest))[1]
    with torch.no_grad():
        exec(compile("out = " + tail, "README.md", "exec"), ns)  # noqa: S102
    forward.tm = inner
    return ns, want, shapes, before, tm


def test_readme_generation_section_gives_eagers_tokens(readme_run):
    ns, want, shapes, before, tm = readme_run
    assert tm.report.verification.passed
    assert torch.equal(ns["out"][:, PROMPT:], want)
    # one prefill of the prompt, then one token per step at the next position: decode on the cache
    assert shapes == [((1, PROMPT), list(range(PROMPT)))] + [((1, 1), [PROMPT + i]) for i in range(7)]
    assert all(torch.equal(v, before[k]) for k, v in ns["hf_model"].state_dict().items()), "the user's model changed"
    writes = [r for r in tm.report.rows if r.op == "aten.index_copy_"]
    assert writes and all("cache_write" in r.detail for r in writes)


def test_a_second_generate_starts_over(readme_run):
    ns, want, *_ = readme_run
    assert torch.equal(_greedy(ns["gen"], ns["input_ids"], 8), want)


def test_the_translations_cache_holds_eagers(readme_run):
    """After generate(8 tokens), the cache holds eager's keys and values for the 6 + 7 positions fed."""
    ns, want, *_ = readme_run
    assert torch.equal(_greedy(ns["gen"], ns["input_ids"], 8), want)
    _same_cache(ns["gen"].translated, _eager_cache(ns["hf_model"], ns["input_ids"], 8, 64), PROMPT + 7)


def test_saved_and_loaded_translation_generates_eagers_tokens(readme_run, tmp_path):
    ns, want, *_ = readme_run
    path = translator.save(ns["gen"].translated, tmp_path / "step.pt2")
    loaded = translator.load(path)
    gen = translator.translate_for_generation(ns["hf_model"], max_cache_len=64, translated=loaded)
    assert torch.equal(_greedy(gen, ns["input_ids"], 8), want)
    _same_cache(loaded, _eager_cache(ns["hf_model"], ns["input_ids"], 8, 64), PROMPT + 7)
    with pytest.raises(InputError, match="batch_size=1, max_cache_len=64, translated="):
        translator.translate_for_generation(ns["hf_model"], max_cache_len=32, translated=loaded)
    with pytest.raises(InputError, match="writes no KV cache"):
        translator.translate_for_generation(ns["hf_model"], max_cache_len=64,
                                            translated=translator.translate(torch.nn.Linear(4, 4), (torch.ones(2, 4),)))


def test_run_time_refusals_name_the_fix(readme_run):
    gen = readme_run[0]["gen"]
    with pytest.raises(InputError, match="batch_size=2"):
        _greedy(gen, _ids(2), 2)
    with pytest.raises(InputError, match="max_cache_len=64"):
        _greedy(gen, torch.randint(0, 128, (1, 60)), 8)
    with pytest.raises(InputError, match="not a left-padded batch.*padding_side = 'left'"):  # a left pad is served:
        with torch.no_grad():                                                    # test_generation_padded_translate.py
            gen.generate(_ids(), attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0]]), max_new_tokens=2, do_sample=False)


def test_a_dynamic_cache_request_gives_eagers_tokens_and_a_cache_object_is_refused(readme_run):
    """cache_implementation="dynamic" runs on the translation's static cache: eager's tokens. A cache object
    of the caller's (dynamic or static, empty or filled) is refused: it would be neither filled nor read."""
    ns, want, *_ = readme_run
    gen, model, ids = ns["gen"], ns["hf_model"], ns["input_ids"]
    with torch.no_grad():
        got = gen.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="dynamic")
    assert torch.equal(got[:, PROMPT:], want)
    for cache in (transformers.DynamicCache(config=model.config), transformers.StaticCache(config=model.config,
                                                                                          max_cache_len=64)):
        for key in ("cache", "past_key_values"):
            with pytest.raises(InputError, match=f"generate\\({key}=.*torch.compile"):
                _greedy_with(gen, ids, **{key: cache})


def _greedy_with(gen, ids, **kw):
    with torch.no_grad():
        return gen.generate(ids, max_new_tokens=2, do_sample=False, **kw)


def test_translate_time_refusals():
    with pytest.raises(InputError, match="transformers causal LM"):
        translator.translate_for_generation(torch.nn.Linear(4, 4), max_cache_len=8)
    with pytest.raises(InputError, match="sliding window of 16 tokens.*max_cache_len <= 16"):
        translator.translate_for_generation(_model("mistral", sliding_window=16), _ids(), max_cache_len=32)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_flysim_generates_32_eager_tokens(family):
    model, ids = _model(family), _ids()
    want = _greedy(model, ids, 32)
    gen = translator.translate_for_generation(model, ids, max_cache_len=48, backend="flysim")
    launches = []
    forward, inner = gen.forward, gen.forward.tm

    def step(i, p, *rest):
        out = inner(i, p, *rest)
        launches.append([r.kernel.split("_kernel")[0] for r in inner.last_launches])
        return out

    forward.tm = step
    assert torch.equal(_greedy(gen, ids, 32), want)
    assert len(launches) == 32 and all("scatter" in k and "gemm" in k and "attention_fwd" in k for k in launches)
    _same_cache(gen.translated, _eager_cache(model, ids, 32, 48), PROMPT + 31)


@pytest.mark.slow
def test_flysim_loaded_translation_generates_32_eager_tokens(tmp_path):
    """Translated on the reference backend, saved, loaded to run on flysim: eager's 32 tokens and cache."""
    model, ids = _model("qwen2"), _ids()
    want = _greedy(model, ids, 32)
    tm = translator.translate_for_generation(model, ids, max_cache_len=48, backend="reference").translated
    loaded = translator.load(translator.save(tm, tmp_path / "step.pt2"), backend="flysim")
    gen = translator.translate_for_generation(model, max_cache_len=48, translated=loaded)
    assert torch.equal(_greedy(gen, ids, 32), want)
    assert any("attention_fwd" in r.kernel for r in loaded.last_launches)
    _same_cache(loaded, _eager_cache(model, ids, 32, 48), PROMPT + 31)
