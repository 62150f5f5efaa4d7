"""Verification: eager PyTorch vs the translated module, every output (each pytree leaf).

Each output is held to a `translator.tolerances.Bound` that scales with the output (an
elementwise check with atol relative to the output's RMS, and an RMS-relative check); in
fp32 the bound is grounded in eager's own error, measured once per translate() by running
a float64 copy of the model on the same inputs (`calibrate`). Integer and bool outputs
must match exactly; a wrong second output fails as a wrong first one does.

On a mismatch both graphs run node by node (the freshly captured graph in eager torch,
the translated graph on its backend) and the first FlyDSL node whose output diverges from
the captured node(s) it replaced is named, with shapes, dtypes, errors and the worst
index. Ops that return lists (fused_elementwise, fused_reduce, add_*_norm) are compared
output by output: each `getitem` of such a node stands for the captured node whose uses it
took (`meta["replaces"]`, or the `anchor` of its own `meta["flydsl"]`, set by the lowering).

"max rel err" is reported only over elements where a relative error means something
(|eager| above the bound's atol); elsewhere it is None, never a division by ~0.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from .tolerances import Bound, low_precision, model_bound, op_tolerance, rms, truth_bound


@dataclass
class OutputCheck:
    index: int
    shape: list
    dtype: str
    max_abs: float
    max_rel: float | None
    atol: float
    rtol: float
    passed: bool
    rms_rel: float = 0.0  # RMS(error) / RMS(eager)
    rms_bound: float = 0.0  # allowed RMS(error) / RMS(eager) (RMS(error) / RMS(truth) when judged against the truth)
    bound: str = ""  # where the bound comes from (table, fp64 calibration, or the truth)
    nonfinite: int = 0  # NaN / inf outputs where eager (or the truth) is finite
    # against the truth (a more exact run of the model; None where there was none): eager's error and the translation's
    eager_max: float | None = None  # max |eager - truth|
    eager_rms_rel: float | None = None  # RMS(eager - truth) / RMS(truth)
    truth_max: float | None = None  # max |translated - truth|
    truth_rms_rel: float | None = None  # RMS(translated - truth) / RMS(truth)


@dataclass
class Divergence:
    node: str  # translated node
    op: str  # flydsl.<family>
    replaces: str  # captured node it replaced (the one whose value diverges)
    shape: list
    dtype: str
    max_abs: float
    max_rel: float | None
    worst_index: list
    expected: float
    got: float
    sources: list = field(default_factory=list)  # every captured node the FlyDSL node absorbed
    rms_rel: float = 0.0
    nonfinite: int = 0  # NaN / inf where the captured node's value is finite
    truth_rms_rel: float | None = None  # low precision: RMS rel err against the fp32 truth ...
    eager_rms_rel: float | None = None  # ... and the captured node's own

    def describe(self) -> str:
        rel = f", max rel err {self.max_rel:.3g}" if self.max_rel is not None else ""
        bad = f"{self.nonfinite} NaN/inf values where eager is finite, " if self.nonfinite else ""
        truth = (f"; against the fp32 truth RMS rel err {self.truth_rms_rel:.3g} (eager's {self.eager_rms_rel:.3g})"
                 if self.truth_rms_rel is not None else "")
        return (f"first diverging FlyDSL node: {self.node} ({self.op}, replaces {self.replaces}) "
                f"shape {self.shape} {self.dtype}: {bad}max abs err {self.max_abs:.3g}{rel}, RMS rel err "
                f"{self.rms_rel:.3g} at index {self.worst_index} (expected {self.expected:.6g}, got {self.got:.6g}){truth}")


@dataclass
class Verification:
    ran: bool
    passed: bool | None
    outputs: list = field(default_factory=list)
    message: str = ""
    divergence: Divergence | None = None
    fallbacks: list = field(default_factory=list)  # [{"node", "op", "reason"}]
    calibration: str = ""  # how the fp32 bound was grounded (eager fp32 vs fp64), or why it was not
    truth: str = "eager PyTorch"  # what the outputs were judged against (an .onnx file: ONNX Runtime)

    @property
    def status(self) -> str:
        """"not run", "PASSED" or "FAILED" (the report's headline and HTML page say it)."""
        return "not run" if not self.ran else ("PASSED" if self.passed else "FAILED")

    def to_dict(self):
        return asdict(self)


_CHUNK = 1 << 18  # elements compared at a time: the comparison's float64 temporaries stay a few MB, whatever
# the output's size (all at once, comparing 8 MB of LLM logits took 213 MB)


def compare(expected: torch.Tensor, got: torch.Tensor, bound: Bound):
    """Errors of `got` against `expected` and whether they meet `bound`; None on a shape mismatch.
    Computed chunk by chunk in float64 (`_CHUNK` elements at a time)."""
    if tuple(expected.shape) != tuple(got.shape):
        return None
    if expected.numel() == 0:
        return dict(max_abs=0.0, max_rel=None, rms_rel=0.0, worst_index=[], expected=0.0, got=0.0, passed=True,
                    nonfinite=0, nan=0)
    ef, gf = expected.detach().reshape(-1), got.detach().reshape(-1)
    ok, err_sq, e_sq, e_count, wrong_n, nan_n = True, 0.0, 0.0, 0, 0, 0
    worst, idx, max_rel = -1.0, 0, None
    for start in range(0, ef.numel(), _CHUNK):
        e, g = ef[start:start + _CHUNK].double(), gf[start:start + _CHUNK].double()
        fe = torch.isfinite(e)
        finite = fe & torch.isfinite(g)
        same_nonfinite = ~finite & ((e == g) | (e.isnan() & g.isnan()))
        diff = torch.where(finite, (e - g).abs(), torch.where(same_nonfinite, 0.0, float("inf")))
        if bound.exact:
            ok = ok and bool((diff == 0).all())
        else:
            ok = ok and bool((diff <= bound.atol + bound.rtol * e.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)).all())
        err_sq += float(torch.where(finite, e - g, 0.0).square().sum())
        e_sq += float(e[fe].square().sum())
        e_count += int(fe.sum())
        meaningful = finite & (e.abs() > max(bound.atol, 1e-30))
        if bool(meaningful.any()):
            r = float((diff / e.abs())[meaningful].max())
            max_rel = r if max_rel is None else max(max_rel, r)
        i = int(diff.argmax())
        if float(diff[i]) > worst:  # strictly: the first worst element, as one argmax over all would give
            worst, idx = float(diff[i]), start + i
        wrong = ~finite & ~same_nonfinite & fe  # NaN / inf where eager is finite
        wrong_n += int(wrong.sum())
        nan_n += int((wrong & g.isnan()).sum())
    err_rms = (err_sq / ef.numel()) ** 0.5
    scale = (e_sq / e_count) ** 0.5 if e_count else 0.0
    if not bound.exact:
        ok = ok and err_rms <= bound.rms
    return {
        "nonfinite": wrong_n,
        "nan": nan_n,
        "max_abs": worst,
        "max_rel": max_rel,
        "rms_rel": err_rms / scale if scale else float(worst > 0),
        "worst_index": [int(i) for i in torch.unravel_index(torch.tensor(idx), expected.shape)] if expected.dim() else [],
        "expected": float(ef[idx]),
        "got": float(gf[idx]),
        "passed": ok,
    }


