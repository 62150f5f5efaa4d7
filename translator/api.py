"""translate(): capture -> passes -> choose backend -> verify -> report.

The user's model and inputs are never modified: each internal run gets its own copy of the
example inputs (a model may write an input in place); a model in training mode is captured and
verified in eval mode (the report's capture notes say so) and its modes are restored; every
internal run of the model or of a captured graph restores the buffers it advanced, and the
translated module owns copies of the buffers its graph writes (translator.state).

Threads: translate() calls are serialized by one process-wide lock (torch.export, the
registry and the kernel caches are process-global, and translate is CPU-bound under the
GIL anyway); calls of translated modules may run from any thread (flysim sessions, which
patch FlyDSL globals, are serialized in translator.runtime).

State: the translated module (translator.translated) shares the user's model's weights.

fallback_on_mismatch returns the diverging FlyDSL node to PyTorch, all of it (every
captured node it absorbed, a GEMM's fused epilogue included), and translates again; each
round adds at least one captured node to the denied set, so the loop ends.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import torch
import torch.utils._pytree as pytree
from translator_kernels.launch import locked

from . import runtime
from .capture import capture, check_inputs, check_model, lower_with_retry
from .distributed import localize
from .errors import InputError, StrictError
from .progress import stage
from .graph import PRECISIONS, LowerCtx
from .passes import run_pipeline
from .registry import FAMILIES
from .runtime.precompile import precompile
from .report import Report
from .report.rows import track
from .state import preserved
from .translated import TranslatedModule, input_spec
from .verify import Calibration, calibrate, first_divergence, verify_outputs
from . import weights

_TRANSLATE_LOCK = threading.RLock()


@contextlib.contextmanager
def _eval_mode(model):
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, t in modes:
            m.training = t


def _validate(model, arch, backend, precision):
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_options(arch, backend, precision)


def check_options(arch, backend, precision):
    """The option values translate() and torch.compile(backend="flydsl") take."""
    if arch not in runtime.ARCHS:
        raise InputError(f"arch {arch!r} is not supported; choose one of {', '.join(runtime.ARCHS)}")
    if backend not in ("auto", *runtime.BACKENDS):
        raise InputError(f"backend {backend!r} is not one of auto, {', '.join(runtime.BACKENDS)}")
    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def choose_backend(requested: str, families_used: set[str]) -> tuple[str, str]:
    if requested == "rocm":
        if not runtime.rocm_gpu_present():
            raise InputError("backend='rocm' needs an AMD GPU visible to a ROCm build of torch, and none is; "
                             "use backend='flysim' (interpreter) or 'reference'")
        return "rocm", "requested"
    if requested == "flysim":
        why = runtime.flysim_available()
        if why:
            raise InputError(f"backend='flysim' cannot run here: {why}")
        return "flysim", "requested"
    if requested == "reference":
        return "reference", "requested"
    if runtime.rocm_gpu_present():
        return "rocm", "auto: a ROCm GPU is present"
    why = runtime.flysim_available()
    if not families_used:
        return "reference", "auto: nothing was lowered to a FlyDSL op"
    if not why:
        return "flysim", "auto: no ROCm GPU; the FlyDSL kernels run on flysim"
    return "reference", f"auto: no ROCm GPU, and {why}"


def translate(model, example_inputs, *, arch: str = "gfx942", backend: str = "auto", precision: str = "fp32",
              verify: bool = True, strict: bool = False, fallback_on_mismatch: bool = False,
              dynamic_shapes="auto", name: str | None = None, isa: bool = False) -> TranslatedModule:
    """Translate `model` so its hot ops run as FlyDSL ops; verify against eager; report.

    model: an nn.Module (HuggingFace models included) or the path of an .onnx file
    (example_inputs may then be None: inputs are made from the file's input types).

    arch: gfx942 (MI300X) | gfx950 (MI350X/MI355X). backend: auto | rocm | flysim | reference.
    precision: fp32 keeps the model's dtypes; bf16 / fp16 run fp32 FlyDSL ops in that dtype; fp8 runs
    as bf16 with parameter linears as per-token fp8 GEMMs (docs/fp8.md).
    strict: raise StrictError if any compute op stays in PyTorch or runs only as a reference.
    fallback_on_mismatch: return each diverging FlyDSL node to PyTorch and re-verify.
    dynamic_shapes: "auto" (batch and sequence dims dynamic where the model allows), None (every
    dim fixed to the examples), or a torch.export dynamic_shapes spec.
    isa: compile each distinct FlyDSL kernel specialization for `arch` (no GPU needed; seconds
    per kernel, cached in-process) and put its ISA statistics in `report.kernels`.
    """
    return locked(_TRANSLATE_LOCK, _translate, model, example_inputs, arch=arch, backend=backend, precision=precision,
                  verify=verify, strict=strict, fallback_on_mismatch=fallback_on_mismatch,
                  dynamic_shapes=dynamic_shapes, name=name, isa=isa)


def _translate(model, example_inputs, *, arch, backend, precision, verify, strict, fallback_on_mismatch,
               dynamic_shapes, name, isa) -> TranslatedModule:
    from .adapters import hf, onnx_import, onnx_truth

    onnx_path = model if onnx_import.is_onnx_path(model) else None
    if onnx_path is not None:  # an .onnx file: imported as an nn.Module, judged against ONNX Runtime
        model, example_inputs = onnx_import.import_onnx(model, example_inputs)
    name = name or getattr(model, "onnx_name", None) or type(model).__name__
    user_model = model
    model, adapt_notes = hf.adapt(model)  # HF models: use_cache off, attention implementation checked
    model, dt_notes = localize(model)  # DTensor tensor parallel -> local shards + functional all_reduce
    adapt_notes += dt_notes
    _validate(model, arch, backend, precision)
    check_model(model)
    inputs = check_inputs(example_inputs)
    from . import lowerings  # noqa: F401  (importing the lowerings fills the registry)
    deny: dict = {}
    fallbacks: list = []
    if any(m.training for m in model.modules()):
        adapt_notes.append("the model was in training mode: it was captured and verified in eval mode (dropout off, "
                           "batchnorm on its running statistics), and the translation computes eval-mode results; "
                           "the model's own mode is unchanged")
    with _eval_mode(model):
        eager = _eager(model, _fresh(inputs))
        calibration = Calibration(lambda: calibrate(model, _fresh(inputs), eager, precision), eager,
                                  precision) if verify else None  # fp32: run only if the table bound fails
        judge = onnx_truth.run_truth(onnx_path, model, _fresh(inputs)) if verify and onnx_path is not None else None
        while True:
            tm = _translate_once(model, _fresh(inputs), arch, backend, precision, deny, name, dynamic_shapes)
            precompile(tm)  # every kernel specialization of the example shapes, before anything runs
            if not verify:
                break
            with stage("verify"):
                _verify(model, inputs, tm, precision, eager, calibration, judge)
            v = tm.report.verification
            v.calibration = calibration.note
            v.fallbacks = list(fallbacks)
            if v.passed or not fallback_on_mismatch or v.divergence is None:
                break
            d = v.divergence
            new = [s for s in dict.fromkeys(d.sources or [d.replaces]) if s not in deny]
            if not new:  # cannot happen while sources are tracked; never loop on it
                v.message += f"; fallback stopped: {d.node} diverges again with its nodes already denied"
                break
            rel = f", max rel err {d.max_rel:.3g}" if d.max_rel is not None else ""
            reason = f"returned to PyTorch: verification mismatch (max abs err {d.max_abs:.3g}{rel})"
            fallbacks.append({"node": d.node, "op": d.op, "reason": reason, "nodes": new})
            deny.update({s: reason for s in new})
    tm.report.capture_notes[:0] = adapt_notes
    weights.track(tm.gm, user_model)  # weights replaced later, on the model or on tm, are followed by name
    if tm.report.capture != "torch.fx.symbolic_trace":  # that capture traced a private copy: nothing is shared
        tm._share(user_model, model, translate)
    if isa:
        from .report.isa import collect

        tm.report.kernels = collect(tm.gm, arch)
    if strict:
        bad = [f"{r.node} ({r.op}): {r.detail}" for r in tm.report.rows
               if r.where in ("pytorch", "flydsl-reference") and not r.layout]
        if bad:
            raise StrictError("strict=True, but these ops do not run as FlyDSL kernels:\n  " + "\n  ".join(bad))
    return tm


def _waited(out):
    """`out` with each functional collective's result waited (`AsyncCollectiveTensor.wait()`): one never read
    (translate(verify=False) does not read eager's output) is reported by torch when the process ends."""
    funcol = sys.modules.get("torch.distributed._functional_collectives")  # not imported: no collective ran
    if funcol is None:
        return out
    return pytree.tree_map_only(funcol.AsyncCollectiveTensor, lambda t: t.wait(), out)


def _fresh(inputs) -> tuple:
    """Private copies of the example inputs for one internal run: a model that writes an input in
    place (`x.mul_(2)`) must change neither the user's tensors nor what the next run is given."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            c = x.detach().clone()
            x = c.requires_grad_() if x.requires_grad else c
        out.append(x)
    return tuple(out)


def _eager(model, inputs):
    """The model's eager output on the example inputs, its buffers left as they were."""
    try:
        with torch.no_grad(), preserved(model):
            return _waited(model(*inputs))
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"the model failed on the example inputs in eager PyTorch, before any translation: "
                         f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''} "
                         f"— fix the model or the inputs so that model(*inputs) runs") from e


