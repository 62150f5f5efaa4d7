"""Batched generate() on left-padded prompts under torch.compile(backend="flydsl") (docs/state.md, "Padded prompts").

What every serving user does: prompts of different lengths in one batch, left-padded, an attention_mask with 0s for
the pads, HF's position_ids computed from the mask. Under torch.compile HF's generate builds the 4-D mask outside
the compiled forward (a compileable StaticCache), so both graphs (prefill and decode) take it as an input and the
attention reads it as a bool mask tensor: padded keys are dropped where the mask drops them. Expected here: eager
generate's tokens and logits on the same padded batch (each prompt's tokens are also what that prompt gives alone),
one prefill and one decode graph, every call translated (no call in PyTorch, no dynamo fallback), each attention a
flydsl.attention on the mask input. Tiny random-init Llama and Phi3 (fused qkv / gate_up, another family), 2 layers
(a pad's hidden state reaches the second layer's K / V: it must stay masked there too). flysim (slow): the same on
FlyDSL kernels, an attention launch recorded in every step.
"""

from __future__ import annotations

import pytest
import torch

import translator

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py
from test_generation_hf import _model as _hf_model, _no_registration_hooks  # noqa: E402,F401 (an autouse fixture)
from test_generation_hf_more import _model as _more_model  # noqa: E402
from translator.tolerances import model_tol  # noqa: E402

LENGTHS, NEW = (7, 4, 2), 4


def _model(family):
    return _more_model("phi3") if family == "phi3" else _hf_model(family, layers=2)


def padded_batch(lengths=LENGTHS, vocab=128):
    """Left-padded prompts (pad id 0) of `lengths` tokens and their attention_mask."""
    s = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), s), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :s - n] = 0
        mask[b, :s - n] = 0
    return ids, mask


def generate_padded(model, ids, mask, n=NEW, **kw):
    """(the new tokens per row, the logits of every step) of greedy generate on the padded batch."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits)


def each_alone(model, ids, mask, n=NEW):
    """Each prompt generated alone, unpadded."""
    rows = []
    for b in range(ids.shape[0]):
        one = ids[b:b + 1, int((mask[b] == 0).sum()):]
        with torch.no_grad():
            rows.append(model.generate(one, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                       pad_token_id=0)[0, one.shape[1]:].tolist())
    return rows


def _compiled(family, backend):
    model = _model(family)
    ids, mask = padded_batch()
    want = generate_padded(model, ids, mask, cache_implementation="static")
    alone = each_alone(model, ids, mask)
    model.forward = torch.compile(model.forward, backend="flydsl", options={"backend": backend})
    return model, ids, mask, want, alone


def _attention_masks(rec):
    """The mask argument of each flydsl.attention of a graph's last translation."""
    gm = rec.translated[-1].gm
    return [n.args[3] for n in gm.graph.nodes if n.target is torch.ops.flydsl.attention.default]


def _assert_translated_with_the_mask(n_steps):
    recs = translator.compile_reports()
    assert len(recs) == 2, translator.compile_reports  # prefill, decode
    assert [r.calls_translated for r in recs] == [1, n_steps - 1] and not any(r.calls_pytorch for r in recs)
    assert not any(r.dynamo_fallback or r.fallback_reason for r in recs)
    for rec in recs:
        masks = _attention_masks(rec)
        assert len(masks) == 2 and all(m is not None and m.op == "placeholder" for m in masks), masks
        assert all(m.meta["val"].dtype == torch.bool and m.meta["val"].shape[0] == len(LENGTHS) for m in masks)


@pytest.mark.parametrize("family", ["llama", pytest.param("phi3", marks=pytest.mark.slow)])  # phi3: 8 s more
def test_compiled_padded_batch_gives_eagers_tokens(family):
    model, ids, mask, (want, want_logits), alone = _compiled(family, "reference")
    got, logits = generate_padded(model, ids, mask, cache_implementation="static")
    assert got == want
    assert got == alone  # each prompt's own tokens: the pads change nothing
    torch.testing.assert_close(logits, want_logits)
    _assert_translated_with_the_mask(NEW)


@pytest.mark.slow  # ~30 s: flysim interprets every kernel of 4 steps; the reference test above covers the graphs
def test_compiled_padded_batch_on_flysim_launches_the_attention_every_step():
    model, ids, mask, (want, want_logits), _ = _compiled("llama", "flysim")
    compiled, launches = model.forward, []

    def forward(*args, **kwargs):
        out = compiled(*args, **kwargs)
        ran = max(translator.compile_reports(), key=lambda r: r.calls_translated)  # decode outgrows prefill
        launches.append([ln.kernel for ln in ran.translated[-1].last_launches])
        return out

    model.forward = forward
    got, logits = generate_padded(model, ids, mask, cache_implementation="static")
    assert got == want
    torch.testing.assert_close(logits, want_logits, **model_tol())
    assert len(launches) == NEW and all(sum("attention_fwd" in k for k in ks) == 2 for ks in launches), launches
    _assert_translated_with_the_mask(NEW)