class EagerError(NamedTuple):
    """Eager's own error on one output, against the truth (a more exact run of the same model)."""

    max_abs: float  # max |eager - truth|
    rms_rel: float  # RMS(eager - truth) / RMS(truth)
    truth: torch.Tensor | None = None  # the truth's output, kept to measure the translation's error
    rms_abs: float = 0.0  # RMS(eager - truth)
    nonfinite: int = 0  # eager NaN / inf where the truth is finite


def calibrate(model: torch.nn.Module, inputs: tuple, eager_out, precision: str = "fp32") -> tuple[list | None, str]:
    """Eager's own error, per output leaf, against a more exact run of the same model on the same
    inputs (`translator.truth.run_as`: weights cast module by module, no second copy of the model):

    - fp32 outputs under precision fp32: the truth is the model in fp64;
    - any bf16 / fp16 output: the truth is the model in fp32;
    - precision bf16 / fp16 on an fp32 model: eager fp32 is the truth, and eager's own low-precision
      error is measured by running the model in that precision.

    Returns (per-leaf EagerError or None, a note for the report); (None, why) where no truth run
    could be made (the table bound then applies, and the note says why)."""
    from .graph import PRECISIONS
    from .truth import CastRunError, run_as

    exp = pytree.tree_leaves(eager_out)
    low_out = any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) for t in exp)
    lowered = precision in ("bf16", "fp16") and not low_out
    dtype = PRECISIONS[precision] if lowered else torch.float32 if low_out else torch.float64
    name = {torch.float64: "fp64", torch.float32: "fp32"}.get(dtype, precision)
    tensors = [*model.parameters(), *model.buffers(), *pytree.tree_leaves(inputs)]
    if not any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype for t in tensors):
        return None, f"no floating values to run in {name}: table bound"
    try:
        other = run_as(model, inputs, dtype)
    except CastRunError as e:  # the table bound still applies; the note says why
        return None, f"eager {name} run skipped ({e}): table bound"
    got = pytree.tree_leaves(other)
    if len(exp) != len(got):
        return None, f"eager {name} returned a different number of outputs: table bound"
    truths, runs = (exp, got) if lowered else (got, exp)
    errors = []
    for t, e in zip(truths, runs):
        if not (isinstance(t, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()
                and tuple(t.shape) == tuple(e.shape) and t.numel()):
            errors.append(None)
            continue
        err = errors_against(t, e)
        scale = rms(t)
        errors.append(EagerError(err["max_abs"], err["rms_abs"] / scale if scale else 0.0, t.detach(), err["rms_abs"],
                                 err["nonfinite"]))
    worst = max((e.rms_rel for e in errors if e), default=0.0)
    if lowered:
        return errors, f"truth: eager fp32; eager in {precision} is {worst:.3g} off it (worst RMS rel err)"
    src = "bf16/fp16" if low_out else "fp32"
    return errors, f"eager {src} vs eager {name} on the example inputs: worst RMS rel err {worst:.3g}"


class Calibration:
    """`calibrate`, run when its answer can matter. For fp32 outputs it only widens the table bound
    (tolerances.model_bound takes the larger of the two), so an output within the table bound passes
    whatever eager's own error is: the fp64 run, the most costly part of verification (a second forward at
    twice the width: 15 of 50 CPU seconds at 1.1 B parameters, and 2.3x eager's activation memory after a
    convolution), is made only when some output fails the table. A low-precision output is judged against
    the truth (the rule itself), so there the run is made at once, before the translation holds memory."""

    def __init__(self, run, eager_out, precision: str):
        self._run, self.errors, self.note, self.done = run, None, "", False
        leaves = pytree.tree_leaves(eager_out)
        if precision in ("bf16", "fp16") or any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
                                                for t in leaves):
            self.get()

    def get(self) -> list | None:
        if not self.done:
            self.errors, self.note = self._run()
            self._run, self.done = None, True
        return self.errors


