"""HF transformers' fine-grained fp8 linear, captured as one node.

`transformers.integrations.finegrained_fp8.FP8Linear` (quantization_config
`FineGrainedFP8Config(weight_block_size=(128, 128))`: e4m3fn weights with fp32 `weight_scale_inv` per 128 x 128
block, activations quantized per token and K block of 128 at run time) calls the module function
`fp8_linear`, which dispatches to a hub kernel (DeepGEMM or the `kernels-community/finegrained-fp8` Triton
kernel). torch.export cannot see through either. While the translator runs an HF model
(adapters/hf.py: `HFForward`, for the capture and for eager verification alike) that name points at
`flydsl_hf::fp8_linear` (defined with its lowering, translator/lowerings/quant_block.py, which translate() has
imported before it captures), a custom op whose implementation is the original `fp8_linear` with the same
arguments (where the hub kernel is not installed, as on a machine without a GPU build, HF raises ImportError and
the op runs the same math in torch: gemm/fp8_block.ref_fp8_block_linear): eager results are HF's own, and the capture holds one node with the weight, its scales and
the block size, which translator/lowerings/quant_block.py turns into FlyDSL kernels (or leaves as it is,
with the reason). The patch is undone when the forward returns (or raises); nothing of the model changes.
"""

from __future__ import annotations

import contextlib
import sys

import torch

HF_FP8_MODULE = "transformers.integrations.finegrained_fp8"


def _captured(x, weight, weight_scale_inv, block_size=None, bias=None, activation_scale=None, allow_deepgemm=True):
    return torch.ops.flydsl_hf.fp8_linear(x, weight, weight_scale_inv, list(block_size or []), bias, activation_scale)


@contextlib.contextmanager
def captured_quant_layers():
    """HF's fp8_linear -> flydsl_hf::fp8_linear for the duration (nothing when transformers' fine-grained fp8
    integration was never imported, so no model uses it)."""
    hf = sys.modules.get(HF_FP8_MODULE)
    if hf is None or getattr(hf, "_flydsl_original_fp8_linear", None) is not None:  # absent, or already inside
        yield
        return
    original = hf.fp8_linear
    try:  # patched inside the try: an interrupt between the two lines still restores HF's function
        hf._flydsl_original_fp8_linear = original
        hf.fp8_linear = _captured
        yield
    finally:
        hf.fp8_linear = original
        hf.__dict__.pop("_flydsl_original_fp8_linear", None)
