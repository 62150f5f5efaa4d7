"""Compile entries for the decode-step MODEL (bench.generate): the kernels of one Llama decode step
that bench.generate prices on their compiled ISA features, launched on zero tensors in
translator_kernels.isa's COMPILE_ONLY child (no GPU; nothing runs).
"""

from __future__ import annotations

DECODE_ATTENTION = "translator_kernels.measure.decode_isa:compile_decode_attention"


def compile_decode_attention(batch, heads, kv_heads, head_dim, context, num_splits):
    """The decode attention of one layer as the translated graph calls it: one query token per sequence
    against the static cache [B, Hkv, S_max, D] read in place up to its position (q_pos), O written as
    [B, 1, H, D] for the output projection; `num_splits` > 1 compiles the split kernel, its merge inside it
    (partials, tickets, the last slice's merge)."""
    import torch

    from translator_kernels.attention import attention

    q = torch.zeros(batch, 1, heads, head_dim, dtype=torch.bfloat16).transpose(1, 2)
    kc = torch.zeros(batch, kv_heads, context, head_dim, dtype=torch.bfloat16)
    pos = torch.full((1,), context - 1, dtype=torch.int64)
    attention(q, kc, torch.zeros_like(kc), q_pos=pos, out_order=(0, 2, 1, 3), num_splits=num_splits)


DECODE_GATHER = "translator_kernels.measure.decode_isa:compile_decode_gather"


def compile_decode_gather(batch, hidden, vocab):
    """The embedding gather of a decode step: `batch` int64 token ids from a [vocab, hidden] bf16 table (allocated,
    never touched: the compile reads shapes only)."""
    import torch

    from translator_kernels.gather import embedding

    embedding(torch.empty(vocab, hidden, dtype=torch.bfloat16), torch.zeros(batch, 1, dtype=torch.int64))
