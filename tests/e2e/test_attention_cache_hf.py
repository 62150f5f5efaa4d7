"""HF tiny models, static cache: the step's attention reads the cache in place (issue 23, item 3).

translate_for_generation: the step computes HF's causal mask from the cache positions in its own
graph (transformers' export recipe passes no attention_mask; padding is refused at run time), so
the attention takes `q_pos` = those positions and reads no mask tensor (attention_cache.py,
`computed_positions`), for Llama, Qwen2 and Mistral (its sliding window as wide as the cache);
a window narrower than the cache keeps the mask, and the logits stay eager's.

torch.compile: under `model.generate(cache_implementation="static")` the StaticCache tensors are
graph inputs written by `index_copy_`; the attention must take those written buffers themselves as
K and V (no slice or copy of [B, Hkv, S_max, D] before it) and give eager's tokens. HF builds its
mask outside the compiled forward (generate's prepare step), so it arrives as an input tensor:
nothing in the graph proves it causal, and it stays a mask."""

from __future__ import annotations

import pytest
import torch

import translator
import translator_kernels.attention as kernel_attention
from translator.frontends import compile_backend
from translator.frontends.generation import StaticCacheStep
from translator.graph import arg, dtype_of, shape_of

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM")}


def _tiny(family, layers=1, **extra):
    cfg_name, model_name = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(vocab_size=128, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_name)._from_config(cfg, attn_implementation="sdpa").eval()


def _greedy(model, ids, n):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[:, ids.shape[1]:].tolist()


def _bool_masks(tm):
    """Nodes of tm's graph holding a 4-D bool tensor (a mask built or passed)."""
    return [n for n in tm.gm.graph.nodes if dtype_of(n) == torch.bool and len(shape_of(n) or ()) == 4]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_translated_step_attends_by_positions_not_a_mask(family):
    """Mistral's default window (4096) is wider than the cache (48): its window term keeps every key.
    A batch of two prompts: one position per query row serves both."""
    model = _tiny(family, layers=2)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    want = _greedy(model, ids, 8)
    gen = translator.translate_for_generation(model, ids, max_cache_len=48, batch_size=2, backend="reference",
                                              verify=False)
    tm = gen.translated
    assert tm.report.counters.get("sdpa_cache_positions") == 2, tm.report.counters
    atts = _attention_nodes(tm)
    assert len(atts) == 2
    for att in atts:
        assert arg(att, "mask") is None and arg(att, "q_pos") is not None, att.format_node()
        assert dtype_of(arg(att, "q_pos")) == torch.int64 and len(shape_of(arg(att, "q_pos"))) == 1
    assert not _bool_masks(tm), "the causal mask is still built in the graph"
    assert _greedy(gen, ids, 8) == want


def test_a_window_narrower_than_the_cache_keeps_the_mask():
    """Mistral with sliding_window=8 under a 32-slot cache (the recipe's step translated directly:
    translate_for_generation refuses it): `kv > q - 8` drops keys, so the mask stays, and the 20-token
    prefill's logits (12 rows past the window) are eager's."""
    model = _tiny("mistral", sliding_window=8)
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    tm = translator.translate(StaticCacheStep(model, 1, 32), (ids[:, :6], torch.arange(6)), backend="reference")
    assert "sdpa_cache_positions" not in tm.report.counters
    (att,) = _attention_nodes(tm)
    assert arg(att, "mask") is not None and arg(att, "q_pos") is None, att.format_node()
    with torch.no_grad():
        got = tm(ids, torch.arange(20))
    torch.testing.assert_close(got, want)


