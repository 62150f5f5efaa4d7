"""The one tolerance table (torch.testing semantics: |a - b| <= atol + rtol * |b|).

Keyed by the dtype the FlyDSL op computes in. References for bf16/fp16 runs are
computed in fp32, so these bound the kernel's own rounding, not the reference's.
Per-op overrides sit on the op's registry entry with their reason
(`OpFamily.tolerance_overrides`).
"""

from __future__ import annotations

import torch

# single-op tolerances
TOLERANCES = {
    torch.float32: (1e-5, 1.3e-6),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}

# whole-model tolerances: a chain of ops accumulates each op's rounding, and fp32 GEMMs and
# reductions sum in a different order than eager's BLAS / reductions.
MODEL_TOLERANCES = {
    "fp32": (1e-4, 1e-4),
    "bf16": (6e-2, 6e-2),
    "fp16": (8e-3, 8e-3),
}


def op_tolerance(dtype: torch.dtype, family=None) -> tuple[float, float]:
    if family is not None and dtype in family.tolerance_overrides:
        atol, rtol, _reason = family.tolerance_overrides[dtype]
        return atol, rtol
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def model_tolerance(precision: str) -> tuple[float, float]:
    return MODEL_TOLERANCES[precision]
