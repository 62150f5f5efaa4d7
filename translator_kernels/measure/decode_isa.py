"""Compile entries for the decode-step MODEL (bench.generate): the kernels of one Llama decode step
that bench.generate prices on their compiled ISA features, launched on zero tensors in
translator_kernels.isa's COMPILE_ONLY child (no GPU; nothing runs).
"""

from __future__ import annotations

import json

DECODE_ATTENTION = "translator_kernels.measure.decode_isa:compile_decode_attention"


def compile_decode_attention(batch, heads, kv_heads, head_dim, context, num_splits, dtype="bf16"):
    """The decode attention of one layer as the translated graph calls it: one query token per sequence
    against the static cache [B, Hkv, S_max, D] read in place up to its position (q_pos), O written as
    [B, 1, H, D] for the output projection; `num_splits` > 1 compiles the split kernel, its merge inside it
    (partials, tickets, the last slice's merge)."""
    import torch

    from translator_kernels.arch import NAMED_DTYPES
    from translator_kernels.attention import attention

    tdt = NAMED_DTYPES[dtype]
    q = torch.zeros(batch, 1, heads, head_dim, dtype=tdt).transpose(1, 2)
    kc = torch.zeros(batch, kv_heads, context, head_dim, dtype=tdt)
    pos = torch.full((1,), context - 1, dtype=torch.int64)
    attention(q, kc, torch.zeros_like(kc), q_pos=pos, out_order=(0, 2, 1, 3), num_splits=num_splits)


DECODE_GATHER = "translator_kernels.measure.decode_isa:compile_decode_gather"


def compile_decode_gather(batch, hidden, vocab):
    """The embedding gather of a decode step: `batch` int64 token ids from a [vocab, hidden] bf16 table (allocated,
    never touched: the compile reads shapes only)."""
    import torch

    from translator_kernels.gather import embedding

    embedding(torch.empty(vocab, hidden, dtype=torch.bfloat16), torch.zeros(batch, 1, dtype=torch.int64))


# the decode kernels whose features attention/split_model.py's split choice reads (FEATURES_JSON): GQA 4
# (Llama-3's 32 / 8 heads, packed), a 4096-key cache, each dtype and head dim here, split and not
FEATURE_SHAPES = [(arch, dt, d) for arch in ("gfx942", "gfx950") for dt in ("bf16", "f16", "f32")
                  for d in (32, 64, 128)]


def attention_features(arch: str, dtype: str, head_dim: int) -> dict:
    """{'whole', 'split'}: split_model.decode_features of the unsplit and split decode kernels (COMPILE_ONLY child)."""
    from translator_kernels.attention.split_model import decode_features
    from translator_kernels.hotloop import compile_isa_texts, main_text

    out = {}
    for name, n in (("whole", 1), ("split", 16)):
        text = main_text(compile_isa_texts(DECODE_ATTENTION, (1, 32, 8, head_dim, 4096, n, dtype), arch=arch))
        out[name] = decode_features(text, arch).to_dict()
    return out


def write_attention_features(shapes=None) -> dict:
    """Compile every FEATURE_SHAPES kernel and write split_model.FEATURES_JSON (sorted keys: a stable diff)."""
    from translator_kernels.attention.split_model import FEATURES_JSON, feature_key

    table = {feature_key(*s): attention_features(*s) for s in (shapes or FEATURE_SHAPES)}
    FEATURES_JSON.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


if __name__ == "__main__":  # python -m translator_kernels.measure.decode_isa: regenerate FEATURES_JSON
    write_attention_features()
