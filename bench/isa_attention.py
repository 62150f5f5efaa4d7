"""ISA statistics of the attention kernel per config and arch (no GPU needed).

    .venv/bin/python -m bench.isa_attention \
        [--quick] [--gfx942-only | --gfx950-only]
    FLYDSL_SRC=<FlyDSL checkout> .venv/bin/python -m bench.isa_attention --hotloop [--rate-seq 1024] [--rate-data randn]
    .venv/bin/python -m bench.isa_attention --rescale [--seq 1024]
    .venv/bin/python -m bench.isa_attention --diagonal [--seqs 1024,2048,8192]   (bench/attention_diagonal.py)

Each config is compiled to AMDGPU ISA through translator_kernels.isa (COMPILE_ONLY in a child
process, one child per arch) and the metadata of its final ISA is read back: VGPR / AGPR / SGPR
counts, spills, LDS bytes, and occupancy (translator_kernels.isa's model). Prints a markdown table.

--hotloop: the hot-loop MODEL (bench.hotloop) of our kernel next to FlyDSL's generic flash
attention (kernels/attention/flash_attn_generic.py of $FLYDSL_SRC; skipped without it) at
B1 S2048 H32 bf16 causal, D 64 and 128, both archs: per iteration of each kernel's KV loop and
per wave, matrix / vector / LDS cycles, their ratio, and the kernel's VGPRs, spills and waves/SIMD.
The two loops cover different tiles (ours 32 rows x 32-64 keys, FlyDSL's 128-row blocks), so
compare the matrix/vector ratio, not the cycles. The steady columns (bench.hotloop: the body up
to an earlier back edge that skips no MFMA) are ours only: our skipped tail is the rare rescale
(tests/kernels/test_attention_hotloop.py asserts what it holds); FlyDSL's early back edges skip
work its iterations need (LDS writes, the causal mask). The last three columns, ours only:
how often the rescale branch ran, measured under flysim (`rescale_rate`: B1 H1 S=--rate-seq
causal bf16, --rate-data inputs), and the MODEL's expected vector cycles and matrix/vector at
that rate, steady + rate x (static - steady). The rate is a measurement of the branch on those
inputs; the cycles stay a MODEL.

--rescale: the measured rates alone, per arch, D 64 / 128, causal or not, and three inputs
(`rate_inputs`: randn; Q and K of mean 1; K scaled up along the keys), with what the same
count was before the first tile was peeled out of the loop (it always took the branch).
"""

from __future__ import annotations

import sys

from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.measure.attention_isa import (ENTRY as _ENTRY, compile_one as _compile_one,  # noqa: F401
                                                     expected_cells, isa_stats, isa_stats_many, rescale_counts)

RATE_DATA = ("randn", "mean", "ramp")

CONFIGS = [(dt, d, c, m) for dt in ("bf16", "f16", "f32") for d in (32, 64, 80, 96, 128, 256)
           for c, m in ((False, "none"), (True, "none"))] + [
    (dt, 128, False, m) for dt in ("bf16", "f32") for m in ("bool", "add")]
QUICK = [("bf16", 64, False, "none"), ("bf16", 128, True, "none"), ("f32", 64, False, "none"),
         ("f16", 256, False, "add")]


def hotloop_rows(archs=("gfx942", "gfx950"), dims=(64, 128), with_cycles=False) -> list:
    """Markdown rows of the hot-loop comparison (see the module docstring); `with_cycles`: each
    row with (arch, d, the hot_loop dict)."""
    import os

    from bench.hotloop import format_row
    from translator_kernels.hotloop import compile_isa_texts, hot_loop, main_text
    from translator_kernels.isa import parse_isa

    impls = ["ours"] + (["flydsl"] if os.environ.get("FLYDSL_SRC") else [])
    rows = []
    for arch in archs:
        for d in dims:
            for impl in impls:
                text = main_text(compile_isa_texts(f"bench._isa_child:{impl}", ("attention", "bf16", [1, 2048, 32, d]),
                                                   arch=arch))
                st = max(parse_isa(text, arch), key=lambda k: k.instructions)
                name = f"{'ours' if impl == 'ours' else 'FlyDSL generic'} D{d}"
                c = hot_loop(text, arch)
                row = format_row(name, arch, c, steady=impl == "ours") + f" {st.meta['vgpr']} | {st.spills} | {st.occupancy[0]} |"
                rows.append((row, (arch, d, c)) if with_cycles else row)
    return rows


# ---- how often the rescale branch runs, measured under flysim ----------------------------------