def _errors(calibration):
    return calibration.get() if isinstance(calibration, Calibration) else calibration


def errors_against(truth: torch.Tensor, got: torch.Tensor) -> dict:
    """Errors of `got` against `truth` over the elements finite in both (max abs, RMS), and how many
    elements `got` has NaN / inf where the truth is finite ("nonfinite"; "nan" of them NaN). In
    float64, `_CHUNK` elements at a time."""
    tf, gf = truth.detach().reshape(-1), got.detach().reshape(-1)
    max_abs, sq, n, nonfinite, nan = 0.0, 0.0, 0, 0, 0
    for start in range(0, tf.numel(), _CHUNK):
        t, g = tf[start:start + _CHUNK].double(), gf[start:start + _CHUNK].double()
        ft, fg = torch.isfinite(t), torch.isfinite(g)
        both = ft & fg
        d = torch.where(both, t - g, 0.0)
        max_abs = max(max_abs, float(d.abs().max()))
        sq += float(d.square().sum())
        n += int(both.sum())
        nonfinite += int((ft & ~fg).sum())
        nan += int((ft & g.isnan()).sum())
    return {"max_abs": max_abs, "rms_abs": (sq / max(n, 1)) ** 0.5, "nonfinite": nonfinite, "nan": nan}


def _nonfinite_words(nan: int, total: int) -> str:
    inf = total - nan
    parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} inf"] if inf else [])
    return " and ".join(parts) + " outputs"