def _translate_once(model, inputs, arch, backend, precision, deny, name, dynamic_shapes) -> TranslatedModule:
    with stage("capture"):
        cap = capture(model, inputs, dynamic_shapes)
    flat_inputs = pytree.tree_leaves(inputs)

    def lower(cap):
        ctx = LowerCtx(gm=cap.gm, arch=arch, precision=precision, deny=dict(deny))
        with stage("passes"), preserved(cap.gm), track(cap.gm, flat_inputs) as tracking:  # captured nodes, costs, provenance
            return ctx, run_pipeline(ctx), tracking

    cap, (ctx, pass_counts, tracking) = lower_with_retry(model, inputs, cap, lower)  # static shapes if dynamic fail
    gm = cap.gm
    used = {n.meta["flydsl"]["family"] for n in gm.graph.nodes if "flydsl" in n.meta}
    chosen, why = choose_backend(backend, used)
    report = Report(model=name or type(model).__name__, arch=arch, backend=chosen, backend_reason=why,
                    precision=precision, capture=cap.method, capture_notes=cap.notes, counters=dict(ctx.counters),
                    pass_counts=pass_counts, dynamic_dims=cap.dynamic_dims)
    report.rows, report.ops = tracking.rows(gm, ctx.reasons, chosen, FAMILIES)
    return TranslatedModule(gm, chosen, arch, report, input_spec(gm))


