"""translate(): capture -> passes -> choose backend -> verify -> report.

The user's model and inputs are never modified: a model in training mode is captured in
eval mode and its modes are restored afterwards.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree

from . import runtime
from .capture import capture, check_inputs
from .frontends.progress import stage
from .errors import InputError, ShapeError, StrictError, VerificationError
from .lowerings._common import PRECISIONS, LowerCtx, static_int
from .passes import run_pipeline
from .registry import FAMILIES, load_all
from .report import Report
from .report.rows import is_flydsl, track
from .verify import first_divergence, verify_outputs


class TranslatedModule(torch.nn.Module):
    """A translated model: a torch.fx.GraphModule whose hot ops are `torch.ops.flydsl.*`.

    Calling it runs the graph with the FlyDSL ops on `self.backend` (rocm | flysim |
    reference); `.report` says what runs where; `.code` is the graph as readable Python.
    """

    def __init__(self, gm, backend: str, arch: str, report: Report, input_spec):
        super().__init__()
        self.gm = gm
        self.backend = backend
        self.arch = arch
        self.report = report
        self._input_spec = input_spec  # per input: None, or [(dim, static size or None)]
        self.last_launches: list = []  # the launch records of the last call (flysim: LaunchRecord)
        self.last_calls: list = []  # runtime.ops.OpCall per FlyDSL op call of the last call, node set
        self.last_generated_kernels: set = set()
        # the FlyDSL nodes in call order, named as the report knows them (a loaded graph may rename nodes)
        names = [n.name for n in gm.graph.nodes if is_flydsl(n)]
        self._flydsl_nodes = list(report.ops) if len(report.ops) == len(names) else names

    @property
    def code(self) -> str:
        return self.gm.code

    def forward(self, *args):
        self._check(args)
        from translator_kernels.generated.emit import record_kernels

        with runtime.use_backend(self.backend, self.arch) as st, record_kernels() as used:
            out = self.gm(*args)
        self.last_launches = list(st.launches)
        self.last_generated_kernels = used  # generated kernels this call ran (for --emit-kernels)
        if len(st.calls) == len(self._flydsl_nodes):  # the graph calls its FlyDSL ops once each, in order
            for c, node in zip(st.calls, self._flydsl_nodes):
                c.node = node
            self.report.observe(st.calls)
        self.last_calls = st.calls
        return out

    def _check(self, args):
        if len(args) != len(self._input_spec):
            raise ShapeError(f"the translated model takes {len(self._input_spec)} inputs, got {len(args)}")
        for i, (a, spec) in enumerate(zip(args, self._input_spec)):
            if spec is None:
                continue
            if not isinstance(a, torch.Tensor):
                raise ShapeError(f"input {i} must be a tensor, got {type(a).__name__}")
            if a.dim() != len(spec):
                raise ShapeError(f"input {i} has {a.dim()} dims, the model was translated for {len(spec)}")
            for d, size in enumerate(spec):
                if size is not None and a.shape[d] != size:
                    raise ShapeError(
                        f"input {i} dim {d} is {a.shape[d]}, but this translation serves only {size} there "
                        f"(torch.export specialized that dim while capturing); translate again with an example "
                        f"input of the size you need")


def _input_spec(gm):
    spec = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        spec.append([static_int(s) for s in v.shape] if isinstance(v, torch.Tensor) else None)
    return spec


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
    missing = sorted(f for f in families_used if not FAMILIES[f].kernel_available())
    why = runtime.flysim_available()
    if not missing and not why and families_used:
        return "flysim", "auto: no ROCm GPU; every FlyDSL op in this model has a kernel, run by flysim"
    if not families_used:
        return "reference", "auto: nothing was lowered to a FlyDSL op"
    if missing:
        return "reference", f"auto: no ROCm GPU, and no kernel has landed yet for {', '.join(missing)}"
    return "reference", f"auto: no ROCm GPU, and {why}"


def translate(model, example_inputs, *, arch: str = "gfx942", backend: str = "auto", precision: str = "fp32",
              verify: bool = True, strict: bool = False, fallback_on_mismatch: bool = False,
              dynamic_shapes="auto", name: str | None = None, isa: bool = False) -> TranslatedModule:
    """Translate `model` so its hot ops run as FlyDSL ops; verify against eager; report.

    model: an nn.Module (HuggingFace models included) or the path of an .onnx file
    (example_inputs may then be None: inputs are made from the file's input types).

    arch: gfx942 (MI300X) | gfx950 (MI350X/MI355X). backend: auto | rocm | flysim | reference.
    precision: fp32 keeps the model's dtypes; bf16 / fp16 run fp32 FlyDSL ops in that dtype.
    strict: raise StrictError if any compute op stays in PyTorch or runs only as a reference.
    fallback_on_mismatch: return each diverging FlyDSL node to PyTorch and re-verify.
    dynamic_shapes: "auto" (batch and sequence dims dynamic where the model allows), None (every
    dim fixed to the examples), or a torch.export dynamic_shapes spec.
    isa: compile each distinct FlyDSL kernel specialization for `arch` (no GPU needed; seconds
    per kernel, cached in-process) and put its ISA statistics in `report.kernels`.
    """
    from .frontends import hf, onnx_import

    if onnx_import.is_onnx_path(model):  # an .onnx file: imported as an nn.Module
        model, example_inputs = onnx_import.import_onnx(model, example_inputs)
    name = name or getattr(model, "onnx_name", None) or type(model).__name__
    model, adapt_notes = hf.adapt(model)  # HF models: use_cache off, attention implementation checked
    _validate(model, arch, backend, precision)
    inputs = check_inputs(example_inputs)
    load_all()
    deny: dict = {}
    fallbacks: list = []
    with _eval_mode(model):
        try:
            with torch.no_grad():
                model(*inputs)
        except Exception as e:
            raise InputError(f"the model failed on the example inputs in eager PyTorch, before any translation: "
                             f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''} "
                             f"— fix the model or the inputs so that model(*inputs) runs") from e
        while True:
            tm = _translate_once(model, inputs, arch, backend, precision, deny, name, dynamic_shapes)
            if not verify:
                break
            with stage("verify"):
                _verify(model, inputs, tm, precision)
            v = tm.report.verification
            v.fallbacks = list(fallbacks)
            if v.passed or not fallback_on_mismatch or v.divergence is None:
                break
            d = v.divergence
            reason = (f"returned to PyTorch: verification mismatch (max abs err {d.max_abs:.3g}, "
                      f"max rel err {d.max_rel:.3g})")
            fallbacks.append({"node": d.node, "op": d.op, "reason": reason})
            deny[d.replaces] = reason
    tm.report.capture_notes[:0] = adapt_notes
    if isa:
        from .report.isa import collect

        tm.report.kernels = collect(tm.gm, arch)
    if strict:
        bad = [f"{r.node} ({r.op}): {r.detail}" for r in tm.report.rows
               if r.where in ("pytorch", "flydsl-reference") and not r.layout]
        if bad:
            raise StrictError("strict=True, but these ops do not run as FlyDSL kernels:\n  " + "\n  ".join(bad))
    return tm


def _translate_once(model, inputs, arch, backend, precision, deny, name, dynamic_shapes) -> TranslatedModule:
    with stage("capture"):
        cap = capture(model, inputs, dynamic_shapes)
    gm = cap.gm
    flat_inputs = pytree.tree_leaves(inputs)
    ctx = LowerCtx(gm=gm, arch=arch, precision=precision, deny=dict(deny))
    with stage("passes"), track(gm, flat_inputs) as tracking:  # captured nodes, costs, provenance through passes
        pass_counts = run_pipeline(ctx)
    used = {n.meta["flydsl"]["family"] for n in gm.graph.nodes if "flydsl" in n.meta}
    chosen, why = choose_backend(backend, used)
    report = Report(model=name or type(model).__name__, arch=arch, backend=chosen, backend_reason=why,
                    precision=precision, capture=cap.method, capture_notes=cap.notes, counters=dict(ctx.counters),
                    pass_counts=pass_counts, dynamic_dims=cap.dynamic_dims)
    report.rows, report.ops = tracking.rows(gm, ctx.reasons, chosen, FAMILIES)
    return TranslatedModule(gm, chosen, arch, report, _input_spec(gm))


def _verify(model, inputs, tm: TranslatedModule, precision):
    with torch.no_grad():
        eager = model(*inputs)
        try:
            got = tm(*inputs)
        except Exception as e:  # a kernel failing at run time is a verification failure, with its cause
            from .verify import Verification

            tm.report.verification = Verification(True, False, message=f"translated model raised {type(e).__name__}: {e}")
            return
    v = verify_outputs(eager, got, precision)
    if not v.passed:
        try:
            ref = capture(model, inputs, None).gm
            v.divergence = first_divergence(ref, tm.gm, pytree.tree_leaves(inputs),
                                            lambda: runtime.use_backend(tm.backend, tm.arch))
        except Exception as e:  # noqa: BLE001 — localization is best effort; the mismatch itself stands
            v.message += f" (could not localize the divergence: {type(e).__name__}: {e})"
    tm.report.verification = v


__all__ = ["translate", "TranslatedModule", "VerificationError"]
