"""HF tiny Llama, static cache: the decode step's attention reads the cache in place (issue 23,
item 3). Under `model.generate(cache_implementation="static")` the StaticCache tensors are graph
inputs written by `index_copy_`; the attention must take those written buffers themselves as K and
V (no slice or copy of [B, Hkv, S_max, D] before it) and give eager's tokens. HF builds its mask
outside the compiled forward (generate's prepare step), so it arrives as an input tensor: nothing
in the graph proves it causal, and it stays a mask (attention_cache.py says which forms are)."""

from __future__ import annotations

import pytest
import torch

from translator.frontends import compile_backend

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


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
    for kv in att.args[1:3]:
        # the attention's K / V are the outputs of the in-place cache writes, on the graph's inputs
        assert kv.op == "call_function" and "index_copy" in str(kv.target), kv.format_node()
        assert kv.args[0].op == "placeholder", kv.args[0].format_node()
    if backend == "flysim":
        launches = [getattr(ln, "kernel", str(ln)).rsplit("_", 1)[0] for ln in decode.last_launches]
        assert "attention_fwd_kernel" in launches
        before = launches[:launches.index("attention_fwd_kernel")]
        assert not [n for n in before if "layout" in n or "copy" in n], launches
