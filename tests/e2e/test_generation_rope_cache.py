"""RoPE q, RoPE k and the K / V cache writes of each layer in one launch (translator/lowerings/
rope_cache.py, the kernel translator_kernels/layout/rope_cache.py), in generation.

- gpt-fast's decoder (models/_static_cache_decoder.py: interleaved pairs, `cache[:, :, pos] = k`)
  translated on flysim: eager's greedy tokens, the translated module's caches hold eager's values,
  every decode step launches the fused kernel once per layer and no scatter kernel.
- HF Llama with a StaticCache under torch.compile (rotate-half, `index_copy_` into the caller's
  cache tensors): eager's tokens; each graph rotates q and k in one launch per layer, and that launch
  writes both caches: in the decode graph the caller's cache tensors (graph inputs), in dynamo's
  prefill graph the caches it allocates (`torch.zeros` in the compiled region, then a functional
  `index_copy` that cache_write.py makes in place: before, a clone of each cache and a scatter in
  PyTorch). Two generate calls get two caches.
"""

from __future__ import annotations


import pytest
import torch

import translator
from translator.tolerances import model_tol
from translator.frontends import compile_backend
from bundled_models import load_module  # tests/ is on sys.path (tests/conftest.py)

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


D = load_module("_static_cache_decoder", "_rope_cache")


def _kernels(records):
    return [r.kernel.split("_kernel")[0] for r in records]


# ~90 s on the shared 2 cores; the graph and its math: test_layer_launches, tests/kernels/test_rope_cache.py
@pytest.mark.slow
def test_gpt_fast_decode_on_flysim_writes_the_cache_from_the_rope_kernel():
    torch.manual_seed(0)
    m = D.Model("view", D.TINY).eval()
    prompt = D.get_inputs(D.TINY, 4)[0]
    D.reset_caches(m)
    want = D.generate(m, prompt, 3)
    caches = [c.clone() for c in D.caches(m)]
    D.reset_caches(m)
    tm = translator.translate(m, (prompt, torch.arange(4)), backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    D.reset_caches(tm)  # the translated module's one copy (verification left it as it was)
    steps = []

    def step(idx, pos):
        out = tm(idx, pos)
        steps.append(_kernels(tm.last_launches))
        return out

    assert D.generate(step, prompt, 3) == want
    for got, w in zip(D.caches(tm), caches):
        torch.testing.assert_close(got, w, **model_tol())
    for ks in steps:  # prefill and each decode step
        assert ks.count("rope_cache") == D.TINY.n_layer and "scatter" not in ks, ks
    assert float(sum(c.abs().sum() for c in D.caches(m))) == 0, "translate() wrote the user's caches"


def test_hf_static_cache_graphs_write_both_caches_from_the_rope_kernel():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))

    def gen(**cache):
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                 **(cache or {"cache_implementation": "static"}))
        return out[0, 6:].tolist()

    want = gen()
    model.forward = torch.compile(model.forward, backend="flydsl", options={"backend": "reference"})
    caches = [transformers.StaticCache(config=cfg, max_cache_len=9) for _ in range(2)]
    assert [gen(cache=c) for c in caches] == [want, want]
    assert caches[0].layers[0].keys.data_ptr() != caches[1].layers[0].keys.data_ptr()  # each prefill its own
    recs = compile_backend.reports()
    assert len(recs) == 2, compile_backend.summary()  # prefill, decode
    for r in recs:
        gm = r.translated[-1].gm
        ropes = [n for n in gm.graph.nodes if n.target is torch.ops.flydsl.rope.default]
        assert len(ropes) == 1 and all(len(n.args[0]) == 2 for n in ropes)  # q and k: one launch (1 layer)
        # both caches written by the rope launch: prefill's fresh ones, decode's the caller's (graph inputs)
        assert all(n.args[4] is not None and n.args[7] is not None for n in ropes), [n.format_node() for n in ropes]
        assert not any(n.target is torch.ops.flydsl.cache_write.default and n.args[3] == 2 for n in gm.graph.nodes)
        assert not any(n.target is torch.ops.aten.index_copy.default for n in gm.graph.nodes), gm.code
