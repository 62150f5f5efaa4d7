"""The tile plan of causal attention and its kernel-level matrix / vector ratio: the steady loop,
the diagonal (masked) loop and their mix over a whole causal forward (a MODEL from the compiled
ISA, not a measurement). tests/kernels/test_attention_diagonal.py checks the tile plan against
flysim's executed MFMAs; bench.attention_diagonal prints the table.

Per (arch, D) the kernel is compiled once (bf16, causal, the B1 S2048 H32 launch; the loops do
not depend on S) and translator_kernels.hotloop prices its two KV loops per wave and iteration:
the unmasked loop on its steady path (the rescale branch skipped: it runs 0 times on randn
inputs), the diagonal loop on every block, and, where the kernel has it, the diagonal loop's
early back edge that carries no MFMA: the path of a wave whose rows see no key of the tile (it
only stages the tile in LDS). Then for each query block of S rows the tile plan gives, per wave,
how many tiles run unmasked, diagonal, or skipped (first key past the wave's last row), and:

    steady = matrix / vector of the unmasked loop's iteration
    diagonal = sum over the diagonal tiles of all waves (skipped ones at their cost) of matrix / vector
    mixed = every tile of every wave: the kernel-level ratio

The peeled first unmasked tile is priced as a steady iteration (it issues the same MFMAs and
skips the rescale as well). What the model leaves out: hotloop.py's docstring.
"""

from __future__ import annotations

from translator_kernels.attention import attention_config
from translator_kernels.hotloop import compile_isa_texts, find_loops, hot_loop, main_text

ENTRY = "translator_kernels.measure.attention_isa:compile_bshd"  # causal bf16 attention on a [B, S, H, D] shape


def loop_costs(arch: str, d: int) -> dict:
    """{'steady', 'diagonal', 'skip'}: (matrix, vector) MODEL cycles per wave and iteration."""
    text = main_text(compile_isa_texts(ENTRY, ("bf16", [1, 2048, 32, d]), arch=arch))
    hot = hot_loop(text, arch)
    steady = (hot["steady"]["matrix_cycles"], hot["steady"]["vector_cycles"])
    other = [lp for lp in find_loops(text) if lp.header != hot["header"] and lp.cycles(arch)["counts"]["MFMA"]]
    if len(other) != 1:
        raise RuntimeError(f"{arch} D{d}: expected one diagonal loop beside {hot['header']}, found {len(other)}")
    diag = other[0]
    c = diag.cycles(arch)
    out = {"steady": steady, "diagonal": (c["matrix_cycles"], c["vector_cycles"]), "skip": None}
    for e in diag.early:  # the skip path: a back edge before any MFMA of the body
        ec = e.cycles(arch)
        if ec["counts"]["MFMA"] == 0:
            out["skip"] = (ec["matrix_cycles"], ec["vector_cycles"])
            break
    return out


def tile_counts(arch: str, d: int, seq: int, skip: bool) -> dict:
    """Wave-iterations of a causal B1 H1 forward at Sq = Sk = seq: unmasked, diagonal, skipped."""
    cfg = attention_config("bf16", d, seq, arch, causal=True)
    bm, bn, rpw = cfg["block_m"], cfg["block_n"], cfg["rows_per_wave"]
    waves = bm // rpw
    n = {"steady": 0, "diagonal": 0, "skip": 0}
    for qb in range(-(-seq // bm)):
        kv_end = min((qb + 1) * bm, seq)
        full_end = min((qb * bm + 1) // bn * bn, kv_end // bn * bn)
        n["steady"] += waves * (full_end // bn)
        for kb in range(full_end, kv_end, bn):
            for w in range(waves):
                dead = skip and kb > qb * bm + w * rpw + rpw - 1
                n["skip" if dead else "diagonal"] += 1
    return n


def ratios(costs: dict, counts: dict) -> dict:
    def total(kinds):
        mat = sum(costs[k][0] * counts[k] for k in kinds if counts[k])
        vec = sum(costs[k][1] * counts[k] for k in kinds if counts[k])
        return mat / vec if vec else float("nan")

    return {"steady": costs["steady"][0] / costs["steady"][1], "diagonal": total(("diagonal", "skip")),
            "mixed": total(("steady", "diagonal", "skip"))}
