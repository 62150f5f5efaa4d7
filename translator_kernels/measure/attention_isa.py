"""ISA statistics of the attention kernel (compiled without a GPU, in a child process) and the
readers of flysim's region counters that price its rescale branch. The tests assert on them;
bench.isa_attention prints them.
"""

from __future__ import annotations

from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.isa import compile_many

ENTRY = "translator_kernels.measure.attention_isa:compile_one"


def compile_one(dtype, head_dim, causal, mask, sq, sk, hkv):
    """Launch one config on zero tensors (runs in the child, under COMPILE_ONLY)."""
    import torch

    from translator_kernels.attention import attention

    dt = NAMED_DTYPES[dtype]
    q = torch.zeros(1, 4, sq, head_dim, dtype=dt)
    k = torch.zeros(1, hkv, sk, head_dim, dtype=dt)
    m = {"none": None, "bool": torch.ones(sq, sk, dtype=torch.bool), "add": torch.zeros(sq, sk)}[mask]
    attention(q, k, torch.zeros_like(k), mask=m, causal=causal)


def compile_bshd(dtype, shape):
    """Launch causal attention on empty [B, H, S, D] tensors from a [B, S, H, D] shape (bench.isa's
    convention; runs in the child, under COMPILE_ONLY)."""
    import torch

    from translator_kernels.attention import attention

    b, s, h, d = shape
    q = torch.empty(b, h, s, d, dtype=NAMED_DTYPES[dtype])
    attention(q, torch.empty_like(q), torch.empty_like(q), causal=True)


def row(s) -> dict:
    return {"vgpr_count": s.meta["vgpr"], "agpr_count": s.meta["agpr"], "sgpr_count": s.meta["sgpr"],
            "vgpr_spill_count": s.meta["vgpr_spill"], "sgpr_spill_count": s.meta["sgpr_spill"],
            "group_segment_fixed_size": s.meta["lds"], "waves_per_simd": s.occupancy[0]}


def isa_stats_many(arch, configs, sq=128, sk=128, hkv=4) -> list:
    """configs: [(dtype, head_dim, causal, mask)]; per config a dict of ISA metadata (one child)."""
    jobs = [(ENTRY, (dt, d, c, m, sq, sk, hkv), {}) for dt, d, c, m in configs]
    out = []
    for (dt, d, _, _), r in zip(configs, compile_many(jobs, arch)):
        if isinstance(r, Exception):
            raise RuntimeError(f"compile failed for {arch} {dt} D={d}:\n{r}")
        out.append(row(r.main))
    return out


def isa_stats(arch, dtype, head_dim, causal=False, mask="none", sq=128, sk=128, hkv=4):
    """Compile one config for `arch` and return its ISA metadata as a dict."""
    return isa_stats_many(arch, [(dtype, head_dim, causal, mask)], sq, sk, hkv)[0]


# statements of the kernel source whose scf ops region_waves counts (found by text, so the counts
# follow the code when it moves): the rescale branch, the unmasked KV loop, its peeled first tile
_MARKS = {"rescale": "if any_grow:", "loop": "for it_idx, state in range(", "peel": "for _p, state in range("}


def _region_lines() -> dict:
    from pathlib import Path

    import translator_kernels.attention as pkg

    found = {name: [] for name in _MARKS}
    for fn in sorted(Path(pkg.__file__).parent.glob("*.py")):
        for i, ln in enumerate(fn.read_text().splitlines(), 1):
            for name, mark in _MARKS.items():
                if ln.strip().startswith(mark):
                    found[name].append(f"/{fn.name}:{i}")
    return found


def rescale_counts(rec) -> dict:
    """From the LaunchRecord of a `flysim.simulate(count_regions=True)` attention launch: waves that
    ran the rescale branch, unmasked-loop iterations (wave x KV tile) and peeled first tiles."""
    regions, lines = rec.counters["region_waves"], _region_lines()

    def total(name, kind, side):
        return sum(v[side] for k, v in regions.items() for at in lines[name] if k.endswith(f"{at} {kind}"))

    return {"rescale_waves": total("rescale", "scf.if", "then"), "loop_waves": total("loop", "scf.for", "iterations"),
            "peeled_waves": total("peel", "scf.for", "iterations")}


def expected_cells(c: dict, rate: float) -> str:
    """MODEL cells: the steady vector cycles + rate x the rescale branch's cycles (static - steady)."""
    vec = c["steady"]["vector_cycles"] + rate * (c["vector_cycles"] - c["steady"]["vector_cycles"])
    return f" {rate:.4f} | {vec:.0f} | {c['matrix_cycles'] / vec:.2f} |"
