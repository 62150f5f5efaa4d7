"""Kernel-level matrix / vector ratio of causal attention: the steady loop, the diagonal (masked)
loop and their mix over a whole causal forward, printed from the MODEL in
translator_kernels.measure.attention_diagonal (its docstring says what is priced and how).

    python -m bench.isa_attention --diagonal [--seqs 1024,2048,8192]
"""

from __future__ import annotations

from translator_kernels.measure.attention_diagonal import loop_costs, ratios, tile_counts


def rows(archs=("gfx942", "gfx950"), dims=(64, 128), seqs=(1024, 2048, 8192)) -> list[str]:
    out = ["| arch | D | S | steady | diagonal | mixed | mixed / steady | diag iters: live / skipped (per wave) |",
           "|---|---|---|---|---|---|---|---|"]
    for arch in archs:
        for d in dims:
            costs = loop_costs(arch, d)
            for s in seqs:
                n = tile_counts(arch, d, s, costs["skip"] is not None)
                r = ratios(costs, n)
                out.append(f"| {arch} | {d} | {s} | {r['steady']:.2f} | {r['diagonal']:.2f} | {r['mixed']:.2f} | "
                           f"{r['mixed'] / r['steady']:.3f} | {n['diagonal']} / {n['skip']} |")
    return out
