"""Embedding family: `flydsl.embedding(weight, ids)` — a row gather from a table.

Forms matched (where they appear):
- ``aten.embedding(weight, ids[, padding_idx, scale_grad_by_freq, sparse])`` — ``nn.Embedding``
  token and position embeddings in every HF language model (GPT-2 wte / wpe, Llama embed_tokens,
  BERT word / position / token-type embeddings).
`padding_idx`, `scale_grad_by_freq` and `sparse` only change the gradient, so forward is the
same gather whatever they are. Out-of-range ids raise IndexError where the check costs no device
synchronization (flysim on CPU); the kernel never reads outside the table.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..graph import aten, arg, dtype_of, dtype_reason, shape_of
from ..registry import OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch


@torch.library.custom_op("flydsl::embedding", mutates_args=())
def embedding(weight: torch.Tensor, ids: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return dispatch("embedding", weight, ids, out_dtype)


@embedding.register_fake
def _(weight, ids, out_dtype=None):
    return weight.new_empty((*ids.shape, weight.shape[1]), dtype=out_dtype or weight.dtype)  # passes/store_casts.py


def ref_embedding(weight, ids, out_dtype=None):
    y = torch.nn.functional.embedding(ids, weight)
    return y if out_dtype is None else y.to(out_dtype)


def kernel_embedding(weight, ids, out_dtype=None):
    from translator_kernels.gather import embedding as run

    return run(weight, ids, out_dtype=out_dtype)


register_family(OpFamily(
    name="embedding", description="row gather from a table (nn.Embedding forward)",
    reference=ref_embedding, kernel=kernel_embedding, kernel_entry="translator_kernels.gather:embedding",
    sample_inputs=lambda dt: (torch.randn(40, 24).to(dt), torch.randint(0, 40, (3, 5))),
))


def embedding_supported(node, ctx):
    weight, ids = arg(node, "weight"), arg(node, "indices")
    r = dtype_reason(weight, "embedding table")
    if r:
        return r
    if dtype_of(ids) not in (torch.int64, torch.int32):
        return f"ids dtype {dtype_of(ids)} is not int64 / int32"
    if len(shape_of(weight)) != 2:
        return "embedding table is not 2-D"
    return None


@rule(Stage.CANONICAL, aten.embedding.default, family="embedding", supported=embedding_supported,
      doc="nn.Embedding forward (token / position embeddings)")
def lower_embedding(node, ctx):
    # a gather is exact in any dtype: the table keeps its dtype under precision bf16 / fp16
    return ctx.replace(node, "embedding", "embedding", (arg(node, "weight"), arg(node, "indices")), [node])
