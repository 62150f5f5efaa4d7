"""ISA statistics of the attention kernel per config and arch (no GPU needed).

    .venv/bin/python -m bench.isa_attention \
        [--quick] [--gfx942-only | --gfx950-only]
    FLYDSL_SRC=<FlyDSL checkout> .venv/bin/python -m bench.isa_attention --hotloop

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
work its iterations need (LDS writes, the causal mask).
"""

from __future__ import annotations

import sys

from translator_kernels.isa import compile_many

_ENTRY = "bench.isa_attention:_compile_one"


def _compile_one(dtype, head_dim, causal, mask, sq, sk, hkv):
    """Launch one config on zero tensors (runs in the child, under COMPILE_ONLY)."""
    import torch

    from translator_kernels.attention import attention

    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    q = torch.zeros(1, 4, sq, head_dim, dtype=dt)
    k = torch.zeros(1, hkv, sk, head_dim, dtype=dt)
    m = {"none": None, "bool": torch.ones(sq, sk, dtype=torch.bool), "add": torch.zeros(sq, sk)}[mask]
    attention(q, k, torch.zeros_like(k), mask=m, causal=causal)


def _row(s) -> dict:
    return {"vgpr_count": s.meta["vgpr"], "agpr_count": s.meta["agpr"], "sgpr_count": s.meta["sgpr"],
            "vgpr_spill_count": s.meta["vgpr_spill"], "sgpr_spill_count": s.meta["sgpr_spill"],
            "group_segment_fixed_size": s.meta["lds"], "waves_per_simd": s.occupancy[0]}


def isa_stats_many(arch, configs, sq=128, sk=128, hkv=4) -> list:
    """configs: [(dtype, head_dim, causal, mask)]; per config a dict of ISA metadata (one child)."""
    jobs = [(_ENTRY, (dt, d, c, m, sq, sk, hkv), {}) for dt, d, c, m in configs]
    out = []
    for (dt, d, _, _), r in zip(configs, compile_many(jobs, arch)):
        if isinstance(r, Exception):
            raise RuntimeError(f"compile failed for {arch} {dt} D={d}:\n{r}")
        out.append(_row(r.main))
    return out


def isa_stats(arch, dtype, head_dim, causal=False, mask="none", sq=128, sk=128, hkv=4):
    """Compile one config for `arch` and return its ISA metadata as a dict."""
    return isa_stats_many(arch, [(dtype, head_dim, causal, mask)], sq, sk, hkv)[0]


CONFIGS = [(dt, d, c, m) for dt in ("bf16", "f16", "f32") for d in (32, 64, 80, 96, 128, 256)
           for c, m in ((False, "none"), (True, "none"))] + [
    (dt, 128, False, m) for dt in ("bf16", "f32") for m in ("bool", "add")]
QUICK = [("bf16", 64, False, "none"), ("bf16", 128, True, "none"), ("f32", 64, False, "none"),
         ("f16", 256, False, "add")]


def hotloop_rows(archs=("gfx942", "gfx950"), dims=(64, 128)) -> list[str]:
    """Markdown rows of the hot-loop comparison (see the module docstring)."""
    import os

    from bench.hotloop import compile_isa_texts, format_row, hot_loop, main_text
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
                rows.append(format_row(name, arch, hot_loop(text, arch), steady=impl == "ours")
                            + f" {st.meta['vgpr']} | {st.spills} | {st.occupancy[0]} |")
    return rows


def main(argv):
    if "--hotloop" in argv:
        from bench.hotloop import HEADER

        head, rule = HEADER.split("\n")
        print("Hot-loop MODEL per KV iteration and wave, B1 S2048 H32 bf16 causal (not a measurement)\n")
        print(head + " VGPR | spills | waves/SIMD |")
        print(rule + "---|---|---|")
        for row in hotloop_rows():
            print(row, flush=True)
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