def _truth_check(i, e, g, cal: EagerError, lp: str) -> tuple[OutputCheck, str | None]:
    """One low-precision output judged against the truth (tolerances.truth_bound); the check and the
    failure line, or None."""
    b = truth_bound(lp, cal.truth, cal.max_abs, cal.rms_abs)
    err = errors_against(cal.truth, g)
    scale = rms(cal.truth)
    vs_eager = compare(e, g, model_bound(lp, e))  # for the errors against eager only (max rel where |eager| > atol)
    extra = err["nonfinite"] - cal.nonfinite  # NaN / inf where the truth is finite, beyond eager's own
    ok = err["max_abs"] <= b.max_abs and err["rms_abs"] <= b.rms and extra <= 0
    check = OutputCheck(i, list(e.shape), str(e.dtype).replace("torch.", ""), vs_eager["max_abs"], vs_eager["max_rel"],
                        b.max_abs, 0.0, ok, vs_eager["rms_rel"], b.rms / scale if scale else 0.0, b.why,
                        nonfinite=err["nonfinite"], eager_max=cal.max_abs, eager_rms_rel=cal.rms_rel,
                        truth_max=err["max_abs"], truth_rms_rel=err["rms_abs"] / scale if scale else 0.0)
    if ok:
        return check, None
    if extra > 0:
        return check, (f"output {i}: {_nonfinite_words(err['nan'], err['nonfinite'])} where the truth is finite "
                       f"(eager has {cal.nonfinite})")
    return check, (f"output {i}: against the truth, max abs err {err['max_abs']:.3g} (bound {b.max_abs:.3g}; eager's "
                   f"{cal.max_abs:.3g}), RMS rel err {check.truth_rms_rel:.3g} (bound {check.rms_bound:.3g}; eager's "
                   f"{cal.rms_rel:.3g}); {b.why}")


