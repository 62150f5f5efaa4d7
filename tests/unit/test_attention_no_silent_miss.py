"""No silent miss: every Q·Kᵀ -> (scale / mask / bias / cast) -> softmax -> ·V chain in a
translated model either became flydsl.attention or its report rows say
"not taken by attention: <reason>".

The chains are enumerated here, on the captured graph each translation starts from, by a
definition of their own (independent of the matcher's): an SDPA call, or a softmax over the
last dim with a product (matmul / bmm / einsum / baddbmm) a few ops upstream and its result
reaching the left operand of a product a few ops downstream. The models: the forms the
matcher takes, forms it declines (each for a different reason), and tiny HF GPT-2 and Llama
in eager attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import transformers as T

from attention_helpers import fused_or_reasoned, translate_and_enumerate  # noqa: E402
from test_attention_forms import (EinsumAttention, Gemma2Eager, GPT2EagerWhere, GQA, InplaceOnView, MHA,  # noqa: E402
                                  MHAPadded, Sdpa, ScaleLearned, SwinV2Cosine, qkv, randn)

# --- forms the matcher declines (one reason each) -------------------------------------------

class ProbsReturned(nn.Module):
    def forward(self, q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1), -1)
        return p @ v, p


class MultiplicativeMask(nn.Module):
    def forward(self, q, k, v, keep):
        return torch.softmax(q @ k.transpose(-2, -1) * keep, -1) @ v


class HeadMask(nn.Module):
    """HF's head_mask: the probabilities scaled per head after the softmax (operand order reversed)."""

    def forward(self, q, k, v, head_mask):
        return torch.matmul(head_mask * torch.softmax(q @ k.transpose(-2, -1), -1), v)


class ScoresReturned(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        return torch.softmax(s, -1) @ v, s


class HeadDim300(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


# the forms docs/attention.md says are declined ("not fused yet"): the doc's claim is this test
class MaskBeforeScale(nn.Module):
    def forward(self, q, k, v, mask):
        return torch.softmax(0.125 * (q @ k.transpose(-2, -1) + mask), -1) @ v


class ScalarOnEveryScore(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125 + 1.0, -1) @ v


class MaskSubtracted(nn.Module):
    def forward(self, q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125 - mask, -1) @ v


class EinsumTransposedV(nn.Module):
    def forward(self, q, k, v):
        p = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, k) * 0.125, -1)
        return torch.einsum("bhij,bhdj->bhid", p, v.transpose(-2, -1))


def hf(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=2, n_positions=64))
    else:
        m = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64))
    m.config._attn_implementation = "eager"
    return m, (torch.randint(0, 100, (1, 8)),)


MODELS = {
    # taken
    "gpt2_where": (GPT2EagerWhere, lambda: qkv()),
    "learned_scale": (ScaleLearned, lambda: qkv()),
    "mha": (lambda: MHA(True), lambda: (randn(2, 8, 32),)),
    "mha_padded": (MHAPadded, lambda: (randn(2, 8, 32), torch.arange(8).expand(2, 8) > 5)),
    "gemma2": (Gemma2Eager, lambda: (*qkv(), torch.zeros(1, 1, 8, 8))),
    "swin_v2": (SwinV2Cosine, lambda: (*qkv(), randn(2, 8, 8))),
    "gqa": (lambda: GQA("repeat_kv", 2), lambda: qkv(h=4, hkv=2)),
    "inplace_view": (InplaceOnView, lambda: (*qkv(), randn(1, 2, 8, 8))),
    "einsum": (EinsumAttention, lambda: qkv()),
    "sdpa": (lambda: Sdpa(is_causal=True), lambda: qkv()),
    # declined, each with its reason
    "sdpa_d300": (Sdpa, lambda: qkv(d=300)),
    "probs_returned": (ProbsReturned, lambda: qkv()),
    "multiplicative_mask": (MultiplicativeMask, lambda: (*qkv(), (randn(1, 2, 8, 8) > 0).float())),
    "head_mask": (HeadMask, lambda: (*qkv(), torch.ones(1, 2, 1, 1))),
    "scores_returned": (ScoresReturned, lambda: qkv()),
    "float64": (HeadDim300, lambda: tuple(x.double() for x in qkv())),
    "head_dim_300": (HeadDim300, lambda: qkv(d=300)),
    "mask_before_scale": (MaskBeforeScale, lambda: (*qkv(), randn(1, 1, 8, 8))),
    "scalar_on_every_score": (ScalarOnEveryScore, lambda: qkv()),
    "mask_subtracted": (MaskSubtracted, lambda: (*qkv(), randn(1, 1, 8, 8))),
    "einsum_transposed_v": (EinsumTransposedV, lambda: qkv()),
}
DECLINED = {"sdpa_d300", "probs_returned", "multiplicative_mask", "head_mask", "scores_returned", "float64",
            "head_dim_300", "mask_before_scale", "scalar_on_every_score", "mask_subtracted", "einsum_transposed_v"}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_attention_chain_is_taken_or_says_why(name, monkeypatch):
    build, inputs = MODELS[name]
    tm, chains = translate_and_enumerate(build(), inputs(), monkeypatch)
    assert len(chains) == 1, chains
    taken, reasons = fused_or_reasoned(tm, chains)
    missed = list(reasons)
    assert (missed if name in DECLINED else taken) == chains


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hf_eager_attention_chains_are_taken(kind, monkeypatch):
    m, x = hf(kind)
    tm, chains = translate_and_enumerate(m, x, monkeypatch)
    assert len(chains) == 1, chains
    assert fused_or_reasoned(tm, chains) == (chains, {})
