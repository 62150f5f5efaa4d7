"""How many ops of a HuggingFace model's forward stay in PyTorch after translation.

    python -m bench.hf_coverage [--families gpt2,llama,...] [--attn eager,sdpa]
    python -m bench.hf_coverage --audit [--cases phi3,bloom+mask,...] [--attn preferred|eager,sdpa] [--backend flysim]

Each family is built from a tiny random config (no download), translated with
backend="reference" (what runs where does not depend on the backend; verification runs too),
and the report's rows are counted: compute ops in FlyDSL ops, compute ops left in PyTorch
(kept by design — conv / pool / batchnorm — counted apart), and which aten ops those are.
Ops folded at specialization (shape-only: masks, position ids) run once per input shape,
not per forward, and are counted apart. Layout ops (views, reshapes) carry no arithmetic and
are not counted. Families the installed
transformers lacks are listed as such.

--audit translates the families and options FAMILIES does not cover (AUDIT: more decoders, encoders,
vision and audio models, MoE; "+mask" a padding attention mask, "+bf16" the model and its float
inputs in bfloat16, "+b1" batch 1) as a new user would (translate(model, inputs), default precision)
and prints one row each: whether translate returned (its seconds; "static shapes" where the capture
kept no batch / sequence dim dynamic) or the error it raised (a TranslatorError is the clear kind,
anything else is a crash), verification against eager (the worst output's max abs
error against its bound), the share of compute ops per forward on FlyDSL kernels (recorded launches
under flysim) and of the FLOPs of our cost model, and the reasons the report gives for what stayed
in PyTorch. docs/hf-audit.md holds a measured table and the command.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from translator_kernels.measure.hf_cases import AUDIT_CASES, FAMILIES, audit_case


def audit(case: str, attn: str, backend: str = "flysim") -> dict:
    """One audit row: built as a new user would, translated with the defaults, what happened."""
    from translator import TranslatorError, translate

    torch.manual_seed(0)
    model, inputs = audit_case(case)
    if attn == "preferred":  # sdpa where the class has it, else eager
        attn = "sdpa" if type(model)._supports_sdpa else "eager"
    if attn == "sdpa" and not type(model)._supports_sdpa:
        return {"case": case, "attn": attn, "skip": f"transformers has no sdpa attention for {type(model).__name__}"}
    model.config._attn_implementation = attn
    t0 = time.perf_counter()
    try:
        tm = translate(model.eval(), inputs, backend=backend)
    except TranslatorError as e:
        return {"case": case, "attn": attn, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    except Exception as e:  # noqa: BLE001 — a crash is what the audit looks for: a row, not a stack trace
        return {"case": case, "attn": attn, "crash": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    r, v = tm.report, tm.report.verification
    rows = [x for x in r.rows if not x.layout and x.where != "folded"]
    worst = max(v.outputs, key=lambda c: c.max_abs / max(c.atol, 1e-30), default=None)
    s = r.summary()
    reasons = collections.Counter(f"{x.op.removeprefix('aten.')}: {x.detail}" for x in rows if x.where == "pytorch")
    return {"case": case, "attn": attn, "verified": v.passed, "secs": round(time.perf_counter() - t0, 1),
            "dynamic": bool(r.dynamic_dims),
            "max_abs": worst.max_abs if worst else None, "atol": worst.atol if worst else None,
            "on_kernels": sum(x.where == "flydsl-kernel" for x in rows), "compute_ops": len(rows),
            "in_flydsl_ops": sum(x.where.startswith("flydsl") for x in rows),
            "kernel_flop_share": s["flydsl_kernel_flop_share"], "flop_share": s["flydsl_flop_share"],
            "not_launched": [x.node for x in rows if x.where in ("flydsl-reference", "flydsl-op")],
            "reasons": reasons.most_common(),
            "attention_misses": sorted({_attention_miss(x) for x in rows if x.where != "pytorch"} - {None})}


def _attention_miss(row):
    """Why an attention op (or the softmax of a hand-written one) runs outside flydsl.attention, or None."""
    if "not taken by attention: " in row.detail:
        return row.detail.split("not taken by attention: ")[1].split(" — ")[0]
    if row.op in ("aten.softmax", "aten._softmax", "aten.scaled_dot_product_attention") \
            and not row.detail.startswith("flydsl.attention"):
        return f"{row.op} in {row.detail.split(' — ')[0]}"
    return None


def audit_table(cases, attns, backend="flysim"):
    print("| case | attn | translate | verified (max abs err / bound) | compute ops on FlyDSL kernels "
          "| FLOPs on FlyDSL kernels | what stays in PyTorch, and why (the report's words) |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        for attn in attns:
            r = audit(case, attn, backend)
            if "skip" in r or "error" in r or "crash" in r:
                what = "n/a" if "skip" in r else "error" if "error" in r else "CRASH"
                print(f"| {case} | {r['attn']} | {what} | — | — | — | {r.get('skip') or r.get('error') or r['crash']} |",
                      flush=True)
                continue
            ver = f"{'yes' if r['verified'] else 'NO'} ({r['max_abs']:.2g} / {r['atol']:.2g})"
            why = "; ".join([*(f"{k}{f' x{n}' if n > 1 else ''}" for k, n in r["reasons"]),
                             *(f"(in FlyDSL ops, attention not fused: {m})" for m in r["attention_misses"])]) or "—"
            kern, share = f"{r['on_kernels']}/{r['compute_ops']}", f"{r['kernel_flop_share']:.1%}"
            if backend == "reference":  # no kernel runs: what the FlyDSL ops took
                kern, share = f"{r['in_flydsl_ops']}/{r['compute_ops']} in FlyDSL ops", f"{r['flop_share']:.1%} (ops)"
            shapes = "" if r["dynamic"] else "; static shapes"
            print(f"| {case} | {r['attn']} | ok ({r['secs']} s{shapes}) | {ver} | {kern} | {share} "
                  f"| {why} |", flush=True)


def measure(family: str, attn: str, backend: str = "reference") -> dict:
    """One family's counts. On a kernel backend (flysim), `not_launched` lists the rows of FlyDSL ops
    that ran no recorded kernel launch in verification (the report's "flydsl-reference" / "flydsl-op")."""
    import transformers as T

    import translator

    torch.manual_seed(0)
    try:
        model, x = FAMILIES[family](T)
    except AttributeError as e:
        return {"family": family, "attn": attn, "error": f"not in transformers {T.__version__} ({e})"}
    model.config._attn_implementation = attn
    t0 = time.perf_counter()
    tm = translator.translate(model.eval(), (x,), backend=backend)
    secs = time.perf_counter() - t0
    rows = [r for r in tm.report.rows if not r.layout]
    folded = [r for r in rows if r.where == "folded"]
    torch_rows = [r for r in rows if r.where == "pytorch" and "by design" not in r.detail and r not in folded]
    return {"family": family, "attn": attn, "compute_ops": len(rows),
            "in_flydsl": sum(r.where.startswith("flydsl") for r in rows),
            "in_pytorch": len(torch_rows), "folded": len(folded), "by_design": sum("by design" in r.detail for r in rows),
            "verified": tm.report.verification.passed, "translate_s": round(secs, 1),
            "not_launched": [f"{r.node} ({r.where})" for r in rows if r.where in ("flydsl-reference", "flydsl-op")],
            "left": collections.Counter(r.op.removeprefix("aten.") for r in torch_rows).most_common()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--attn", default="eager,sdpa")
    ap.add_argument("--audit", action="store_true", help="translate the AUDIT cases, one row each")
    ap.add_argument("--cases", default=",".join(AUDIT_CASES))
    ap.add_argument("--backend", default="flysim")
    a = ap.parse_args(argv)
    if a.audit:
        return audit_table(a.cases.split(","), a.attn.split(","), a.backend)
    print("| family | attn | compute ops | in FlyDSL ops | in PyTorch per forward | folded (once per shape) "
          "| by design | verified | ops left in PyTorch per forward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fam in a.families.split(","):
        for attn in a.attn.split(","):
            try:
                r = measure(fam, attn)
            except Exception as e:  # noqa: BLE001 — a table row, not a crash: say what failed
                r = {"family": fam, "attn": attn, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            if "error" in r:
                print(f"| {fam} | {attn} | — | — | — | — | — | — | {r['error']} |")
                continue
            left = ", ".join(f"{op} x{n}" for op, n in r["left"])
            print(f"| {fam} | {attn} | {r['compute_ops']} | {r['in_flydsl']} | {r['in_pytorch']} | {r['folded']} "
                  f"| {r['by_design']} "
                  f"| {r['verified']} | {left} |", flush=True)


if __name__ == "__main__":
    main()