def _verify(model, inputs, tm: TranslatedModule, precision, eager, calibration, judge=None):
    with torch.no_grad(), preserved(tm):
        try:
            got = tm(*_fresh(inputs))
        except Exception as e:  # a kernel failing at run time is a verification failure, with its cause
            from .verify import Verification

            tm.report.verification = Verification(True, False, message=f"translated model raised {type(e).__name__}: {e}")
            if judge is not None:
                tm.report.verification.truth = judge.label
            return
    if judge is not None and judge.outputs is not None:  # an .onnx file: ONNX Runtime's outputs are the truth
        from .adapters.onnx_truth import with_truth

        v = verify_outputs(judge.outputs, got, precision, with_truth(judge, calibration, precision))
    else:
        v = verify_outputs(eager, got, precision, calibration)
    if not v.passed:
        try:
            ref = capture(model, _fresh(inputs), None).gm
            with preserved(ref, tm):
                v.divergence = first_divergence(ref, tm.gm, pytree.tree_leaves(_fresh(inputs)),
                                                lambda: runtime.use_backend(tm.backend, tm.arch), precision,
                                                calibration)
        except Exception as e:  # noqa: BLE001 — localization is best effort; the mismatch itself stands
            v.message += f" (could not localize the divergence: {type(e).__name__}: {e})"
    if judge is not None:
        from .adapters.onnx_truth import annotate

        annotate(v, judge, model, _fresh(inputs), eager, precision)
    tm.report.verification = v


__all__ = ["translate", "TranslatedModule"]


def fp8_report(model, tm, inputs):
    """translator.accuracy's whole report for a translated model `tm` of `model` on `inputs` (precision
    "fp8"): the output rule, and the layer rule on every fp8 GEMM."""
    from . import accuracy
    from .adapters import hf

    model, _ = hf.adapt(model)  # as translate captured it (HF: use_cache off)
    with torch.no_grad():
        eager = model(*inputs)
        got = tm(*inputs)
    rep = accuracy.accuracy(eager, got)
    ref = capture(model, inputs, "auto" if tm.report.dynamic_dims else None).gm  # tm's node names (anchors)
    layers = accuracy.layer_errors(ref, tm.gm, pytree.tree_leaves(inputs), lambda: runtime.use_backend(tm.backend, tm.arch))
    bad = [(r.node, r.rel_rms) for r in layers if r.family in accuracy.FP8_GEMMS and r.rel_rms > accuracy.LAYER_REL_RMS_MAX]
    rep.layers = [(r.node, r.family, r.name, r.rel_rms) for r in sorted(layers, key=lambda r: -r.rel_rms)]
    if bad:
        rep.passed = False
        rep.message += f"; layer rule ({accuracy.LAYER_RULE}) failed: " + ", ".join(f"{n} {e:.3g}" for n, e in bad[:5])
    return rep
