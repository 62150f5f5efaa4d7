"""ISA statistics of the GEMM for one tile config: compile to AMDGPU ISA without a GPU (through
translator_kernels.isa, in a child process) and read the kernel metadata (VGPRs, SGPRs, spills,
LDS bytes, static MFMA count, occupancy bound).

    python -m bench.isa_gemm --table   (regenerates docs/gemm.md's table)
"""

from __future__ import annotations

import json
import sys

import torch

from translator_kernels.isa import compile_many, occupancy

_ENTRY = "bench.isa_gemm:_compile_one"


def waves_per_simd(vgpr: int, lds_bytes: int, arch: str) -> int:
    """Occupancy bound (waves per SIMD) of a 4-wave workgroup from VGPRs and LDS (translator_kernels.isa's model)."""
    return occupancy(vgpr, 0, lds_bytes, 256, arch)[0]


def _spec(n, k, dtype, arch, bm, bn, bk, activation=None, bias=False, residual=False, out_dtype=None) -> dict:
    return dict(n=n, k=k, dtype=dtype, arch=arch, bm=bm, bn=bn, bk=bk, activation=activation, bias=bias,
                residual=residual, out_dtype=out_dtype or dtype)


def _row(spec, compiled) -> dict:
    if isinstance(compiled, Exception):
        raise RuntimeError(f"gemm ISA compile failed for {spec}:\n{compiled}")
    s = compiled.main
    w, _ = s.occupancy
    return dict(spec, vgpr=s.meta["vgpr"], sgpr=s.meta["sgpr"], vgpr_spill=s.meta["vgpr_spill"],
                sgpr_spill=s.meta["sgpr_spill"], lds_bytes=s.meta["lds"], agpr=s.meta["agpr"],
                mfma_static=s.mix.get("MFMA", 0), mfma_ops=s.mnemonics("v_mfma"), waves_per_simd=w)


def isa_stats_many(specs: list[dict]) -> list[dict]:
    """Several configs, one child per arch."""
    out: dict = {}
    for arch in dict.fromkeys(s["arch"] for s in specs):
        idx = [i for i, s in enumerate(specs) if s["arch"] == arch]
        for i, c in zip(idx, compile_many([(_ENTRY, (specs[i],), {}) for i in idx], arch)):
            out[i] = _row(specs[i], c)
    return [out[i] for i in range(len(specs))]


def isa_stats(n, k, dtype, arch, bm, bn, bk, *, activation=None, bias=False, residual=False, out_dtype=None):
    """Compile the GEMM for one config in a child process; return a dict of ISA statistics."""
    return isa_stats_many([_spec(n, k, dtype, arch, bm, bn, bk, activation, bias, residual, out_dtype)])[0]


def _compile_one(spec):
    """Launch the GEMM for `spec` at M = 2 * BM + 1 under COMPILE_ONLY (runs in the child)."""
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.gemm.preshuffle import padded_shape

    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    n, k = spec["n"], spec["k"]
    n_pad, k_pad = padded_shape(n, k)
    m = 2 * spec["bm"] + 1
    dt, odt = tdt[spec["dtype"]], tdt[spec["out_dtype"]]
    launch = build_gemm.__wrapped__(n, k, n_pad, k_pad, spec["dtype"], spec["out_dtype"], spec["arch"], spec["bm"],
                                    spec["bn"], spec["bk"], spec["activation"], spec["bias"], spec["residual"])
    a, w, c = torch.zeros(m, k, dtype=dt), torch.zeros(n_pad, k_pad, dtype=dt), torch.zeros(m, n, dtype=odt)
    launch(c, a, w, torch.zeros(n), c, m, 1, 0, 0, 0, 1.0, a.numel() * a.element_size(),
           w.numel() * w.element_size(), c.numel() * c.element_size())


def markdown_table(n=4096, k=4096, archs=("gfx942", "gfx950"), dtypes=("f32", "bf16", "f16"),
                   buckets=(16, 32, 64, 128)):
    """The chosen tile of every (arch, dtype, M bucket) at N x K, compiled with the full epilogue."""
    from translator_kernels.gemm import choose_config

    rows = ["| arch | dtype | M bucket | tile BMxBNxBK | VGPR | AGPR | SGPR | spills (v/s) | LDS B | waves/SIMD | MFMA op (static count) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = [(a, d, b) for a in archs for d in dtypes for b in buckets]
    cfgs = [choose_config(mb, n, k, dt, arch) for arch, dt, mb in keys]
    stats = isa_stats_many([_spec(n, k, dt, arch, c.bm, c.bn, c.bk, "gelu", True, True)
                            for (arch, dt, _), c in zip(keys, cfgs)])
    for (arch, dt, mb), c, s in zip(keys, cfgs, stats):
        rows.append(f"| {arch} | {dt} | {mb} | {c.bm}x{c.bn}x{c.bk} | {s['vgpr']} | {s['agpr']} | {s['sgpr']} | "
                    f"{s['vgpr_spill']}/{s['sgpr_spill']} | {s['lds_bytes']} | {s['waves_per_simd']} | "
                    f"{', '.join(s['mfma_ops'])} ({s['mfma_static']}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(markdown_table())
    else:  # one spec as JSON, compiled in this process (the caller sets COMPILE_ONLY and the dump switches)
        _compile_one(json.loads(sys.argv[1]))
