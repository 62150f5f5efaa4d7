"""The one tolerance table, and the bounds built from it.

Two questions, two kinds of bound:

- **Op level** (a kernel against its reference, on the same inputs): `op_tolerance(dtype,
  family, reduction_length)` gives torch.testing's (atol, rtol), |got - want| <= atol +
  rtol * |want|. Keyed by the dtype the op computes in (references for bf16/fp16 are
  computed in fp32, so these bound the kernel's own rounding). Per-op overrides sit on the
  op's registry entry with their reason (`OpFamily.tolerance_overrides`). Every kernel
  accumulates in fp32, and a sum of n terms taken in another order than torch's differs by
  about sqrt(n) fp32 ulps of its largest partial sums: with `reduction_length=n` atol grows
  by sqrt(n) * eps_fp32 * `scale` (the largest |want|). Kernel tests and the registry
  conformance test read these, never a copy.

- **Model level** (the translated model against eager PyTorch): `model_bound` makes a
  `Bound` for one output from `MODEL_TOLERANCES`. Both of its checks scale with the output,
  so an output of size 1e-5 is held to errors of size ~1e-10, not 1e-4:
    - elementwise: |got - eager| <= atol + rtol * |eager| with atol = atol_rel * RMS(eager);
    - RMS-relative: RMS(got - eager) <= rms_rel * RMS(eager). A kernel returning zeros has
      RMS-relative error 1 and fails at any scale; a +5e-5 shift at unit scale is 5e-5 > 1e-5.
  In fp32 the bound is grounded in eager's own error: translate() runs the model once in
  fp64 on the same inputs (`translator.verify.calibrate`); a model whose eager fp32 output
  is itself far from fp64 (an ill-conditioned one: KernelBench Mamba-2's segsum is 7 % off)
  gets `CALIBRATION_FACTOR` times that error, which a faithful translation meets and a
  sloppy kernel on a well-conditioned model does not. Integer and bool outputs must match
  exactly.

- **Low precision** (an output in bf16 / fp16, or `precision="bf16"` / `"fp16"`): eager itself
  rounds every op to the low precision, and a fused kernel that computes in fp32 and rounds once
  is *closer* to the exact result than eager is; measured against eager, over 22 layers, such a
  correct translation drifted past any fixed table row. So both are measured against a more exact
  run of the same model (the truth: the model in fp32; docs/verification.md), and `truth_bound`
  lets the translation be at most `LOW_PRECISION_FACTOR` times as far from it as eager is, plus
  a floor of one rounding of the output (`LOW_PRECISION_FLOOR`), for the largest error and for the
  RMS error of each output. A seeded bug (a wrong scale, a dropped bias, a missing eps) puts the
  translation further from the truth than eager's rounding at every depth: its error is made
  where eager's is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# op level: dtype the op computes in -> (atol, rtol)
TOLERANCES = {
    torch.float32: (1e-5, 1.3e-6),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}

# model level: precision -> (atol relative to RMS(eager), rtol, RMS(error) / RMS(eager)).
# A chain of ops accumulates each op's rounding, and fp32 GEMMs and reductions sum in another
# order than eager's BLAS / reductions: for random data that is ~1e-7 of the output's RMS, so
# 1e-5 leaves two orders of margin and still catches a +5e-5 error at unit scale.
MODEL_TOLERANCES = {
    "fp32": (1e-5, 1e-5, 1e-5),
    "bf16": (6e-2, 6e-2, 2e-2),
    "fp16": (8e-3, 8e-3, 3e-3),
}

# tests that hold a translated model to eager with torch.testing.assert_close on unit-scale data
# (translate's own verification uses `model_bound`, which scales with each output): fp32 entries
# by name, with their reason; bf16 / fp16 read MODEL_TOLERANCES (atol at RMS 1, rtol).
MODEL_CHECKS = {
    "model": (1e-4, 1e-4, "GEMMs and reductions sum K terms in another order than eager's; errors "
                          "compound through layers"),
    "few_ops": (1e-5, 1e-5, "a few per-element ops, rows or short sums (K <= 64): a few fp32 ulps"),
}

# a faithful fp32 translation differs from eager by about as much as eager differs from fp64
# (two roundings of the same math in different orders): allow this many times eager's own error
CALIBRATION_FACTOR = 4.0

EPS_ACCUMULATE = torch.finfo(torch.float32).eps  # kernels accumulate in fp32

# low precision, judged against the truth: the translation may be this many times as far from it as
# eager is (a faithful one is about as far or closer: it rounds the same values, fewer times) ...
LOW_PRECISION_FACTOR = 2.0
# ... plus one unit roundoff of the output dtype (2^-8 bf16, 2^-11 fp16), times RMS(truth) for the RMS
# error and max |truth| for the largest: an output that eager happens to round exactly (a copy, a relu)
# may still be rounded once by the translation
LOW_PRECISION_FLOOR = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


@dataclass(frozen=True)
class Bound:
    """What one output must meet: |got - want| <= atol + rtol * |want| everywhere, and
    RMS(got - want) <= rms. `exact`: integer / bool outputs, compared for equality."""

    atol: float
    rtol: float
    rms: float
    exact: bool = False
    why: str = ""


def op_tolerance(dtype: torch.dtype, family=None, reduction_length: int = 1,
                 scale: float = 1.0) -> tuple[float, float]:
    """(atol, rtol) for one FlyDSL op in `dtype`. `family`: an OpFamily or its name (its
    overrides apply); `reduction_length`: terms summed per output; `scale`: max |want|."""
    if isinstance(family, str):
        from . import lowerings  # noqa: F401  (importing the lowerings fills the registry)
        from .registry import FAMILIES

        family = FAMILIES[family]
    if family is not None and dtype in family.tolerance_overrides:
        atol, rtol, _reason = family.tolerance_overrides[dtype]
    else:
        atol, rtol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    if reduction_length > 1:
        atol += math.sqrt(reduction_length) * EPS_ACCUMULATE * scale
    return atol, rtol


def op_tol(dtype: torch.dtype, family=None, **kw) -> dict:
    """`op_tolerance` as keyword arguments for torch.testing.assert_close."""
    return dict(zip(("atol", "rtol"), op_tolerance(dtype, family, **kw)))


def model_tolerance(precision: str) -> tuple[float, float, float]:
    """(atol relative to RMS(eager), rtol, rms_rel) for whole-model checks in `precision`."""
    if precision not in MODEL_TOLERANCES:
        raise KeyError(f"no model tolerance for precision {precision!r}; one of {', '.join(MODEL_TOLERANCES)}")
    return MODEL_TOLERANCES[precision]


def model_tol(precision="fp32", check: str = "model") -> dict:
    """(atol, rtol) as keyword arguments of torch.testing.assert_close for a translated model against
    eager in a test: fp32 (a precision name or a dtype) from `MODEL_CHECKS[check]`, bf16 / fp16
    from MODEL_TOLERANCES."""
    if isinstance(precision, torch.dtype):
        precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[precision]
    if precision == "fp32":
        atol, rtol, _why = MODEL_CHECKS[check]
    else:
        atol, rtol, _ = model_tolerance(precision)
    return {"atol": atol, "rtol": rtol}


def rms(t: torch.Tensor, chunk: int = 1 << 18) -> float:
    """Root mean square of the finite values of `t` (0.0 when there are none); in float64, `chunk`
    elements at a time (all at once, an 8 MB output took 80 MB of temporaries)."""
    flat = t.detach().reshape(-1)
    total, count = 0.0, 0
    for start in range(0, flat.numel(), chunk):
        c = flat[start:start + chunk].double()
        c = c[torch.isfinite(c)]
        total += float(c.square().sum())
        count += c.numel()
    return (total / count) ** 0.5 if count else 0.0


_LOW_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def model_bound(precision: str, expected: torch.Tensor, eager_error: tuple[float, float] | None = None) -> Bound:
    """The bound one translated output must meet against eager's `expected`.

    eager_error: (max abs error, RMS error relative to RMS, ...) of eager fp32 against eager fp64
    on the same inputs (fp32 only), from translator.verify.calibrate."""
    if not (expected.is_floating_point() or expected.is_complex()):
        return Bound(0.0, 0.0, 0.0, exact=True, why=f"{str(expected.dtype)[6:]} output: exact")
    # precision "fp32" keeps the model's dtypes: a bf16 / fp16 model's output is held to its own dtype's row
    # (eager rounds each op to that dtype, the FlyDSL ops accumulate in fp32), never to fp32's
    precision = _LOW_PRECISION.get(expected.dtype, precision) if precision == "fp32" else precision
    atol_rel, rtol, rms_rel = model_tolerance(precision)
    scale = max(rms(expected), torch.finfo(torch.float32).tiny)
    atol = atol_rel * scale
    why = f"{precision} table (atol {atol_rel:g}·RMS, rtol {rtol:g}, RMS rel {rms_rel:g})"
    if precision == "fp32" and eager_error is not None:
        max_abs, rel = eager_error[0], eager_error[1]
        if CALIBRATION_FACTOR * max_abs > atol or CALIBRATION_FACTOR * rel > rms_rel:
            atol = max(atol, CALIBRATION_FACTOR * max_abs)
            rms_rel = max(rms_rel, CALIBRATION_FACTOR * rel)
            why = (f"calibrated: eager fp32 is itself {rel:.3g} (RMS rel) / {max_abs:.3g} (max abs) off fp64; "
                   f"{CALIBRATION_FACTOR:g}x that")
    return Bound(atol, rtol, rms_rel * scale, why=why)


def low_precision(precision: str, dtype: torch.dtype) -> str | None:
    """The low precision an output of `dtype` is judged in ("bf16" / "fp16"), or None for fp32."""
    return _LOW_PRECISION.get(dtype) or (precision if precision in LOW_PRECISION_FLOOR else None)


@dataclass(frozen=True)
class TruthBound:
    """What one low-precision output must meet against the truth: max |got - truth| <= max_abs and
    RMS(got - truth) <= rms (absolute values, from eager's own errors against the same truth)."""

    max_abs: float
    rms: float
    why: str = ""


def truth_bound(precision: str, truth: torch.Tensor, eager_max: float, eager_rms: float) -> TruthBound:
    """`LOW_PRECISION_FACTOR` times eager's error against `truth` plus `LOW_PRECISION_FLOOR`, for the
    largest error and for the RMS error (`eager_rms` absolute, not relative)."""
    floor = LOW_PRECISION_FLOOR[precision]
    t = truth.detach().double()
    t = t[torch.isfinite(t)]
    top = float(t.abs().max()) if t.numel() else 0.0
    return TruthBound(LOW_PRECISION_FACTOR * eager_max + floor * top, LOW_PRECISION_FACTOR * eager_rms + floor * rms(t),
                      why=f"{precision} vs truth: {LOW_PRECISION_FACTOR:g}x eager's error + {floor:.3g}·(max|truth|, RMS)")
