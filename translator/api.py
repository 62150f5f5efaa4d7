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

State: the translated module shares the user's model's weights, like torch.compile's
OptimizedModule (translator.state, translator.weights): `tm.state_dict()` is the model's state
dict (its keys, order and tensors, as `model.state_dict()` gives them), except that a buffer the
graph writes (a step counter, running statistics) comes from the translated module's own copy;
`tm.load_state_dict(sd)` loads into the model (strict or not, `assign` as torch's), into those
own copies, and the next forward rebuilds the prepared weights (preshuffled GEMM weights, folded
shape regions) from the new values. So loading into `tm` changes the user's model too, as loading
into an OptimizedModule does: that is what sharing means. A graph captured by
torch.fx.symbolic_trace (from a private copy of the model) and a module loaded by translator.load
share nothing: their state dict is the graph module's own (keys `gm.*`).

fallback_on_mismatch returns the diverging FlyDSL node to PyTorch, all of it (every
captured node it absorbed, a GEMM's fused epilogue included), and translates again; each
round adds at least one captured node to the denied set, so the loop ends.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import torch
import torch.utils._pytree as pytree

from . import runtime
from .capture import capture, check_inputs, check_model, lower_with_retry
from .errors import DeviceError, DtypeError, GradError, InputError, ShapeError, StrictError
from .progress import stage
from .graph import PRECISIONS, LowerCtx, static_int
from .passes import run_pipeline
from .registry import FAMILIES
from .runtime import fastpath
from .runtime.precompile import precompile
from .report import Report
from .report.rows import is_flydsl, track
from .state import preserved, rebind, refresh_prepared, tensor_at, written_targets
from .verify import calibrate, first_divergence, verify_outputs
from . import weights

_TRANSLATE_LOCK = threading.RLock()


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
        self._input_dtypes = [n.meta["val"].dtype if isinstance(n.meta.get("val"), torch.Tensor) else None
                              for n in gm.graph.nodes if n.op == "placeholder"]
        self.last_launches: list = []  # the launch records of the last call (flysim: LaunchRecord)
        self.last_calls: list = []  # runtime.ops.OpCall per FlyDSL op call of the last call, node set
        self.last_generated_kernels: set = set()
        # the FlyDSL nodes in call order, named as the report knows them (a loaded graph may rename nodes)
        names = [n.name for n in gm.graph.nodes if is_flydsl(n)]
        self._flydsl_nodes = list(report.ops) if len(report.ops) == len(names) else names
        self.fast_path = True  # run FlyDSL nodes without the custom-op layers (runtime.fastpath); same results
        self.training = False  # an eval-mode forward (see train())

    def _apply(self, fn, recurse=True):
        """`.to()`, `.float()`...: applied to the whole model whose weights this module shares (as an
        OptimizedModule's `.to()` moves its model), so the model never ends up half converted (before:
        only the weights the graph reads directly). The next forward looks at every weight
        (translator.weights): new objects (overwrite_module_params_on_conversion) are resolved by name,
        and a dtype or device other than the translation's is a clear error until converted back."""
        model = self.__dict__.get("_model")
        if model is not None:
            model._apply(fn, recurse)
        out = super()._apply(fn, recurse)
        weights.changed(self.gm)
        return out

    def refresh_weights(self) -> int:
        """Re-read every weight of the model and rebuild the prepared copies (preshuffled GEMM weights...)
        from it: after writes that no version counter sees (`p.data.copy_(w)`, a write through `.data`).
        Returns how many prepared copies were rebuilt. Other changes are seen by the next forward."""
        weights.follow(self.gm, force=True)
        return refresh_prepared(self.gm, force=True)

    def requires_grad_(self, requires_grad: bool = True):
        """On the whole shared model too (before: only the weights the graph reads directly). The
        translated forward has no backward; without grad on its weights it takes the fast path
        outside torch.no_grad() as well (runtime.fastpath.usable)."""
        model = self.__dict__.get("_model")
        if model is not None:
            model.requires_grad_(requires_grad)
        return super().requires_grad_(requires_grad)

    def train(self, mode: bool = True):
        """`tm.eval()` sets the flag (the translation is an eval-mode forward already; torch.export's
        graph module itself refuses train() and eval() with NotImplementedError); `tm.train()` is
        refused with the fix. The model's own mode is never changed."""
        if mode:
            raise InputError(
                "a translated module computes the eval-mode forward it was translated for (dropout off, batch "
                "norm on its running statistics) and has no backward: train the original model (the translated "
                "module shares its weights and follows their updates) and call the translated module for inference")
        self.training = False
        return self

    def _share(self, model: torch.nn.Module, captured: torch.nn.Module) -> None:
        """Make `model` (the user's) the owner of this module's state (the module docstring's State).
        `captured` is the module torch.export captured (model itself, or the HF adapter around it)."""
        names: dict = {}
        for name, t in _named_tensors(model):
            names.setdefault(id(t), []).append(name)
        in_captured = dict(_named_tensors(captured))
        d = self.__dict__  # plain attributes: the model is no submodule (its weights would be listed twice)
        d["_model"] = model
        d["_owned"] = [(key, target) for target in written_targets(self.gm)
                       for key in names.get(id(in_captured.get(target)), ())]
        self.register_load_state_dict_post_hook(_drop_graph_keys)

    def specialize(self, *example_inputs, dynamic_shapes=None, **options) -> "TranslatedModule":
        """A translation of the same model for other input shapes (a decode step beside a prefill
        translated with fixed shapes) that writes THIS module's state: each buffer its graph writes is
        this module's one copy (docs/state.md). Options default to this translation's arch and backend."""
        model = self.__dict__.get("_model")
        if model is None:
            raise InputError("this translated module holds no model to translate again (it was loaded by "
                             "translator.load or captured from a private copy): translate the model itself")
        options = {"arch": self.arch, "backend": self.backend, **options}
        other = translate(model, example_inputs, dynamic_shapes=dynamic_shapes, **options)
        mine = set(written_targets(self.gm))
        for target in written_targets(other.gm):
            if target in mine:
                rebind(other, tensor_at(other.gm, target), tensor_at(self.gm, target))
        return other

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The model's state dict (see the module docstring's State): its keys, order and tensors,
        a buffer the graph writes taken from this module's own copy."""
        model = self.__dict__.get("_model")
        if model is None:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        out = model.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        prefix = args[1] if len(args) > 1 else prefix  # torch's deprecated positional form
        for key, target in self._owned:
            if prefix + key in out:
                own = tensor_at(self.gm, target)
                out[prefix + key] = own if keep_vars else own.detach()
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """`load_state_dict` (also as a submodule of a larger model): into the model, and into this
        module's own copies of the buffers the graph writes (copied, never aliased, with assign=True
        too: the model's buffer and the translated module's stay separate)."""
        model = self.__dict__.get("_model")
        if model is None:
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        self.__dict__["_load_prefix"] = prefix  # for _drop_graph_keys, which torch calls without it
        sd = _under(state_dict, prefix)
        try:
            got = model.load_state_dict(sd, strict=False, assign=local_metadata.get("assign_to_params_buffers", False))
        except RuntimeError as e:  # size mismatches: torch's own lines, under this module's prefix
            error_msgs.extend(line.strip() for line in str(e).splitlines()[1:] if line.strip())
            return
        missing_keys.extend(prefix + k for k in got.missing_keys)
        unexpected_keys.extend(prefix + k for k in got.unexpected_keys)
        if strict and any(k.startswith("gm.") for k in got.unexpected_keys):
            error_msgs.append("keys under 'gm.' name the translated graph's own tensors (tm.gm.state_dict(), or a "
                              "translated module's state dict from before it gave the model's keys); load a state "
                              "dict with the model's keys, as model.state_dict() and tm.state_dict() give them")
        with torch.no_grad():
            for key, target in self._owned:
                own, new = tensor_at(self.gm, target), sd.get(key)
                if isinstance(new, torch.Tensor) and new.shape == own.shape:
                    own.copy_(new)

    @property
    def code(self) -> str:
        return self.gm.code

    def forward(self, *args):
        self._check(args)
        if torch.is_grad_enabled() and any(type(a) is torch.Tensor and a.requires_grad for a in args):
            raise GradError("a translated model is for inference: its FlyDSL ops have no backward, and an input "
                            "requires grad; call it under torch.no_grad() or torch.inference_mode() (or pass "
                            "x.detach()), and train the original model")
        from translator_kernels.codegen.emit import record_kernels

        # no autograd graph: nothing could run backward through the FlyDSL ops (traced by torch.export
        # or dynamo, the graph keeps its ops at top level instead of under a set_grad_enabled region)
        no_grad = contextlib.nullcontext() if torch.compiler.is_compiling() else torch.no_grad()
        held = False
        try:  # the lock is re-entrant: held here too, the last_* attributes describe one whole call;
            # acquired in one line and released in `finally`, as in runtime.use_backend (a Ctrl-C on a
            # `with lock:` line can skip its __exit__)
            held = runtime.EXECUTION_LOCK.acquire() if self.backend != "reference" else False
            with no_grad, runtime.use_backend(self.backend, self.arch) as st, record_kernels() as used:
                out = self._run(args)
            d = self.__dict__  # plain attributes: nn.Module.__setattr__'s parameter checks cost ~3 us each
            d["last_launches"] = list(st.launches)
            d["last_generated_kernels"] = used  # generated kernels this call ran (for --emit-kernels)
            if len(st.calls) == len(self._flydsl_nodes):  # the graph calls its FlyDSL ops once each, in order
                for c, node in zip(st.calls, self._flydsl_nodes):
                    c.node = node
                seen = (self.report, [c.launches for c in st.calls])
                if seen != d.get("_observed"):  # replayed plans append the very same records: nothing new
                    self.report.observe(st.calls)
                    d["_observed"] = seen
            d["last_calls"] = st.calls
        finally:
            if held:
                runtime.EXECUTION_LOCK.release()
        return out

    def _run(self, args):
        weights.follow(self.gm)  # parameter objects replaced after translate(), found by name
        refresh_prepared(self.gm)  # prepared weights follow parameter updates made after translate()
        fast = self.fast_path and fastpath.usable(self.gm, args)
        try:
            return fastpath.fast_forward(self.gm)(self.gm, *args) if fast else self.gm(*args)
        except AssertionError as e:  # torch.export's input guards: a limit the model itself sets
            if not str(e).startswith("Guard failed"):
                raise
            raise ShapeError(
                f"the inputs break a limit the model sets on its shapes ({str(e).removeprefix('Guard failed: ')}, "
                "named by forward's arguments; e.g. a sequence longer than a position table or mask buffer): "
                "call it within that limit, or enlarge that buffer in the model and translate again") from e

    def _check(self, args):
        """The inputs' count, dtypes, devices and static sizes; once per input signature (a
        signature that passed is remembered: ~1 us instead of the checks)."""
        if type(args[0] if args else None) is torch.Tensor:
            key = tuple((a.dtype, a.shape, a.device) if type(a) is torch.Tensor else type(a) for a in args)
            passed = self.__dict__.setdefault("_passed_inputs", set())
            if key not in passed:
                self._check_inputs(args)
                if len(passed) >= 256:
                    passed.clear()
                passed.add(key)
            return
        self._check_inputs(args)

    def _check_inputs(self, args):
        if len(args) != len(self._input_spec):
            raise ShapeError(f"the translated model takes {len(self._input_spec)} inputs, got {len(args)}")
        for i, (a, spec) in enumerate(zip(args, self._input_spec)):
            if spec is None:
                continue
            if not isinstance(a, torch.Tensor):
                raise ShapeError(f"input {i} must be a tensor, got {type(a).__name__}")
            want = self._input_dtypes[i] if i < len(self._input_dtypes) else None
            if want is not None and a.dtype != want:
                again = f", or translate again with {str(a.dtype)[6:]} example inputs" if a.is_floating_point() else ""
                raise DtypeError(
                    f"input {i} is {str(a.dtype)[6:]}, but this model was translated for {str(want)[6:]} inputs "
                    f"(its FlyDSL kernels are specialized per dtype): call it with x.to(torch.{str(want)[6:]}){again}")
            if a.device.type == "meta":
                raise DeviceError(f"input {i} is on the meta device (it has no data to compute on): "
                                 "call the translated model with real tensors")
            if a.dim() != len(spec):
                raise ShapeError(f"input {i} has {a.dim()} dims, the model was translated for {len(spec)}")
            for d, size in enumerate(spec):
                if size is not None and a.shape[d] != size:
                    raise ShapeError(
                        f"input {i} dim {d} is {a.shape[d]}, but this translation serves only {size} there "
                        f"(torch.export specialized that dim while capturing); translate again with an example "
                        f"input of the size you need")


def _named_tensors(module):
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def _under(state_dict, prefix: str):
    """The entries of `state_dict` under `prefix`, without it (its version metadata too)."""
    from collections import OrderedDict

    out = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items() if k.startswith(prefix))
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        root = prefix[:-1]
        out._metadata = type(meta)(("" if k == root else k[len(prefix):], v) for k, v in meta.items()
                                   if not prefix or k == root or k.startswith(prefix))
    return out


