"""The report as one self-contained HTML page (no network, no script): report.html.

Two inline-SVG bar charts and two tables:
- the FlyDSL launches (`Report.kernel_view`), one bar per launch sorted by the roofline
  MODEL's time on MI300X (MI355X beside it), each labelled with the nodes its op absorbed,
  and beside it what stays in PyTorch (op, FLOPs, bytes, reason), so a kernel engineer sees
  where the time would go and what is left to translate;
- the model's FLOPs by op family, coloured by where they run (launched FlyDSL kernel, FlyDSL
  op on the torch reference or not run yet, PyTorch);
- per-kernel ISA statistics when the report carries them (`report.kernels`);
- the per-node table with each fallback's reason.
Every text is HTML-escaped.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape

COLOURS = {"flydsl-kernel": "#2e7d32", "flydsl-reference": "#f9a825", "flydsl-op": "#4fc3f7", "pytorch": "#757575",
           "folded": "#9575cd", "removed": "#bdbdbd"}
LABELS = {"flydsl-kernel": "FlyDSL kernel (launch recorded)", "flydsl-reference": "FlyDSL op, torch reference",
          "flydsl-op": "FlyDSL op, not run yet", "pytorch": "PyTorch",
          "folded": "folded at specialization (once per input shape)", "removed": "removed"}


def flops_by_family(report) -> list[tuple[str, str, int]]:
    """[(family, where, FLOPs)], largest first; PyTorch rows are grouped by aten op."""
    acc: dict = defaultdict(int)
    for r in report.rows:
        fam = r.detail.split()[0] if r.where.startswith("flydsl") else r.op
        acc[(fam, r.where)] += r.flops
    return sorted(((f, w, n) for (f, w), n in acc.items() if n > 0), key=lambda t: -t[2])


def _chart(report) -> str:
    bars = flops_by_family(report)
    total = sum(n for _, _, n in bars) or 1
    if not bars:
        return "<p>No FLOPs were counted for this model.</p>"
    row_h, label_w, bar_w = 22, 260, 420
    h = row_h * len(bars) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" height="{h}" role="img" '
             f'aria-label="share of FLOPs by op family">']
    for i, (fam, where, n) in enumerate(bars):
        y = 5 + i * row_h
        w = max(1.0, bar_w * n / total)
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{escape(fam)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{COLOURS[where]}">'
                     f'<title>{escape(fam)}: {n:,} FLOPs ({LABELS[where]})</title></rect>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{100 * n / total:.1f}%</text>')
    parts.append("</svg>")
    legend = " ".join(f'<span class="key" style="background:{c}"></span>{LABELS[k]}' for k, c in COLOURS.items()
                      if k != "removed")
    return "".join(parts) + f'<p class="legend">{legend}</p>'


def _launch_chart(report) -> str:
    """One bar per recorded FlyDSL launch, longest modeled MI300X time first (a MODEL)."""
    rows = [r for r in report.kernel_view() if r.get("MI300X us (MODEL)") is not None]
    if not rows:
        return ("<p>No FlyDSL kernel launch has been recorded for this model (backend "
                f"{escape(report.backend)}; launches are recorded when the translated module runs).</p>")
    longest = max(r["MI300X us (MODEL)"] for r in rows) or 1.0
    row_h, label_w, bar_w = 34, 300, 260
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 150}" height="{row_h * len(rows) + 10}" '
             'role="img" aria-label="FlyDSL launches by modeled time">']
    for i, r in enumerate(rows):
        y = 5 + i * row_h
        t300, t355 = r["MI300X us (MODEL)"], r.get("MI355X us (MODEL)")
        w = max(1.0, bar_w * t300 / longest)
        tip = (f"{r['kernel']} ({r['node']}): absorbed {r['absorbed'] or '-'}; {r['flops']:,} FLOPs, {r['bytes']:,} "
               f"bytes, intensity {r['intensity']}; MODEL {t300:.3g} us on MI300X, {t355:.3g} us on MI355X "
               f"({r.get('MI300X bound (MODEL)')}-bound)")
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" font-size="12">{escape(r["op"])} '
                     f'{escape(r["node"])}</text>')
        parts.append(f'<text x="{label_w - 6}" y="{y + 27}" text-anchor="end" font-size="10" fill="#666">'
                     f'{escape(_clip(r["absorbed"] or r["kernel"], 48))}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row_h - 12}" '
                     f'fill="{COLOURS["flydsl-kernel"]}"><title>{escape(tip)}</title></rect>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 19}" font-size="11">{t300:.3g} / {t355:.3g} us</text>')
    parts.append("</svg>")
    from .cost import model_note

    return "".join(parts) + ("<p class=note>Bars: roofline MODEL time on MI300X (label: MI300X / MI355X); "
                             f"{escape(model_note())}.</p>")


def _pytorch_list(report) -> str:
    left = sorted(report.fallbacks(), key=lambda r: -(r.flops + r.bytes))
    if not left:
        return "<p>Nothing: every compute op runs in a FlyDSL op.</p>"
    body = "".join(f"<tr><td>{escape(r.node)}</td><td>{escape(r.op)}</td><td class=num>{r.flops:,}</td>"
                   f"<td class=num>{r.bytes:,}</td><td>{escape(r.detail)}</td></tr>" for r in left)
    return f"<table><tr><th>node</th><th>op</th><th>FLOPs</th><th>bytes</th><th>why</th></tr>{body}</table>"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _isa(report) -> str:
    rows = getattr(report, "kernels", None) or []
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows)
    return (f"<h2>Per-kernel ISA statistics ({escape(report.arch)})</h2>\n<p>Static instruction counts from "
            f"the compiled ISA; waves/SIMD is an occupancy model.</p>\n<table><tr>{head}</tr>{body}</table>")


def render_html(report) -> str:
    s = report.summary()
    v = report.verification
    rows = "".join(
        f'<tr class="{escape(r.where)}{" layout" if r.layout else ""}"><td>{escape(r.node)}</td><td>{escape(r.op)}</td>'
        f"<td>{escape(r.shapes)}</td><td>{escape(r.dtype)}</td><td>{escape(LABELS.get(r.where, r.where))}</td>"
        f"<td>{escape(r.detail)}</td><td class=num>{r.flops:,}</td><td class=num>{r.bytes:,}</td></tr>"
        for r in report.rows)
    facts = [
        f"arch {escape(report.arch)}; precision {escape(report.precision)}",
        f"backend <b>{escape(report.backend)}</b> — {escape(report.backend_reason)}",
        f"capture: {escape(report.capture_line())}",
        f"compute ops: {s['compute_nodes']} — on FlyDSL kernels {s['flydsl_kernel_nodes']}, FlyDSL ops on the torch "
        f"reference {s['flydsl_reference_nodes']}, in PyTorch {s['pytorch_nodes']}",
        f"compute ops: FlyDSL op not run yet {s['flydsl_not_run_nodes']}; {s['flydsl_launches']} FlyDSL kernel "
        f"launches recorded; {s['removed_nodes']} nodes removed",
        f"FLOPs (our per-op model): {s['flops_total']:,} total, {100 * s['flydsl_flop_share']:.1f}% in FlyDSL ops, "
        f"{100 * s['flydsl_kernel_flop_share']:.1f}% on launched FlyDSL kernels",
        f"bytes (op-by-op model): {s['bytes_total']:,} total, {100 * s['flydsl_byte_share']:.1f}% in FlyDSL ops, "
        f"{100 * s['flydsl_kernel_byte_share']:.1f}% on launched FlyDSL kernels",
        f"verification: <b>{v.status}</b> — {escape(v.message)}",
    ] + [escape(n) for n in report.capture_notes]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>flydsl-translator report: {escape(report.model)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }}
td.num {{ text-align: right; }}
tr.flydsl-kernel td:nth-child(5) {{ color: {COLOURS['flydsl-kernel']}; font-weight: bold; }}
tr.flydsl-reference td:nth-child(5) {{ color: #b07800; }}
tr.layout {{ color: #999; }}
.pair {{ display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }}
.note {{ color: #666; font-size: 11px; }}
.key {{ display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }}
</style></head><body>
<h1>flydsl-translator report: {escape(report.model)}</h1>
<ul>{''.join(f'<li>{f}</li>' for f in facts)}</ul>
<div class="pair">
<section><h2>FlyDSL launches, by modeled time</h2>
{_launch_chart(report)}</section>
<section><h2>What stays in PyTorch</h2>
{_pytorch_list(report)}</section>
</div>
<h2>Share of FLOPs by op family</h2>
{_chart(report)}
{_isa(report)}
<h2>Nodes</h2>
<table><tr><th>node</th><th>op</th><th>shapes</th><th>dtype</th><th>runs on</th><th>detail / reason</th>
<th>FLOPs</th><th>bytes</th></tr>{rows}</table>
</body></html>
"""
