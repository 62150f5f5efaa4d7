"""Compile entry of the row kernels (softmax, layer_norm, rms_norm) for translator_kernels.isa's child
(COMPILE_ONLY, no GPU): give `translator_kernels.hotloop.compile_isa_texts` ENTRY with (family, dtype,
(m, n)). The timing MODEL's tests read the features of its ISA; bench.isa compiles it beside FlyDSL's.
"""

from __future__ import annotations

from translator_kernels.arch import NAMED_DTYPES

ENTRY = "translator_kernels.measure.rows_isa:compile_one"
FAMILIES = ("softmax", "layer_norm", "rms_norm")


def compile_one(family: str, dtype: str, shape) -> None:
    """Launch one row kernel on empty CPU tensors of [m, n] (runs in the child, under COMPILE_ONLY)."""
    import torch

    m, n = shape
    x = torch.empty(m, n, dtype=NAMED_DTYPES[dtype])
    if family == "softmax":
        from translator_kernels.rows.softmax import softmax

        softmax(x)
    elif family == "layer_norm":
        from translator_kernels.rows.norm import layer_norm

        layer_norm(x, torch.empty(n), torch.empty(n))
    elif family == "rms_norm":
        from translator_kernels.rows.norm import rms_norm

        rms_norm(x, torch.empty(n, dtype=NAMED_DTYPES[dtype]))
    else:
        raise ValueError(f"unknown row family {family}")
