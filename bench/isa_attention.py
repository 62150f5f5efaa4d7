"""ISA statistics of the attention kernel per config and arch (no GPU needed).

    .venv/bin/python -m bench.isa_attention \
        [--quick] [--gfx942-only | --gfx950-only]

Each config is compiled to AMDGPU ISA through translator_kernels.isa (COMPILE_ONLY in a child
process, one child per arch) and the metadata of its final ISA is read back: VGPR / AGPR / SGPR
counts, spills, LDS bytes, and occupancy (translator_kernels.isa's model). Prints a markdown table.
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


def main(argv):
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
