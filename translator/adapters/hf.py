"""HuggingFace transformers models: what translate() does for them before capture.

A `transformers.PreTrainedModel` is wrapped (never modified) so that:
- decoder models run with `use_cache=False`: with the cache on they return a
  `DynamicCache`, which torch.export cannot flatten; a translated graph serves one
  forward pass, so the cache has nothing to carry;
- the attention implementation is one the translator reads: "eager" (HF's hand-written
  softmax(QK^T)V, matched by the attention patterns) or "sdpa"
  (`aten.scaled_dot_product_attention`). Others (flash_attention_2, flex_attention, paged
  kernels) are custom ops or higher-order ops the capture cannot see through, so they are
  refused with one error that names the fix. So is "sdpa" set on a config whose class has no
  sdpa attention (`_supports_sdpa = False`: BLOOM, MPT, Gemma 2): transformers refuses that when
  it builds the model, but a config edited afterwards slips through, and then HF's mask code
  (which under torch.export materializes a boolean mask that eager skips) feeds an attention
  that adds it to the scores, so the captured graph and eager differ.

transformers is optional (`pip install flydsl-translator[hf]`): nothing here imports it
unless the model is one of its classes.
"""

from __future__ import annotations

import sys

import torch

from ..errors import InputError

SUPPORTED_ATTENTION = ("eager", "sdpa")


def is_hf_model(model) -> bool:
    if "transformers" not in sys.modules:  # a model of its classes implies the import happened
        return False
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def attn_implementation(model) -> str | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "_attn_implementation", None) if cfg is not None else None


class HFForward(torch.nn.Module):
    """The HF model called with use_cache=False (when it takes it) and return_dict=True."""

    def __init__(self, model, kwargs: dict):
        super().__init__()
        self.model = model
        self._kwargs = kwargs

    def forward(self, *args):
        from .hf_quant import captured_quant_layers  # fine-grained fp8 linears as one node each

        with captured_quant_layers():
            return self.model(*args, **self._kwargs)


def adapt(model):
    """(module to capture, notes): an HF model wrapped as above, anything else as given."""
    if not is_hf_model(model):
        return model, []
    impl = attn_implementation(model)
    if impl not in SUPPORTED_ATTENTION:
        raise InputError(f"{type(model).__name__} uses attn_implementation={impl!r}, which the translator cannot "
                         f"capture; build the model with attn_implementation=\"sdpa\" (or \"eager\"), e.g. "
                         f"{type(model).__name__}.from_config(config, attn_implementation=\"sdpa\")")
    if impl == "sdpa" and getattr(type(model), "_supports_sdpa", True) is False:
        raise InputError(f"{type(model).__name__}'s config says attn_implementation='sdpa', but the class has no sdpa "
                         f"attention (transformers refuses it when building the model): its attention runs an sdpa mask "
                         f"it was not written for, and eager and the captured graph can differ; build it with "
                         f"attn_implementation=\"eager\", e.g. {type(model).__name__}.from_config(config, "
                         f"attn_implementation=\"eager\")")
    notes = [f"HuggingFace {type(model).__name__}: attn_implementation={impl!r}"]
    kwargs = {"return_dict": True}
    if _takes(model, "use_cache"):
        kwargs["use_cache"] = False
        notes.append("called with use_cache=False (a KV cache object cannot be a torch.export output, and a "
                     "translated graph serves one forward pass)")
    return HFForward(model, kwargs), notes


def _takes(model, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