def verify_outputs(eager_out, translated_out, precision: str, calibration: list | None = None) -> Verification:
    """Every output leaf of the translation against eager's. A floating output in low precision
    (tolerances.low_precision) with a truth in `calibration` is judged against the truth
    (tolerances.truth_bound); every other one against eager with tolerances.model_bound. A `Calibration`
    not yet run is run only if some output fails the table bound without it."""
    if precision == "fp8":  # judged by the accuracy report's rule (translator.accuracy)
        from .accuracy import accuracy
        rep = accuracy(eager_out, translated_out)
        return Verification(True, rep.passed, [], rep.message)
    if isinstance(calibration, Calibration) and not calibration.done:
        v = verify_outputs(eager_out, translated_out, precision, None)
        if v.passed:
            calibration.note = ("fp64 calibration not run: every output is within the fp32 table bound, which "
                                "calibration only widens")
            return v
    calibration = _errors(calibration)
    exp, _ = pytree.tree_flatten(eager_out)
    got, _ = pytree.tree_flatten(translated_out)
    if len(exp) != len(got):
        return Verification(True, False, message=f"eager returned {len(exp)} outputs, translated {len(got)}")
    checks, bad = [], []
    for i, (e, g) in enumerate(zip(exp, got)):
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor) or e != g:
                bad.append(f"output {i}: {g!r} != eager {e!r}")
            continue
        if e.dtype != g.dtype:
            bad.append(f"output {i}: dtype {str(g.dtype)[6:]} != eager {str(e.dtype)[6:]}")
            continue
        if tuple(e.shape) != tuple(g.shape):
            return Verification(True, False, message=f"output {i}: shape {list(g.shape)} != eager {list(e.shape)}")
        cal = calibration[i] if calibration and i < len(calibration) else None
        lp = low_precision(precision, e.dtype) if e.is_floating_point() else None
        if lp and isinstance(cal, EagerError) and cal.truth is not None and e.numel():
            check, line = _truth_check(i, e, g, cal, lp)
            checks.append(check)
            if line:
                bad.append(line)
            continue
        b = model_bound(precision, e, cal)
        c = compare(e, g, b)
        scale = rms(e)
        check = OutputCheck(i, list(e.shape), str(e.dtype).replace("torch.", ""), c["max_abs"], c["max_rel"],
                            b.atol, b.rtol, c["passed"], c["rms_rel"], b.rms / scale if scale else 0.0, b.why,
                            nonfinite=c["nonfinite"])
        if isinstance(cal, EagerError) and cal.truth is not None and g.is_floating_point() and g.numel():
            err = errors_against(cal.truth, g)  # shown beside eager's own error against the same truth
            ts = rms(cal.truth)
            check.eager_max, check.eager_rms_rel = cal.max_abs, cal.rms_rel
            check.truth_max, check.truth_rms_rel = err["max_abs"], err["rms_abs"] / ts if ts else 0.0
        checks.append(check)
        if c["nonfinite"]:
            bad.append(f"output {i}: {_nonfinite_words(c['nan'], c['nonfinite'])} where eager is finite")
        elif not c["passed"]:
            bad.append(f"output {i}: max abs err {c['max_abs']:.3g} (bound {b.atol:.3g} + {b.rtol:g}·|eager|), "
                       f"RMS rel err {c['rms_rel']:.3g} (bound {check.rms_bound:.3g}); {b.why}")
    passed = not bad
    return Verification(True, passed, checks, "all outputs match eager" if passed else "; ".join(bad))


def node_values(gm: torch.fx.GraphModule, flat_inputs, keep) -> dict:
    """Run `gm` node by node; return {key(node): value} for nodes where keep(node) gives a key."""
    out = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            k = keep(n)
            if k is not None:
                out[k] = v
            return v

    Rec(gm).run(*flat_inputs)
    return out


def _pairs(n: torch.fx.Node, info: dict, ref: dict, got: dict):
    """(captured name, expected, got) for each value of FlyDSL node `n` that has a captured twin."""
    g = got.get(n.name)
    if isinstance(g, torch.Tensor):
        if info["anchor"] in ref:
            yield info["anchor"], ref[info["anchor"]], g
            return
        # no captured value of its own (the merged QKV GEMM: Q, K and V side by side): each slice a user
        # took for a captured node (`meta["replaces"]`) is judged against that node
        for u in n.users:
            if _replaces(u) in ref and u.name in got:
                yield _replaces(u), ref[_replaces(u)], got[u.name]
        return
    if not isinstance(g, (list, tuple)):
        return
    named = [(u, _replaces(u)) for u in n.users if _replaces(u) in ref and u.name in got]
    for u, name in named:
        yield name, ref[name], got[u.name]
    if named:
        return
    e = ref.get(info["anchor"])  # no annotation: the anchor's value is the op's one or several outputs
    if isinstance(e, torch.Tensor) and len(g) == 1:
        yield info["anchor"], e, g[0]
    elif isinstance(e, (list, tuple)) and len(e) == len(g):
        yield from ((info["anchor"], a, b) for a, b in zip(e, g))


def _replaces(u: torch.fx.Node):
    """The captured node whose uses `getitem` node `u` took (set by the lowering that made it)."""
    return u.meta.get("replaces") or (u.meta.get("flydsl") or {}).get("anchor")


