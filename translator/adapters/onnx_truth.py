"""ONNX Runtime as the truth for an .onnx file.

Verifying an imported ONNX model against our own import of it is circular: an importer bug (a
transposed Gemm, a wrong axis) is in both sides and can never fail. So the verdict on an .onnx
file compares the translation with ONNX Runtime's CPU execution of the *original file* on the
same example inputs, with the bounds used for eager PyTorch (`verify_outputs`, the fp32 bound
calibrated on our import's own fp32-vs-fp64 error). What the import contributes:

- **Calibration.** Eager's rounding error is measured on the import (run in fp64 by
  `truth.run_as`); ONNX Runtime gives one fp32 run, no error estimate. For `precision="bf16"` /
  `"fp16"` on an fp32 file, the truth those outputs are judged against is ONNX Runtime's fp32
  output (eager's own low-precision error is still the import run in bf16 / fp16).
- **Localization.** The first FlyDSL node that diverges is still named against the captured
  import (`verify.first_divergence`): that is where a kernel bug shows. When no FlyDSL node
  diverges, the import itself is wrong: `import_divergence` runs ONNX Runtime once more with
  every intermediate value as an output and names the first ONNX node whose imported value
  differs (a node-level heuristic bound, `NODE_RTOL` of the value's RMS).
- A file in bf16 / fp16 has low-precision outputs judged against the import run in fp32; the
  import is then also checked against ONNX Runtime's output directly (`check_import`).

ONNX Runtime runs with graph optimizations off (the file as written: no fused approximations)
and one thread. Where onnxruntime is missing or cannot run the file, the verdict falls back to
the import and `label` says so; the report shows `label` as the verification's truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

ORT_HINT = "pip install 'flydsl-translator[onnx]'"
NODE_RTOL = 1e-4  # import_divergence: an intermediate value off ONNX Runtime's by more than this (of its RMS)


@dataclass
class OnnxTruth:
    path: Path
    label: str  # which truth the verdict used, for the report
    outputs: object = None  # ONNX Runtime's outputs, shaped like the import's; None: the import is the truth


def _session(model_bytes_or_path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes_or_path, so, providers=["CPUExecutionProvider"])


def _feeds(module, inputs) -> dict:
    return {n: x.detach().cpu().numpy() for n, x in zip(module.input_names, inputs)}


def _torch(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a))


def run_truth(path, module, inputs) -> OnnxTruth:
    """ONNX Runtime's outputs for `path` on `inputs` (the import `module` gives names and structure)."""
    path = Path(path)
    mine = f"our own import of {path.name}"
    try:
        import onnxruntime as ort
    except ImportError:
        return OnnxTruth(path, f"{mine} (onnxruntime is not installed, so an importer bug cannot fail "
                               f"verification: {ORT_HINT})")
    if any(x.dtype == torch.bfloat16 for x in inputs):
        return OnnxTruth(path, f"{mine} (ONNX Runtime takes no bf16 inputs from Python)")
    try:
        outs = _session(str(path)).run(module.output_names, _feeds(module, inputs))
    except Exception as e:  # noqa: BLE001 — a file ORT cannot run: said in the label, the import judges
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return OnnxTruth(path, f"{mine} (ONNX Runtime {ort.__version__} could not run the file: "
                               f"{type(e).__name__}: {first})")
    res = tuple(_torch(o) for o in outs)
    return OnnxTruth(path, f"ONNX Runtime {ort.__version__} (CPU, graph optimizations off) on {path.name}",
                     res[0] if len(res) == 1 else res)


def with_truth(truth: OnnxTruth, calibration, precision: str):
    """`calibration` (verify.calibrate's per-output EagerError) with ONNX Runtime's fp32 outputs as the
    truth of low-precision runs of an fp32 file; unchanged otherwise."""
    from ..verify import Calibration

    if truth.outputs is None or precision not in ("bf16", "fp16"):
        return calibration
    if isinstance(calibration, Calibration):  # low precision: already run
        calibration = calibration.get()
    if not calibration:
        return calibration
    out = []
    for c, t in zip(calibration, pytree.tree_leaves(truth.outputs)):
        ok = c is not None and c.truth is not None and isinstance(t, torch.Tensor) and t.dtype == c.truth.dtype \
            and t.shape == c.truth.shape
        out.append(c._replace(truth=t) if ok else c)
    return out + list(calibration[len(out):])


