"""The report: what runs where, and why.

One row per node of the captured graph: its op, shapes and dtype, and where it runs now —
inside a FlyDSL op (with our FlyDSL kernel, or on the op's torch reference when
backend='reference'), or in PyTorch with the reason. Plus the share of
the model's FLOPs inside FlyDSL ops (torch.utils.flop_counter, measured per captured node
on the example inputs), op counts, pass counters and the verification result; with
translate(isa=True), `kernels`: ISA statistics per compiled kernel (translator.report.isa).
Rendered as a rich terminal table, JSON and Markdown.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..verify import Verification

# shape / view / metadata ops: no arithmetic, nothing to translate
LAYOUT_OPS = {
    "view", "reshape", "_unsafe_view", "transpose", "t", "permute", "unsqueeze", "squeeze", "expand", "contiguous",
    "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "flatten", "unflatten", "getitem", "clone",
    "alias", "detach", "size", "sym_size", "lift_fresh_copy", "_assert_tensor_metadata", "dropout", "to",
    "_to_copy", "type_as", "narrow", "movedim", "repeat", "cat", "stack", "arange", "zeros", "ones", "full",
    "empty", "tril", "triu", "scalar_tensor", "_guards_fn", "_assert_scalar", "sym_constrain_range_for_size",
}


@dataclass
class Row:
    node: str
    op: str
    shapes: str
    dtype: str
    where: str  # "flydsl-kernel" | "flydsl-reference" | "pytorch"
    detail: str  # FlyDSL op and kernel, or the reason it stays in PyTorch
    flops: int = 0
    layout: bool = False  # a view / shape op: no arithmetic
    flydsl_node: str = ""  # the translated graph's flydsl node this captured node now runs inside


@dataclass
class Report:
    model: str
    arch: str
    backend: str
    backend_reason: str
    precision: str
    capture: str
    capture_notes: list
    rows: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    pass_counts: dict = field(default_factory=dict)
    verification: Verification = field(default_factory=lambda: Verification(False, None, message="not run"))
    dynamic_dims: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    kernel_sources: str = ""  # KERNELS.md written by --emit-kernels (the take-away kernel sources)  # per compiled kernel: ISA statistics (translate(isa=True))

    # ---- summaries ---------------------------------------------------------------------
    def summary(self) -> dict:
        where = Counter(r.where for r in self.rows if not _is_layout(r))
        fam = Counter(op for op, _ in {(r.detail.split()[0], r.flydsl_node) for r in self.rows if r.where != "pytorch"})
        total = sum(r.flops for r in self.rows)
        in_fly = sum(r.flops for r in self.rows if r.where != "pytorch")
        in_kernel = sum(r.flops for r in self.rows if r.where == "flydsl-kernel")
        return {
            "compute_nodes": sum(where.values()),
            "flydsl_kernel_nodes": where.get("flydsl-kernel", 0),
            "flydsl_reference_nodes": where.get("flydsl-reference", 0),
            "pytorch_nodes": where.get("pytorch", 0),
            "layout_nodes": sum(1 for r in self.rows if _is_layout(r)),
            "flydsl_ops": dict(fam),
            "flops_total": total,
            "flops_in_flydsl_ops": in_fly,
            "flops_in_flydsl_kernels": in_kernel,
            "flydsl_flop_share": (in_fly / total) if total else 0.0,
        }

    def fallbacks(self) -> list[Row]:
        return [r for r in self.rows if r.where == "pytorch" and not _is_layout(r)]

    # ---- renderers -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("rows", "verification")}
        d["summary"] = self.summary()
        d["rows"] = [asdict(r) for r in self.rows]
        d["verification"] = self.verification.to_dict()
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def headline(self) -> str:
        s = self.summary()
        v = self.verification
        ver = "not run" if not v.ran else ("PASSED" if v.passed else "FAILED")
        return (f"{self.model}: {s['flydsl_kernel_nodes'] + s['flydsl_reference_nodes']}/{s['compute_nodes']} compute "
                f"ops in FlyDSL ops ({s['flydsl_kernel_nodes']} on FlyDSL kernels, {s['flydsl_reference_nodes']} "
                f"reference-only), {s['pytorch_nodes']} in PyTorch; {100 * s['flydsl_flop_share']:.1f}% of FLOPs in "
                f"FlyDSL ops; backend {self.backend} ({self.backend_reason}); verification {ver}")

    def to_markdown(self) -> str:
        s = self.summary()
        v = self.verification
        out = [f"# flydsl-translator report: {self.model}", "",
               f"- arch: {self.arch}; precision: {self.precision}",
               f"- backend: **{self.backend}** — {self.backend_reason}",
               f"- capture: {self.capture}" + (f" (dynamic dims, as (input, dim): {self.dynamic_dims}; "
                                               "marked * in shapes)" if self.dynamic_dims else ""),
               *[f"  - {n}" for n in self.capture_notes],
               f"- compute ops: {s['compute_nodes']} — on FlyDSL kernels {s['flydsl_kernel_nodes']}, "
               f"FlyDSL ops on the torch reference {s['flydsl_reference_nodes']}, in PyTorch {s['pytorch_nodes']} "
               f"(plus {s['layout_nodes']} view/layout ops)",
               f"- FlyDSL ops: {', '.join(f'{k} ×{n}' for k, n in s['flydsl_ops'].items()) or 'none'}",
               f"- FLOPs: {s['flops_total']:,} total, {s['flops_in_flydsl_ops']:,} in FlyDSL ops "
               f"({100 * s['flydsl_flop_share']:.1f}%), {s['flops_in_flydsl_kernels']:,} on FlyDSL kernels",
               f"- verification: {'not run' if not v.ran else ('PASSED' if v.passed else 'FAILED')} — {v.message}"]
        if v.divergence:
            out.append(f"  - {v.divergence.describe()}")
        for fb in v.fallbacks:
            out.append(f"  - returned to PyTorch after mismatch: {fb['node']} ({fb['op']}): {fb['reason']}")
        for c in v.outputs:
            out.append(f"  - output {c.index} {c.shape} {c.dtype}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} "
                       f"(atol {c.atol:g}, rtol {c.rtol:g})")
        if self.kernel_sources:
            out.append(f"- kernel sources: [{self.kernel_sources}]({self.kernel_sources})")
        if self.counters:
            out.append(f"- rewrites: {', '.join(f'{k} ×{n}' for k, n in sorted(self.counters.items()))}")
        out += ["", "| node | op | shapes | dtype | runs on | detail | FLOPs |", "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            out.append(f"| {r.node} | {r.op} | {r.shapes} | {r.dtype} | {r.where} | {r.detail} | {r.flops:,} |")
        if self.kernels:
            cols = _kernel_columns(self.kernels)
            out += ["", f"## Per-kernel ISA statistics ({self.arch}; static counts; waves/SIMD is a model)", "",
                    "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            out += ["| " + " | ".join(str(k.get(c, "")).replace("|", "/") for c in cols) + " |" for k in self.kernels]
        return "\n".join(out) + "\n"

    def render(self, console=None) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console(width=max(Console().width, 150))
        t = Table(title=f"flydsl-translator: {self.model} ({self.arch}, {self.precision})", show_lines=False)
        for col in ("node", "op", "shapes", "dtype", "runs on", "detail", "FLOPs"):
            t.add_column(col, overflow="fold")
        style = {"flydsl-kernel": "green", "flydsl-reference": "yellow", "pytorch": "white"}
        for r in self.rows:
            if _is_layout(r):
                continue
            t.add_row(*map(escape, (r.node, r.op, r.shapes, r.dtype, r.where, r.detail)), f"{r.flops:,}",
                      style=style[r.where])
        console.print(t)
        if self.kernels:
            cols = [c for c in _kernel_columns(self.kernels) if c in _TERMINAL_COLUMNS]
            k = Table(title=f"per-kernel ISA statistics ({self.arch}; static; waves/SIMD is a model)")
            for col in cols:
                k.add_column(col, overflow="fold")
            for row in self.kernels:
                k.add_row(*(escape(str(row.get(c, ""))) for c in cols), style="red" if "error" in row else None)
            console.print(k)
        s = self.summary()
        console.print(f"({s['layout_nodes']} view/layout ops not shown; see report.md)")
        console.print(escape(self.headline()))
        v = self.verification
        if v.ran and not v.passed:
            console.print(f"verification failed: {escape(v.message)}", style="red")
            if v.divergence:
                console.print(escape(v.divergence.describe()), style="red")


_TERMINAL_COLUMNS = ("op", "nodes", "kernel", "VGPR", "SGPR", "spills (v/s)", "LDS B", "waves/SIMD", "limit", "MFMA",
                     "VALU", "VMEM loads", "VMEM stores", "error")


def _kernel_columns(kernels: list) -> list:
    """The columns of the ISA table: every key any kernel row has, in first-seen order."""
    return list(dict.fromkeys(c for k in kernels for c in k))


def _is_layout(r: Row) -> bool:
    return r.layout


def op_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._opname}"
    if node.op == "call_module":
        return f"module {t}"
    return getattr(t, "__name__", str(t))


def _fmt_shape(v) -> str:
    """Example sizes; a dynamic dim is marked with * (e.g. 2*x16*x128)."""
    if isinstance(v, torch.Tensor):
        return "x".join(_fmt_dim(s) for s in v.shape) or "scalar"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_fmt_shape(x) for x in v) + ")"
    return ""


def _fmt_dim(s) -> str:
    if isinstance(s, torch.SymInt):
        if not s.node.expr.free_symbols:
            return str(int(s))
        hint = s.node.hint
        return f"{hint}*" if hint is not None else str(s)
    return str(s)


def describe_shapes(node: torch.fx.Node) -> str:
    ins = [a.meta.get("val") for a in node.all_input_nodes if a.op != "get_attr"]
    return ", ".join(f for f in (_fmt_shape(v) for v in ins) if f) + " -> " + _fmt_shape(node.meta.get("val"))


def node_dtype(node) -> str:
    v = node.meta.get("val")
    if isinstance(v, (list, tuple)) and v:
        v = v[0]
    return str(getattr(v, "dtype", "")).replace("torch.", "")


def measure_flops(gm: torch.fx.GraphModule, flat_inputs) -> dict:
    """FLOPs of every captured node on the example inputs, counted by torch.utils.flop_counter."""
    flops = {}

    class Count(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op != "call_function":
                return super().run_node(n)
            with FlopCounterMode(display=False) as fc:
                v = super().run_node(n)
            f = fc.get_total_flops()
            if not f and n.target is torch.ops.aten.scaled_dot_product_attention.default:
                f = _sdpa_flops(self.env[n.args[0]], self.env[n.args[1]], self.env[n.args[2]])
            flops[n.meta.get("orig_name", n.name)] = f
            return v

    with torch.no_grad():
        Count(gm).run(*flat_inputs)
    return flops


def _sdpa_flops(q, k, v) -> int:
    """Q·Kᵀ and P·V (2 FLOPs a multiply-add each): what flop_counter counts for the fused SDPA
    kernels, which it does not see when CPU torch runs SDPA's math path."""
    b = q.shape[:-2].numel()
    return 2 * b * q.shape[-2] * k.shape[-2] * q.shape[-1] + 2 * b * q.shape[-2] * k.shape[-2] * v.shape[-1]