def first_divergence(captured_gm, translated_gm, flat_inputs, run_ctx, precision: str = "fp32",
                     calibration: list | None = None) -> Divergence | None:
    """Name the first FlyDSL node (in graph order) whose output differs from the node it replaced.

    A bf16 / fp16 value is judged as the outputs are (tolerances.truth_bound): against the
    captured graph run in fp32 (`truth_values`), the translated node may be LOW_PRECISION_FACTOR
    times as far from it as the captured node, plus the floor. Any other value (and every value
    where that run fails) is held to the model-level bound for its own scale (upstream FlyDSL ops
    feed it slightly different inputs) widened by the op's own table entry, with atol growing with
    the op's reduction length; where no node fails that, the first node that fails the model-level
    bound alone is named (the outputs failed it, so some node does)."""
    from .registry import FAMILIES

    if precision == "fp8":  # the first layer past the accuracy report's layer bound, else the worst
        from .accuracy import worst_layer
        w = worst_layer(captured_gm, translated_gm, flat_inputs, run_ctx)
        return w and Divergence(w.node, f"flydsl.{w.family}", w.name, w.shape, w.dtype, 0.0, None, [], 0.0, 0.0,
                                w.sources, w.rel_rms)
    calibration = _errors(calibration)
    worst = max((c[1] for c in calibration or [] if c), default=0.0)
    needed = set()  # the captured values some FlyDSL node stands for: only these are kept (not every activation)
    for n in translated_gm.graph.nodes:
        if "flydsl" in n.meta:
            needed.add(n.meta["flydsl"].get("anchor"))
            needed.update(_replaces(u) for u in n.users)
    def keep(n):
        return n.meta.get("orig_name") if n.meta.get("orig_name") in needed else None

    with torch.no_grad():
        ref = node_values(captured_gm, flat_inputs, keep)
        with run_ctx():
            got = node_values(translated_gm, flat_inputs,
                              lambda n: n.name if "flydsl" in n.meta or "replaces" in n.meta else None)
        truth = None
        if any(isinstance(v, torch.Tensor) and v.dtype in (torch.bfloat16, torch.float16) for v in ref.values()):
            try:
                truth = truth_values(captured_gm, flat_inputs, torch.float32, keep)
            except Exception:  # noqa: BLE001 — the table-based judgement below still applies
                truth = None
    first_strict = None
    for n in translated_gm.graph.nodes:
        info = n.meta.get("flydsl")
        if not info or n.target is operator.getitem:
            continue
        for name, e, g in _pairs(n, info, ref, got):
            if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor) or e.shape != g.shape:
                continue
            t = truth.get(name) if truth is not None else None
            lp = low_precision("fp32", g.dtype)
            if lp and isinstance(t, torch.Tensor) and t.shape == g.shape and g.numel():
                d = _truth_divergence(n, info, name, e, g, t, lp)
                if d is not None:
                    return d
                continue
            e = e.to(g.dtype) if e.dtype != g.dtype else e
            strict = model_bound(precision, e, (0.0, worst) if worst else None)
            b = strict
            if not b.exact:
                scale = float(e.detach().abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max()) if e.numel() else 0.0
                atol, rtol = op_tolerance(g.dtype, FAMILIES[info["family"]], reduction_length(n), scale)
                b = Bound(max(b.atol, atol), max(b.rtol, rtol), b.rms, why=b.why)
            c = compare(e, g, b)
            if c is not None and not c["passed"]:
                return _divergence(n, info, name, g, c)
            if first_strict is None and b != strict:
                c = compare(e, g, strict)
                first_strict = _divergence(n, info, name, g, c) if c is not None and not c["passed"] else None
    # no node is off by more than its op's own tolerance, but the outputs failed: the first node off by more
    # than the model-level bound (an op's fp32 entry, 1e-4 for GEMMs, is looser than the model's 1e-5)
    return first_strict