def check_import(truth: OnnxTruth, eager, precision: str) -> list[str]:
    """Lines naming each bf16 / fp16 output where our import (eager) is off ONNX Runtime by more than
    that precision's model bound; these outputs are judged against the import, so this check is
    what makes an importer bug fail them."""
    from ..tolerances import low_precision, model_bound
    from ..verify import compare

    if truth.outputs is None:
        return []
    bad = []
    for i, (t, e) in enumerate(zip(pytree.tree_leaves(truth.outputs), pytree.tree_leaves(eager))):
        if not (isinstance(t, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()):
            continue
        lp = low_precision("fp32", e.dtype)
        if lp is None:
            continue
        c = compare(t.to(e.dtype), e, model_bound(lp, t.to(e.dtype)))
        if c is None or not c["passed"]:
            what = "a different shape" if c is None else f"max abs err {c['max_abs']:.3g}, RMS rel {c['rms_rel']:.3g}"
            bad.append(f"output {i}: our import differs from ONNX Runtime ({what})")
    return bad


def import_divergence(truth: OnnxTruth, module, inputs) -> str | None:
    """The first ONNX node (file order) whose value in our import differs from ONNX Runtime's, as one
    line; None if every value agrees, or where ONNX Runtime cannot expose them."""
    import onnx

    from ..tolerances import Bound, rms
    from ..verify import compare

    try:
        model = onnx.shape_inference.infer_shapes(onnx.load(str(truth.path)))
        typed = {v.name: v for v in (*model.graph.value_info, *model.graph.output)}
        have = {o.name for o in model.graph.output}
        extra = [typed[o] for n in model.graph.node for o in n.output if o in typed and o not in have]
        model.graph.output.extend(extra)
        names = [o.name for o in model.graph.output]
        ort_vals = dict(zip(names, _session(model.SerializeToString()).run(names, _feeds(module, inputs))))
        with torch.no_grad():
            mine = module.values(*inputs)
    except Exception:  # noqa: BLE001 — localization is best effort; the verdict stands without it
        return None
    for n in model.graph.node:
        for o in n.output:
            if o not in ort_vals or not isinstance(mine.get(o), torch.Tensor):
                continue
            want, got = _torch(ort_vals[o]), mine[o]
            if not want.is_floating_point():
                same = tuple(want.shape) == tuple(got.shape) and torch.equal(want, got.to(want.dtype))
                c = None if not same else {"passed": True}
            else:
                s = max(rms(want), 1e-30)
                c = compare(want, got.to(want.dtype), Bound(NODE_RTOL * s, NODE_RTOL, NODE_RTOL * s))
            if c is None or not c["passed"]:
                err = ("shape " + str(list(got.shape)) + " vs " + str(list(want.shape))) if c is None or \
                    "max_abs" not in c else f"max abs err {c['max_abs']:.3g}, RMS rel {c['rms_rel']:.3g}"
                return (f"our import differs from ONNX Runtime first at ONNX node {n.name or '?'} ({n.op_type}), "
                        f"value {o}: {err} — an importer bug in {n.op_type}")
    return None


def annotate(v, truth: OnnxTruth, module, inputs, eager, precision: str) -> None:
    """Say in verification `v` which truth judged it; fail it where the import of a low-precision output
    is off ONNX Runtime; on failure, name the ONNX node our import gets wrong (if any)."""
    v.truth = truth.label
    bad = check_import(truth, eager, precision)
    if bad:
        v.passed = False
        v.message = "; ".join(bad) if v.message.startswith("all outputs match") else v.message + "; " + "; ".join(bad)
    if v.passed:
        v.message = f"all outputs match {truth.label}"
        return
    v.message = f"against {truth.label}: {v.message}"
    if truth.outputs is not None:
        where = import_divergence(truth, module, inputs)
        if where:
            v.message += f"; {where}"
