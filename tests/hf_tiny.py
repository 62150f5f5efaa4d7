"""Tiny Hugging Face models built from a config with random init (no download), shared by the
tests that need one."""

from __future__ import annotations

import pytest
import torch


def tiny_llama(layers=1):
    """LlamaForCausalLM in eval mode, built after seeding torch with 0: vocab 128, hidden 64, 4
    query heads over 2 key/value heads, intermediate 128, 64 positions (room for a static cache)."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return T.LlamaForCausalLM(cfg).eval()