def rate_inputs(seq: int, d: int, data: str, dtype: str = "bf16", seed: int = 0):
    """Q, K, V [1, 1, seq, d]. randn; "mean": Q and K with mean 1 (scores of mean sqrt(d), a
    row max that keeps creeping up); "ramp": K scaled by 0.25 .. 4.25 along the keys (scores
    grow along the sequence: a row max that outgrows 2^8 again and again)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, seq, d, generator=g) for _ in range(3))
    if data == "mean":
        q, k = q + 1, k + 1
    elif data == "ramp":
        k = k * (0.25 + 4 * torch.arange(seq) / seq).view(1, 1, -1, 1)
    dt = NAMED_DTYPES[dtype]
    return q.to(dt), k.to(dt), v.to(dt)


def rescale_rate(arch: str, d: int, causal: bool, data: str = "randn", seq: int = 1024, dtype: str = "bf16") -> dict:
    """Run the kernel under flysim at B1 H1 S=seq and count the rescale branch (see rescale_counts).
    `rate`: rescales per unmasked-loop iteration (what the hot loop's MODEL prices); `before_peel`:
    the same ratio had the first tile stayed in the loop (it always rescaled: m starts at -inf);
    `max_err` against fp32 SDPA."""
    import flysim
    import torch

    from translator_kernels.attention import attention

    q, k, v = rate_inputs(seq, d, data, dtype)
    with flysim.simulate(arch=arch, count_regions=True) as sim:
        out = attention(q, k, v, causal=causal)
    c = rescale_counts(sim.launches[-1])
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    loop, peeled, resc = c["loop_waves"], c["peeled_waves"], c["rescale_waves"]
    return dict(c, rate=resc / loop if loop else 0.0,
                before_peel=(resc + peeled) / (loop + peeled) if loop + peeled else 0.0,
                max_err=float((out.float() - ref).abs().max()))


def rescale_rows(archs=("gfx942", "gfx950"), dims=(64, 128), seq=1024, data=RATE_DATA, causal=(True, False)) -> list[str]:
    rows = []
    for arch in archs:
        for d in dims:
            for cz in causal:
                for dat in data:
                    r = rescale_rate(arch, d, cz, dat, seq)
                    rows.append(f"| {arch} | {d} | {int(cz)} | {dat} | {r['peeled_waves']} | {r['loop_waves']} | "
                                f"{r['rescale_waves']} | {r['rate']:.4f} | {r['before_peel']:.4f} | {r['max_err']:.4f} |")
    return rows


RESCALE_HEADER = ("| arch | D | causal | data | peeled first tiles | loop iterations | rescales | rescales / iteration "
                  "| before the peel | max abs err |\n|---|---|---|---|---|---|---|---|---|---|")


def _option(argv, name, default):
    return type(default)(argv[argv.index(name) + 1]) if name in argv else default


def main(argv):
    if "--diagonal" in argv:  # kernel-level matrix / vector of causal attention (bench/attention_diagonal.py)
        from bench.attention_diagonal import rows

        seqs = tuple(int(x) for x in str(_option(argv, "--seqs", "1024,2048,8192")).split(","))
        print("\n".join(rows(seqs=seqs)))
        return
    if "--rescale" in argv:
        seq = _option(argv, "--seq", 1024)
        print(f"Rescale branch executions under flysim, B1 H1 S{seq} bf16 (measured; per wave and KV tile)\n")
        print(RESCALE_HEADER)
        for row in rescale_rows(seq=seq):
            print(row, flush=True)
        return
    if "--hotloop" in argv:
        from bench.hotloop import HEADER

        seq, data = _option(argv, "--rate-seq", 1024), _option(argv, "--rate-data", "randn")
        head, rule = HEADER.split("\n")
        print("Hot-loop MODEL per KV iteration and wave, B1 S2048 H32 bf16 causal (not a measurement); expected ="
              f" steady + rate x rescale branch, rate measured under flysim at B1 H1 S{seq} causal, {data} inputs\n")
        print(head + " VGPR | spills | waves/SIMD | measured rescale rate | expected vector cyc (MODEL) "
              "| expected matrix/vector (MODEL) |")
        print(rule + "---|---|---|---|---|---|")
        for row, (arch, d, c) in hotloop_rows(with_cycles=True):
            tail = expected_cells(c, rescale_rate(arch, d, True, data, seq)["rate"]) if row.startswith("| ours") else " - | - | - |"
            print(row + tail, flush=True)
        return
    configs = QUICK if "--quick" in argv else CONFIGS
    print("| arch | dtype | D | causal | mask | VGPR | AGPR | SGPR | spills (v/s) | LDS B | waves/SIMD |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    only = [x for x in argv if x.endswith("-only")]
    archs = [a for a in ("gfx942", "gfx950") if not only or f"--{a}-only" in only]
    for arch in archs:
        for (dt, d, c, m), s in zip(configs, isa_stats_many(arch, configs)):
            print(f"| {arch} | {dt} | {d} | {int(c)} | {m} | {s['vgpr_count']} | {s['agpr_count']} | "
                  f"{s['sgpr_count']} | {s['vgpr_spill_count']}/{s['sgpr_spill_count']} | "
                  f"{s['group_segment_fixed_size']} | {s['waves_per_simd']} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
