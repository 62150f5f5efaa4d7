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

import copy
import operator
from dataclasses import asdict, dataclass, field

import torch
import torch.utils._pytree as pytree

from .tolerances import Bound, model_bound, op_tolerance, rms


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
    rms_bound: float = 0.0  # allowed RMS(error) / RMS(eager)
    bound: str = ""  # where the bound comes from (table or fp64 calibration)


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

    def describe(self) -> str:
        rel = f", max rel err {self.max_rel:.3g}" if self.max_rel is not None else ""
        return (f"first diverging FlyDSL node: {self.node} ({self.op}, replaces {self.replaces}) "
                f"shape {self.shape} {self.dtype}: max abs err {self.max_abs:.3g}{rel}, RMS rel err "
                f"{self.rms_rel:.3g} at index {self.worst_index} (expected {self.expected:.6g}, got {self.got:.6g})")


@dataclass
class Verification:
    ran: bool
    passed: bool | None
    outputs: list = field(default_factory=list)
    message: str = ""
    divergence: Divergence | None = None
    fallbacks: list = field(default_factory=list)  # [{"node", "op", "reason"}]
    calibration: str = ""  # how the fp32 bound was grounded (eager fp32 vs fp64), or why it was not

    def to_dict(self):
        return asdict(self)


def compare(expected: torch.Tensor, got: torch.Tensor, bound: Bound):
    """Errors of `got` against `expected` and whether they meet `bound`; None on a shape mismatch."""
    if tuple(expected.shape) != tuple(got.shape):
        return None
    if expected.numel() == 0:
        return dict(max_abs=0.0, max_rel=None, rms_rel=0.0, worst_index=[], expected=0.0, got=0.0, passed=True)
    e, g = expected.detach().double(), got.detach().double()
    finite = torch.isfinite(e) & torch.isfinite(g)
    same_nonfinite = ~finite & ((e == g) | (e.isnan() & g.isnan()))
    diff = torch.where(finite, (e - g).abs(), torch.where(same_nonfinite, 0.0, float("inf")))
    if bound.exact:
        ok = bool((diff == 0).all())
    else:
        err_rms = rms(torch.where(finite, e - g, 0.0))
        ok = bool((diff <= bound.atol + bound.rtol * e.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)).all()) \
            and err_rms <= bound.rms
    scale = rms(e)
    meaningful = finite & (e.abs() > max(bound.atol, 1e-30))
    idx = int(diff.argmax())
    return {
        "max_abs": float(diff.max()),
        "max_rel": float((diff / e.abs())[meaningful].max()) if bool(meaningful.any()) else None,
        "rms_rel": rms(torch.where(finite, e - g, 0.0)) / scale if scale else float(diff.max() > 0),
        "worst_index": [int(i) for i in torch.unravel_index(torch.tensor(idx), e.shape)] if e.dim() else [],
        "expected": float(e.flatten()[idx]),
        "got": float(g.flatten()[idx]),
        "passed": ok,
    }


def calibrate(model: torch.nn.Module, inputs: tuple, eager_out) -> tuple[list | None, str]:
    """Eager fp32's own error: run a float64 copy of `model` on the inputs in float64 and
    measure, per output leaf, (max abs error, RMS error / RMS) of `eager_out` against it.

    The copy shares nothing with `model` (its fp32 parameters and buffers are copied straight
    to float64, so the extra memory is the model's size in float64 for the length of this
    call). Returns (per-leaf errors or None, a note for the report)."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.dtype == torch.float32]
    flat = pytree.tree_leaves(inputs)
    if not tensors and not any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in flat):
        return None, "no fp32 values: table bound"
    memo = {}
    for t in tensors:
        d = t.detach().double()
        memo[id(t)] = torch.nn.Parameter(d, requires_grad=False) if isinstance(t, torch.nn.Parameter) else d
    try:
        m64 = copy.deepcopy(model, memo)
        in64 = pytree.tree_map(lambda x: x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32
                               else x, inputs)
        with torch.no_grad():
            out64 = m64(*in64)
    except Exception as e:  # noqa: BLE001 — the table bound still applies; the note says why
        return None, f"eager fp64 run failed ({type(e).__name__}: {_first_line(e)}): table bound"
    exp, got = pytree.tree_leaves(eager_out), pytree.tree_leaves(out64)
    if len(exp) != len(got):
        return None, "eager fp64 returned a different number of outputs: table bound"
    errors = []
    for a, b in zip(exp, got):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()
                and tuple(a.shape) == tuple(b.shape) and a.numel()):
            errors.append(None)
            continue
        a64, b64 = a.detach().double(), b.detach().double()
        finite = torch.isfinite(a64) & torch.isfinite(b64)
        d = torch.where(finite, a64 - b64, 0.0)
        scale = rms(b64)
        errors.append((float(d.abs().max()), rms(d) / scale if scale else 0.0))
    worst = max((e[1] for e in errors if e), default=0.0)
    return errors, f"eager fp32 vs eager fp64 on the example inputs: worst RMS rel err {worst:.3g}"


def verify_outputs(eager_out, translated_out, precision: str, calibration: list | None = None) -> Verification:
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
        cal = calibration[i] if calibration and i < len(calibration) else None
        b = model_bound(precision, e, cal)
        c = compare(e, g, b)
        if c is None:
            return Verification(True, False, message=f"output {i}: shape {list(g.shape)} != eager {list(e.shape)}")
        scale = rms(e)
        checks.append(OutputCheck(i, list(e.shape), str(e.dtype).replace("torch.", ""), c["max_abs"], c["max_rel"],
                                  b.atol, b.rtol, c["passed"], c["rms_rel"], b.rms / scale if scale else 0.0, b.why))
        if not c["passed"]:
            bad.append(f"output {i}: max abs err {c['max_abs']:.3g} (bound {b.atol:.3g} + {b.rtol:g}·|eager|), "
                       f"RMS rel err {c['rms_rel']:.3g} (bound {checks[-1].rms_bound:.3g}); {b.why}")
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

    Each value is held to the model-level bound for its own scale (upstream FlyDSL ops feed it
    slightly different inputs) widened by the op's own table entry, with atol growing with the
    op's reduction length."""
    from .registry import FAMILIES

    worst = max((c[1] for c in calibration or [] if c), default=0.0)
    with torch.no_grad():
        ref = node_values(captured_gm, flat_inputs, lambda n: n.meta.get("orig_name"))
        with run_ctx():
            got = node_values(translated_gm, flat_inputs,
                              lambda n: n.name if "flydsl" in n.meta or "replaces" in n.meta else None)
    for n in translated_gm.graph.nodes:
        info = n.meta.get("flydsl")
        if not info or n.target is operator.getitem:
            continue
        for name, e, g in _pairs(n, info, ref, got):
            if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor) or e.shape != g.shape:
                continue
            e = e.to(g.dtype) if e.dtype != g.dtype else e
            b = model_bound(precision, e, (0.0, worst) if worst else None)
            if not b.exact:
                scale = float(e.detach().abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max()) if e.numel() else 0.0
                atol, rtol = op_tolerance(g.dtype, FAMILIES[info["family"]], reduction_length(n), scale)
                b = Bound(max(b.atol, atol), max(b.rtol, rtol), b.rms, why=b.why)
            c = compare(e, g, b)
            if c is not None and not c["passed"]:
                return Divergence(n.name, f"flydsl.{info['family']}", name, list(g.shape),
                                  str(g.dtype).replace("torch.", ""), c["max_abs"], c["max_rel"],
                                  c["worst_index"], c["expected"], c["got"], list(info.get("sources", [])),
                                  c["rms_rel"])
    return None


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