def _divergence(n, info, name, g, c) -> Divergence:
    return Divergence(n.name, f"flydsl.{info['family']}", name, list(g.shape), str(g.dtype).replace("torch.", ""),
                      c["max_abs"], c["max_rel"], c["worst_index"], c["expected"], c["got"],
                      list(info.get("sources", [])), c["rms_rel"], c["nonfinite"])


def _truth_divergence(n, info, name, e, g, t, lp) -> Divergence | None:
    """FlyDSL node `n`'s value `g` judged against the truth `t` as outputs are; None if it passes."""
    ee, eg = errors_against(t, e), errors_against(t, g)
    b = truth_bound(lp, t, ee["max_abs"], ee["rms_abs"])
    if eg["max_abs"] <= b.max_abs and eg["rms_abs"] <= b.rms and eg["nonfinite"] <= ee["nonfinite"]:
        return None
    c = compare(e, g, model_bound(lp, e))  # the errors against eager, for the message (its verdict is not used)
    scale = rms(t)
    return Divergence(n.name, f"flydsl.{info['family']}", name, list(g.shape), str(g.dtype).replace("torch.", ""),
                      c["max_abs"], c["max_rel"], c["worst_index"], c["expected"], c["got"],
                      list(info.get("sources", [])), c["rms_rel"], eg["nonfinite"],
                      truth_rms_rel=eg["rms_abs"] / scale if scale else 0.0,
                      eager_rms_rel=ee["rms_abs"] / scale if scale else 0.0)


def truth_values(gm: torch.fx.GraphModule, flat_inputs, dtype: torch.dtype, keep) -> dict:
    """Run graph `gm` node by node with every bf16 / fp16 value (inputs, weights, results, dtype
    arguments such as `_to_copy(dtype=bf16)`) in `dtype` instead; {key(node): value} as node_values.
    A weight is cast when read (no second copy of the weights); one the graph writes is cast once
    and the copy written (the graph's own tensor is never touched)."""
    from .state import written_targets

    low = (torch.bfloat16, torch.float16)
    written = set(written_targets(gm))
    held: dict = {}
    out = {}

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in low:
            return x.to(dtype)
        return dtype if isinstance(x, torch.dtype) and x in low else x

    class Up(torch.fx.Interpreter):
        def get_attr(self, target, args, kwargs):
            if target in written:
                if target not in held:
                    held[target] = up(super().get_attr(target, args, kwargs).detach().clone())
                return held[target]
            return up(super().get_attr(target, args, kwargs))

        def run_node(self, n):
            if n.op == "call_function":
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                v = self.call_function(n.target, pytree.tree_map(up, args), pytree.tree_map(up, kwargs))
            else:
                v = pytree.tree_map(up, super().run_node(n))
            k = keep(n)
            if k is not None:
                out[k] = v
            return v

    Up(gm).run(*[up(x) for x in flat_inputs])
    return out


def reduction_length(n: torch.fx.Node) -> int:
    """Terms summed per output by FlyDSL node `n` (from its inputs' metadata): K for a GEMM,
    the key length for attention, input size over output size for reductions; 1 otherwise."""
    fam = n.meta["flydsl"]["family"]
    ins = [a for a in pytree.tree_leaves(n.args) if isinstance(a, torch.fx.Node)]
    vals = [a.meta.get("val") for a in ins]
    try:
        if fam in ("gemm", "bmm", "batched_gemm") and isinstance(vals[0], torch.Tensor):
            return int(vals[0].shape[-1])
        if fam == "attention" and len(vals) > 1 and isinstance(vals[1], torch.Tensor):
            return int(vals[1].shape[-2])
        out = n.meta.get("val")
        out = out[0] if isinstance(out, (list, tuple)) and out else out
        big = max((v.numel() for v in vals if isinstance(v, torch.Tensor)), default=1)
        return max(1, int(big // max(1, out.numel()))) if isinstance(out, torch.Tensor) else 1
    except (TypeError, ValueError, IndexError, RuntimeError):  # symbolic sizes: no scaling
        return 1


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""