def _drop_graph_keys(tm, incompatible) -> None:
    """torch's load also walks tm's graph module, which gets no keys (the model's are loaded in
    TranslatedModule._load_from_state_dict): its tensors are no missing keys."""
    graph = tm.__dict__.get("_load_prefix", "") + "gm."
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not k.startswith(graph)]


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
    precision: fp32 keeps the model's dtypes; bf16 / fp16 run fp32 FlyDSL ops in that dtype.
    strict: raise StrictError if any compute op stays in PyTorch or runs only as a reference.
    fallback_on_mismatch: return each diverging FlyDSL node to PyTorch and re-verify.
    dynamic_shapes: "auto" (batch and sequence dims dynamic where the model allows), None (every
    dim fixed to the examples), or a torch.export dynamic_shapes spec.
    isa: compile each distinct FlyDSL kernel specialization for `arch` (no GPU needed; seconds
    per kernel, cached in-process) and put its ISA statistics in `report.kernels`.
    """
    with _TRANSLATE_LOCK:
        return _translate(model, example_inputs, arch=arch, backend=backend, precision=precision, verify=verify,
                          strict=strict, fallback_on_mismatch=fallback_on_mismatch, dynamic_shapes=dynamic_shapes,
                          name=name, isa=isa)


def _translate(model, example_inputs, *, arch, backend, precision, verify, strict, fallback_on_mismatch,
               dynamic_shapes, name, isa) -> TranslatedModule:
    from .adapters import hf, onnx_import

    if onnx_import.is_onnx_path(model):  # an .onnx file: imported as an nn.Module
        model, example_inputs = onnx_import.import_onnx(model, example_inputs)
    name = name or getattr(model, "onnx_name", None) or type(model).__name__
    user_model = model
    model, adapt_notes = hf.adapt(model)  # HF models: use_cache off, attention implementation checked
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
        calibration, cal_note = calibrate(model, _fresh(inputs), eager, precision) if verify else (None, "")
        while True:
            tm = _translate_once(model, _fresh(inputs), arch, backend, precision, deny, name, dynamic_shapes)
            precompile(tm)  # every kernel specialization of the example shapes, before anything runs
            if not verify:
                break
            with stage("verify"):
                _verify(model, inputs, tm, precision, eager, calibration)
            v = tm.report.verification
            v.calibration = cal_note
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
        tm._share(user_model, model)
    if isa:
        from .report.isa import collect

        tm.report.kernels = collect(tm.gm, arch)
    if strict:
        bad = [f"{r.node} ({r.op}): {r.detail}" for r in tm.report.rows
               if r.where in ("pytorch", "flydsl-reference") and not r.layout]
        if bad:
            raise StrictError("strict=True, but these ops do not run as FlyDSL kernels:\n  " + "\n  ".join(bad))
    return tm


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
            return model(*inputs)
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
    return TranslatedModule(gm, chosen, arch, report, _input_spec(gm))


def _verify(model, inputs, tm: TranslatedModule, precision, eager, calibration):
    with torch.no_grad(), preserved(tm):
        try:
            got = tm(*_fresh(inputs))
        except Exception as e:  # a kernel failing at run time is a verification failure, with its cause
            from .verify import Verification

            tm.report.verification = Verification(True, False, message=f"translated model raised {type(e).__name__}: {e}")
            return
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
    tm.report.verification = v


__all__ = ["translate", "TranslatedModule"]
