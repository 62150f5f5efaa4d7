"""HF generate() under torch.compile(backend="flydsl") on a long static cache: the decode attention reads
the cache up to the current length, not S_max (issue 23; fwd.py KEY_SKIP, docs/state.md).

Under torch.compile HF's generate builds the decode step's 4-D mask outside the compiled forward, so the
decode graph gets it as an input ([B, 1, 1, S_max] bool): the attention takes that mask tensor. The kernel
loads each key tile's mask bytes and skips the K / V loads of tiles no row keeps, on the device. Here:
tiny Llama / Qwen2 / Mistral (1 layer, GQA 2, head dim 16, fp32) generate with a caller's StaticCache of
S_MAX slots on flysim: eager's greedy tokens, the decode graph's attention takes the mask input, and the
bytes each decode step's attention launch reads stay well under the K / V bytes of the whole cache, which
it read every step before.
"""

from __future__ import annotations

import pytest
import torch

from translator.frontends import compile_backend

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py
from test_generation_hf import _generate, _model, _no_registration_hooks, _sliding_int_dynamic  # noqa: E402,F401 (an autouse fixture)

PROMPT, S_MAX, NEW = 6, 4096, 3


def _kv_bytes(model):
    c = model.config
    d = c.hidden_size // c.num_attention_heads
    return 2 * c.num_key_value_heads * S_MAX * d * 4  # K and V of one layer, fp32, batch 1


def _flysim_generate(family):
    """(tokens, eager's, per decode step the attention launches' bytes read, the decode graph)."""
    model = _model(family)
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    cache = lambda: transformers.StaticCache(config=model.config, max_cache_len=S_MAX)  # noqa: E731
    want = _generate(model, ids, NEW, cache())
    compiled = torch.compile(model.forward, backend="flydsl", options={"backend": "flysim"})
    steps = []

    def forward(*args, **kwargs):
        before = {id(r): r.calls_translated for r in compile_backend.reports()}
        out = compiled(*args, **kwargs)
        ran = [r for r in compile_backend.reports() if r.calls_translated > before.get(id(r), 0)]
        assert len(ran) == 1, compile_backend.summary()
        steps.append((ran[0], [ln for ln in ran[0].translated[-1].last_launches if "attention_fwd" in ln.kernel]))
        return out

    model.forward = forward
    with _sliding_int_dynamic(family, None):
        got = _generate(model, ids, NEW, cache())
    return got, want, model, steps


@pytest.mark.slow  # ~40 s each; tests/kernels/test_attention_keymask.py covers the skip in the default suite
@pytest.mark.flysim_only("reads flysim's byte counters")
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_compiled_generate_reads_the_cache_up_to_its_length(family):
    got, want, model, steps = _flysim_generate(family)
    assert got == want
    decode = steps[1:]
    assert len(decode) == NEW - 1 and all(len(atts) == 1 for _, atts in decode), steps
    rec = decode[0][0]
    (att,) = [nd for nd in rec.translated[-1].gm.graph.nodes if nd.target is torch.ops.flydsl.attention.default]
    mask = att.args[3]
    assert mask is not None and mask.op == "placeholder" and mask.meta["val"].shape[-1] == S_MAX, att.format_node()
    kv = _kv_bytes(model)
    for _, (launch,) in decode:
        read = launch.counters["global_bytes_read"]
        # without the skip the launch reads every slot's K / V (> kv); measured (llama, flysim): 1,573,376
        # bytes before, 541,184 with it (K / V of one 64-key tile; the rest is the mask bytes, Q per KV
        # slice and the merge's read-back of the 64 slices' partials, counted per lane)
        assert read < kv / 1.5, (read, kv)