@pytest.mark.slow  # 16-32 s; the graph side is the test above (reference), the kernel's q_pos tests/unit/test_attention_cache_decode.py
def test_flysim_attention_kernel_gets_positions_not_a_mask(monkeypatch):
    """flysim, tiny Llama: every attention kernel call takes q_pos (the step's positions) and no mask;
    3 tokens equal eager's."""
    calls = []
    real = kernel_attention.attention

    def spy(q, k, v, **kw):
        calls.append((kw.get("mask"), kw.get("q_pos")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(kernel_attention, "attention", spy)
    model = _tiny("llama")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    want = _greedy(model, ids, 3)
    gen = translator.translate_for_generation(model, ids, max_cache_len=16, backend="flysim", verify=False)
    calls.clear()  # what translate's own runs passed
    assert _greedy(gen, ids, 3) == want
    assert [q_pos.tolist() for _, q_pos in calls] == [list(range(6)), [6], [7]], calls
    assert all(mask is None for mask, _ in calls)
    assert any("attention_fwd" in r.kernel for r in gen.translated.last_launches)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()


def _generate(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static")
    return out[0, ids.shape[1]:].tolist()


def _attention_nodes(tm):
    return [n for n in tm.gm.graph.nodes if n.op == "call_function" and "flydsl.attention" in str(n.target)]


@pytest.mark.slow  # 45 s (reference) / minutes (flysim); tests/unit/test_attention_cache_decode.py covers the rewrite
@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_hf_static_cache_decode_attention_reads_the_cache(backend):
    model = _llama()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    want = _generate(model, ids, 3)
    model.forward = torch.compile(model.forward, backend="flydsl", options={"backend": backend})
    got = _generate(model, ids, 3)
    assert got == want
    decode = compile_backend.reports()[-1].translated[-1]
    (att,) = _attention_nodes(decode)
    order = {n: i for i, n in enumerate(decode.gm.graph.nodes)}
    for kv in att.args[1:3]:
        # the attention's K / V are the cache buffers (graph inputs) as the in-place cache writes leave them: the
        # write's output, or the buffer itself read after a write into it (since RoPE took the cache writes:
        # flydsl.rope's kc / vc, rope_cache.py)
        if kv.op == "call_function":
            assert "index_copy" in str(kv.target), kv.format_node()
            kv = kv.args[0]
        assert kv.op == "placeholder", kv.format_node()
        writes = [u for u in kv.users if order.get(u, len(order)) < order[att] and (
            "index_copy" in str(u.target) or (u.target is torch.ops.flydsl.rope.default
                                              and kv in (arg(u, "kc"), arg(u, "vc"))))]
        assert writes, [u.format_node() for u in kv.users]
    if backend == "flysim":
        launches = [getattr(ln, "kernel", str(ln)).rsplit("_", 1)[0] for ln in decode.last_launches]
        assert "attention_fwd_kernel" in launches
        before = launches[:launches.index("attention_fwd_kernel")]
        assert not [n for n in before if "layout" in n or "copy" in n], launches


class _Step(torch.nn.Module):
    """A decode step on a cache buffer whose mask is built as HF builds it, with a variant `form`:
    "causal" (kv <= q), "padded" (& a padding mask the caller passes), "shifted" (kv index arange + 1),
    "ge" (q >= kv, the same mask written the other way)."""

    def __init__(self, form, s_max=16):
        super().__init__()
        self.form = form
        self.register_buffer("k", torch.randn(1, 2, s_max, 8, generator=torch.Generator().manual_seed(0)))
        self.register_buffer("v", torch.randn(1, 2, s_max, 8, generator=torch.Generator().manual_seed(1)))

    def forward(self, q, pos, pad):
        kv = torch.arange(self.k.shape[2]) + (1 if self.form == "shifted" else 0)
        qp = pos[None, None, :, None]
        mask = qp >= kv[None, None, None, :] if self.form == "ge" else kv[None, None, None, :] <= qp
        if self.form == "padded":
            mask = mask & pad[:, None, None, :].bool()
        return torch.nn.functional.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask.expand(1, -1, -1, -1))


@pytest.mark.parametrize("form, fires", [("causal", True), ("ge", True), ("padded", False), ("shifted", False)])
def test_computed_mask_forms(form, fires):
    """Only a mask that is `key <= position` for every key becomes q_pos; a padding term or a shifted key
    index keeps the mask; eager's output either way (positions 5..7 over a 16-slot cache)."""
    m = _Step(form)
    pad = torch.ones(1, 16, dtype=torch.long)
    pad[0, 2] = 0
    q, pos = torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(2)), torch.tensor([5, 6, 7])
    tm = translator.translate(m, (q, pos, pad), backend="reference")
    assert (tm.report.counters.get("sdpa_cache_positions") == 1) is fires, tm.report.counters
    (att,) = _attention_nodes(tm)
    assert (arg(att, "mask") is None) is fires and (arg(att, "q_pos") is not None) is fires, att.format_node()
    with torch.no_grad():
        torch.testing.assert_close(tm(q, pos, pad), m(q, pos, pad))
