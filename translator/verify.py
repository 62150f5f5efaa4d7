"""Verification: eager PyTorch vs the translated module, all outputs.

On a mismatch both graphs run node by node (the freshly captured graph in eager torch,
the translated graph on its backend) and the first FlyDSL node whose output diverges from
the captured node it replaced is named, with shapes, dtypes, max abs / rel error and the
worst index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.utils._pytree as pytree

from .tolerances import model_tolerance, op_tolerance


@dataclass
class OutputCheck:
    index: int
    shape: list
    dtype: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool


@dataclass
class Divergence:
    node: str  # translated node
    op: str  # flydsl.<family>
    replaces: str  # captured node it replaced
    shape: list
    dtype: str
    max_abs: float
    max_rel: float
    worst_index: list
    expected: float
    got: float

    def describe(self) -> str:
        return (f"first diverging FlyDSL node: {self.node} ({self.op}, replaces {self.replaces}) "
                f"shape {self.shape} {self.dtype}: max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g} "
                f"at index {self.worst_index} (expected {self.expected:.6g}, got {self.got:.6g})")


@dataclass
class Verification:
    ran: bool
    passed: bool | None
    outputs: list = field(default_factory=list)
    message: str = ""
    divergence: Divergence | None = None
    fallbacks: list = field(default_factory=list)  # [{"node", "op", "reason"}]

    def to_dict(self):
        d = asdict(self)
        return d


def compare(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float):
    e, g = expected.detach().float(), got.detach().float()
    if e.shape != g.shape:
        return None
    diff = (e - g).abs()
    finite = torch.isfinite(e) & torch.isfinite(g)
    same_nonfinite = (~finite) & ((e == g) | (e.isnan() & g.isnan()))
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    rel = diff / e.abs().clamp_min(1e-12)
    ok = bool((diff <= atol + rtol * e.abs().nan_to_num(0)).all()) if e.numel() else True
    idx = int(diff.argmax()) if e.numel() else 0
    return {
        "max_abs": float(diff.max()) if e.numel() else 0.0,
        "max_rel": float(torch.where(diff > 0, rel, torch.zeros_like(rel)).max()) if e.numel() else 0.0,
        "worst_index": list(torch.unravel_index(torch.tensor(idx), e.shape)) if e.dim() else [],
        "expected": float(e.flatten()[idx]) if e.numel() else 0.0,
        "got": float(g.flatten()[idx]) if e.numel() else 0.0,
        "passed": ok,
    }


def verify_outputs(eager_out, translated_out, precision: str) -> Verification:
    atol, rtol = model_tolerance(precision)
    exp, _ = pytree.tree_flatten(eager_out)
    got, _ = pytree.tree_flatten(translated_out)
    if len(exp) != len(got):
        return Verification(True, False, message=f"eager returned {len(exp)} outputs, translated {len(got)}")
    checks, passed = [], True
    for i, (e, g) in enumerate(zip(exp, got)):
        if not isinstance(e, torch.Tensor):
            ok = e == g
            passed &= bool(ok)
            continue
        c = compare(e, g, atol, rtol)
        if c is None:
            return Verification(True, False, message=f"output {i}: shape {list(g.shape)} != eager {list(e.shape)}")
        checks.append(OutputCheck(i, list(e.shape), str(e.dtype).replace("torch.", ""), c["max_abs"], c["max_rel"],
                                  atol, rtol, c["passed"]))
        passed &= c["passed"]
    msg = "all outputs match eager" if passed else "; ".join(
        f"output {c.index}: max abs err {c.max_abs:.3g} > atol {c.atol:g} + rtol {c.rtol:g}·|eager|"
        for c in checks if not c.passed)
    return Verification(True, passed, checks, msg)


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


def first_divergence(captured_gm, translated_gm, flat_inputs, run_ctx) -> Divergence | None:
    """Name the first FlyDSL node (in graph order) whose output differs from the node it replaced."""
    from .registry import FAMILIES

    with torch.no_grad():
        ref = node_values(captured_gm, flat_inputs, lambda n: n.meta.get("orig_name"))
        with run_ctx():
            got = node_values(translated_gm, flat_inputs,
                              lambda n: n.name if "flydsl" in n.meta else None)
    for n in translated_gm.graph.nodes:
        info = n.meta.get("flydsl")
        if not info or n.name not in got or info["anchor"] not in ref:
            continue
        e, g = ref[info["anchor"]], got[n.name]
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            continue
        atol, rtol = op_tolerance(g.dtype, FAMILIES[info["family"]])
        atol, rtol = max(atol, model_tolerance("fp32")[0]), max(rtol, model_tolerance("fp32")[1])
        c = compare(e.to(g.dtype) if e.dtype != g.dtype else e, g, atol, rtol)
        if c is not None and not c["passed"]:
            return Divergence(n.name, f"flydsl.{info['family']}", info["anchor"], list(g.shape),
                              str(g.dtype).replace("torch.", ""), c["max_abs"], c["max_rel"],
                              [int(i) for i in c["worst_index"]], c["expected"], c["got"])
    return None
