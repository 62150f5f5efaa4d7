"""The report: what runs where, and why, and which kernels ran.

One row per node of the captured graph, attributed to where it ended in the final graph
(translator.report.rows): inside a FlyDSL op — "flydsl-kernel" once a call recorded a
kernel launch for that op, "flydsl-reference" when it ran without launching one (the
reference backend, a kernel not landed), "flydsl-op" before any call — in PyTorch with the
reason, or removed (dead code). FLOPs and bytes of every op come from our own per-op model
(translator.report.cost), so the FLOP and byte shares in FlyDSL ops mean something for
elementwise, norm and reduction models too. `kernel_view()` has one row per recorded FlyDSL
launch with the nodes its op absorbed, its FLOPs, bytes, arithmetic intensity and a roofline
MODEL time on MI300X and MI355X. With translate(isa=True), `kernels`: ISA statistics per
compiled kernel (translator.report.isa). Rendered as a rich terminal table, JSON, Markdown
and HTML (translator.report.html).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..verify import Verification
from . import cost, terminal
from .cost import measure_flops
from .names import LAYOUT_OPS, describe_shapes, node_dtype, op_name

WHERE = ("flydsl-kernel", "flydsl-reference", "flydsl-op", "pytorch", "folded", "removed")
_FLYDSL = ("flydsl-kernel", "flydsl-reference", "flydsl-op")


@dataclass
class Row:
    node: str
    op: str
    shapes: str
    dtype: str
    where: str  # one of WHERE
    detail: str  # FlyDSL op and kernel, or the reason it stays in PyTorch
    flops: int = 0  # our per-op model (report.cost) on the example inputs
    layout: bool = False  # a view / shape op, or a removed node: no arithmetic
    flydsl_node: str = ""  # the translated graph's flydsl node this captured node now runs inside
    bytes: int = 0  # HBM bytes of the op run alone (op-by-op model)
    origin: str = ""  # for a node a pass created: the captured node it came from


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
    kernels: list = field(default_factory=list)  # per compiled kernel: ISA statistics (translate(isa=True))
    kernel_sources: str = ""  # KERNELS.md written by --emit-kernels (the take-away kernel sources)
    ops: dict = field(default_factory=dict)  # per FlyDSL graph node: family, sources, FLOPs, bytes, dtype
    launches: dict = field(default_factory=dict)  # per FlyDSL graph node: [{kernel, sim_bytes}] last recorded

    # ---- launch evidence -------------------------------------------------------------------
    def observe(self, calls) -> None:
        """Take the FlyDSL op calls of one forward (runtime.ops.OpCall, node set) as evidence."""
        changed = False
        for c in calls:
            if c.node not in self.ops:
                continue
            if c.launches:
                rec = [{"kernel": getattr(r, "kernel", str(r)), "sim_bytes": _sim_bytes(r)} for r in c.launches]
                if self.launches.get(c.node) != rec:
                    self.launches[c.node] = rec
                    changed = True
            elif c.node not in self.launches:
                status = "unrecorded" if c.launches is None else "none"
                if self.ops[c.node].get("ran") != status:
                    self.ops[c.node]["ran"] = status
                    changed = True
        if changed:
            self._apply_launches()

    def _apply_launches(self) -> None:
        for r in self.rows:
            if r.where not in _FLYDSL or r.flydsl_node not in self.ops:
                continue
            op = self.ops[r.flydsl_node]
            head = r.detail.split(" — ")[0]
            if r.flydsl_node in self.launches:
                names = sorted({k["kernel"] for k in self.launches[r.flydsl_node]})
                r.where, tail = "flydsl-kernel", f"FlyDSL kernel launched: {', '.join(names)}"
            elif op.get("ran") == "none":
                r.where, tail = "flydsl-reference", ("torch reference (no kernel launch recorded"
                                                     f"{'; backend=reference' if self.backend == 'reference' else ''})")
            elif op.get("ran") == "unrecorded":
                r.where, tail = "flydsl-op", f"kernel adapter called; backend {self.backend} records no launches"
            else:
                continue
            r.detail = f"{head} — {tail}"

    def without_launch(self) -> list[str]:
        """FlyDSL graph nodes no call has recorded a kernel launch for."""
        return [n for n in self.ops if n not in self.launches]

    # ---- per-kernel view ---------------------------------------------------------------------
    def kernel_view(self) -> list[dict]:
        """One row per recorded FlyDSL launch; an op's FLOPs, bytes and MODEL times sit on its first launch."""
        out = []
        for node, op in self.ops.items():
            recs = self.launches.get(node, [])
            for i, rec in enumerate(recs):
                row = {"kernel": rec["kernel"], "op": f"flydsl.{op['family']}", "node": node,
                       "launch": f"{i + 1}/{len(recs)}", "absorbed": ", ".join(op["sources"]), "sim_bytes": rec["sim_bytes"]}
                if i == 0:
                    f, b = op["flops"], op["bytes"]
                    row.update(flops=f, bytes=b, intensity=float(f"{f / b:.3g}") if b else None)
                    for arch in cost.GPUS:
                        t = cost.kernel_time(f, b, cost.dtype_key(_torch_dtype(op["dtype"])), arch)
                        row[f"{cost.GPUS[arch]['name']} us (MODEL)"] = float(f"{t['t'] * 1e6:.3g}")
                        row[f"{cost.GPUS[arch]['name']} bound (MODEL)"] = t["bound"]
                out.append(row)
        return sorted(out, key=lambda r: -(r.get("MI300X us (MODEL)") or 0))

    # ---- summaries ---------------------------------------------------------------------
    def summary(self) -> dict:
        where = Counter(r.where for r in self.rows if not _is_layout(r))
        fam = Counter(f"flydsl.{op['family']}" for op in self.ops.values())
        flops, nbytes = _shares(self.rows, "flops"), _shares(self.rows, "bytes")
        return {
            "compute_nodes": sum(where.values()),
            "flydsl_kernel_nodes": where.get("flydsl-kernel", 0),
            "flydsl_reference_nodes": where.get("flydsl-reference", 0),
            "flydsl_not_run_nodes": where.get("flydsl-op", 0),
            "pytorch_nodes": where.get("pytorch", 0),
            "folded_nodes": where.get("folded", 0),
            "layout_nodes": sum(1 for r in self.rows if _is_layout(r) and r.where != "removed"),
            "removed_nodes": sum(1 for r in self.rows if r.where == "removed"),
            "flydsl_ops": dict(fam),
            "flydsl_absorbed": {f"flydsl.{k.removeprefix('absorbed_')}": n for k, n in sorted(self.counters.items())
                                if k.startswith("absorbed_")},
            "flydsl_launches": sum(len(v) for v in self.launches.values()),
            "flops_total": flops["total"],
            "flops_in_flydsl_ops": flops["ops"],
            "flops_in_flydsl_kernels": flops["kernels"],
            "flydsl_flop_share": flops["share"],
            "flydsl_kernel_flop_share": flops["kernel_share"],
            "bytes_total": nbytes["total"],
            "bytes_in_flydsl_ops": nbytes["ops"],
            "bytes_in_flydsl_kernels": nbytes["kernels"],
            "flydsl_byte_share": nbytes["share"],
            "flydsl_kernel_byte_share": nbytes["kernel_share"],
            **self.rank_summary(),
        }

    def rank_summary(self) -> dict:
        """What this process's graph holds (under torch.distributed: one rank's share of the model) and
        what part of it is functional collectives (report.cost.COLLECTIVES)."""
        coll = [r for r in self.rows if _is_collective(r)]
        rank = world = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 - no process group: a single-process graph
            pass
        tb, tf = sum(r.bytes for r in self.rows), sum(r.flops for r in self.rows)
        cb, cf = sum(r.bytes for r in coll), sum(r.flops for r in coll)
        return {"rank": rank, "world_size": world, "collective_ops": len(coll), "collective_bytes": cb,
                "collective_flops": cf, "collective_byte_share": cb / tb if tb else 0.0,
                "collective_flop_share": cf / tf if tf else 0.0}

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

    def precision_what_if(self) -> str:
        """Under the default fp32, what precision="bf16" would change: the FlyDSL ops' MODEL time on
        MI300X / MI355X (fp32 ops' FLOPs at the bf16 matrix rate and half their bytes). The accuracy
        of bf16 is not checked here (that is a second translation); "" when nothing would change."""
        if self.precision != "fp32":
            return ""
        f32 = [op for op in self.ops.values() if op.get("dtype") == "float32" and (op["flops"] or op["bytes"])]
        if not f32:
            return ""
        parts = []
        for arch in cost.GPUS:
            now = sum(cost.kernel_time(op["flops"], op["bytes"], "f32", arch)["t"] for op in f32)
            bf = sum(cost.kernel_time(op["flops"], op["bytes"] / 2, "bf16", arch)["t"] for op in f32)
            parts.append(f"{cost.GPUS[arch]['name']} {now * 1e6:.3g} -> {bf * 1e6:.3g} us")
        return (f"precision fp32 (the default): precision='bf16' would take its {len(f32)} fp32 FlyDSL ops from "
                f"{'; '.join(parts)} (MODEL; accuracy not checked: translate with precision='bf16' verifies it)")

    def headline(self) -> str:
        s = self.summary()
        v = self.verification
        fly = s["flydsl_kernel_nodes"] + s["flydsl_reference_nodes"] + s["flydsl_not_run_nodes"]
        folded = f" (+{s['folded_nodes']} folded once per shape)" if s["folded_nodes"] else ""
        return _rank_line(s) + (f"{self.model}: {fly}/{s['compute_nodes']} compute ops in FlyDSL ops ({s['flydsl_kernel_nodes']} on "
                f"launched FlyDSL kernels, {s['flydsl_reference_nodes']} reference-only, {s['flydsl_not_run_nodes']} "
                f"not run yet), {s['pytorch_nodes']} in PyTorch{folded}; {100 * s['flydsl_flop_share']:.1f}% of FLOPs and "
                f"{100 * s['flydsl_byte_share']:.1f}% of bytes in FlyDSL ops; backend {self.backend} "
                f"({self.backend_reason}); verification {v.status}"
                + (f"; {self.precision_what_if()}" if self.precision_what_if() else ""))

    def capture_line(self) -> str:
        """How the graph was captured, each fact once: "torch.export; dynamic dims: input 0 dim 0,
        input 0 dim 1 (marked * in shapes)"; a capture that asked for dynamic dims and got none says
        every size was fixed."""
        method = self.capture.removesuffix(" (dynamic dims)")
        if self.dynamic_dims:
            dims = ", ".join(f"input {i} dim {d}" for i, d in self.dynamic_dims)
            return f"{method}; dynamic dims: {dims} (marked * in shapes)"
        if method != self.capture:
            return f"{method}; dynamic dims asked for, none kept (every size fixed at its example value)"
        return self.capture

    def to_markdown(self) -> str:
        s = self.summary()
        v = self.verification
        out = [f"# flydsl-translator report: {self.model}", "",
               f"- arch: {self.arch}; precision: {self.precision}"
               + (f" — {self.precision_what_if()}" if self.precision_what_if() else ""),
               f"- backend: **{self.backend}** — {self.backend_reason}",
               f"- capture: {self.capture_line()}",
               *[f"  - {n}" for n in self.capture_notes],
               f"- compute ops: {s['compute_nodes']} — on launched FlyDSL kernels {s['flydsl_kernel_nodes']}, "
               f"FlyDSL ops on the torch reference {s['flydsl_reference_nodes']}, FlyDSL ops not run yet "
               f"{s['flydsl_not_run_nodes']}, in PyTorch {s['pytorch_nodes']}, folded at specialization (PyTorch, once per "
               f"input shape) {s['folded_nodes']} (plus {s['layout_nodes']} view/layout "
               f"ops; {s['removed_nodes']} removed)",
               f"- FlyDSL ops: {', '.join(f'{k} ×{n}' for k, n in s['flydsl_ops'].items()) or 'none'}; "
               f"{s['flydsl_launches']} kernel launches recorded",
               f"- FLOPs (our per-op model): {s['flops_total']:,} total, {s['flops_in_flydsl_ops']:,} in FlyDSL ops "
               f"({100 * s['flydsl_flop_share']:.1f}%), {s['flops_in_flydsl_kernels']:,} on launched FlyDSL kernels",
               f"- bytes (op-by-op model): {s['bytes_total']:,} total, {s['bytes_in_flydsl_ops']:,} in FlyDSL ops "
               f"({100 * s['flydsl_byte_share']:.1f}%), {s['bytes_in_flydsl_kernels']:,} on launched FlyDSL kernels",
               *([f"- {_rank_line(s).rstrip('; ')}"] if _rank_line(s) else []),
               f"- verification: {v.status} — {v.message}"]
        if v.divergence:
            out.append(f"  - {v.divergence.describe()}")
        for fb in v.fallbacks:
            out.append(f"  - returned to PyTorch after mismatch: {fb['node']} ({fb['op']}): {fb['reason']}")
        for c in v.outputs:
            rel = f", max rel {c.max_rel:.3g}" if c.max_rel is not None else ""
            out.append(f"  - output {c.index} {c.shape} {c.dtype}: max abs {c.max_abs:.3g}{rel}, RMS rel {c.rms_rel:.3g} "
                       f"(atol {c.atol:.3g}, rtol {c.rtol:g}, RMS rel {c.rms_bound:.3g}; {c.bound})")
            if getattr(c, "truth_rms_rel", None) is not None:  # both errors against the more exact run
                out.append(f"    - against the truth: translation RMS rel {c.truth_rms_rel:.3g} / max abs "
                           f"{c.truth_max:.3g}; eager RMS rel {c.eager_rms_rel:.3g} / max abs {c.eager_max:.3g}")
        if self.kernel_sources:
            out.append(f"- kernel sources: [{self.kernel_sources}]({self.kernel_sources})")
        rewrites = {k: n for k, n in self.counters.items() if not k.startswith("absorbed_")}
        if rewrites:
            out.append(f"- rewrites: {', '.join(f'{k} ×{n}' for k, n in sorted(rewrites.items()))}")
        if s["flydsl_absorbed"]:
            out.append("- FlyDSL ops folded whole into another FlyDSL kernel (no launch of their own; counted in "
                       f"rewrites): {', '.join(f'{k} ×{n}' for k, n in s['flydsl_absorbed'].items())}")
        out += ["", "| node | op | shapes | dtype | runs on | detail | FLOPs | bytes |", "|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            out.append(f"| {r.node} | {r.op} | {r.shapes} | {r.dtype} | {r.where} | {r.detail} | {r.flops:,} | "
                       f"{r.bytes:,} |")
        kv = self.kernel_view()
        if kv:
            cols = list(dict.fromkeys(c for k in kv for c in k))
            out += ["", "## FlyDSL launches (times are a MODEL, not measurements)", "", f"{cost.model_note()}.", "",
                    "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            out += ["| " + " | ".join(_cell(k.get(c)) for c in cols) + " |" for k in kv]
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

        shown = [r for r in self.rows if not _is_layout(r)]
        t, width = terminal.main_table(shown, f"flydsl-translator: {self.model} ({self.arch}, {self.precision})",
                                       console.width if console else terminal.terminal_width())
        console = console or Console(width=width)
        console.print(t)
        legend = terminal.dynamic_legend(shown, self.dynamic_dims)
        if legend:
            console.print(escape(legend))
        kv = self.kernel_view()
        if kv:
            k = terminal.light_table(title="FlyDSL launches (us are a MODEL)", caption=cost.model_note())
            cols = ("kernel", "node", "flops", "bytes", "intensity", "MI300X us (MODEL)", "MI355X us (MODEL)")
            for col in cols:  # kernel names stay whole, like op names; the title says the us are a MODEL
                k.add_column(col.removesuffix(" (MODEL)"), overflow="fold", no_wrap=col == "kernel")
            for row in kv:
                k.add_row(*(escape(_cell(row.get(c))) for c in cols))
            console.print(k)
        if self.kernels:
            cols = [c for c in _kernel_columns(self.kernels) if c in _TERMINAL_COLUMNS]
            k = Table(title=f"per-kernel ISA statistics ({self.arch}; static; waves/SIMD is a model)")
            for col in cols:
                k.add_column(col, overflow="fold")
            for row in self.kernels:
                k.add_row(*(escape(str(row.get(c, ""))) for c in cols), style="red" if "error" in row else None)
            console.print(k)
        s = self.summary()
        console.print(f"({s['layout_nodes']} view/layout ops and {s['removed_nodes']} removed nodes not shown; "
                      "see report.md)")
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


def _is_collective(r: Row) -> bool:
    ns, _, name = r.op.partition(".")
    return "c10d" in ns and name in cost.COLLECTIVES


def _rank_line(s: dict) -> str:
    """"rank 0/2 holds ... FLOPs and ... bytes, of which collectives ..." under torch.distributed or
    when the graph has collectives; "" otherwise."""
    if s["rank"] is None and not s["collective_ops"]:
        return ""
    who = f"rank {s['rank']}/{s['world_size']}" if s["rank"] is not None else "this graph"
    return (f"{who} holds {s['flops_total']:,} FLOPs and {s['bytes_total']:,} bytes; collectives "
            f"({s['collective_ops']} ops): {100 * s['collective_flop_share']:.1f}% of FLOPs, "
            f"{100 * s['collective_byte_share']:.1f}% of bytes; ")


def _is_layout(r: Row) -> bool:
    return r.layout


def _cell(v) -> str:
    if v is None:
        return ""
    return f"{v:,}" if isinstance(v, int) else str(v).replace("|", "/")


def _shares(rows, key) -> dict:
    """Total of `key` over compute rows, the part inside FlyDSL ops and on launched kernels."""
    total = sum(getattr(r, key) for r in rows)
    ops = sum(getattr(r, key) for r in rows if r.where in _FLYDSL)
    kernels = sum(getattr(r, key) for r in rows if r.where == "flydsl-kernel")
    return {"total": total, "ops": ops, "kernels": kernels, "share": ops / total if total else 0.0,
            "kernel_share": kernels / total if total else 0.0}


def _sim_bytes(rec):
    c = getattr(rec, "counters", None) or {}
    if "global_bytes_read" not in c:
        return None
    return int(c.get("global_bytes_read", 0)) + int(c.get("global_bytes_written", 0))


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name, None) if name else None


__all__ = ["Report", "Row", "WHERE", "LAYOUT_OPS", "describe_shapes", "node_dtype", "op_name", "measure_flops"]
