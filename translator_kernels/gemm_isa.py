"""ISA statistics of the GEMM for one tile config: compile to AMDGPU ISA without a GPU and read
the kernel metadata (VGPRs, SGPRs, spills, LDS bytes, static MFMA count, occupancy bound).

Runs the compile in a subprocess (`python -m translator_kernels.gemm_isa ...`) because FlyDSL's
COMPILE_ONLY / dump switches are process-wide environment variables.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch

_FIELDS = {"vgpr": r"\.vgpr_count:\s+(\d+)", "sgpr": r"\.sgpr_count:\s+(\d+)",
           "vgpr_spill": r"\.vgpr_spill_count:\s+(\d+)", "sgpr_spill": r"\.sgpr_spill_count:\s+(\d+)",
           "lds_bytes": r"\.group_segment_fixed_size:\s+(\d+)", "agpr": r"\.agpr_count:\s+(\d+)"}


def waves_per_simd(vgpr: int, lds_bytes: int, arch: str) -> int:
    """Occupancy bound (waves per SIMD) from VGPRs (512-entry unified file, granule 8) and LDS
    (4-wave workgroups; 64 KiB per CU on gfx942, 160 KiB on gfx950)."""
    granule = -(-max(vgpr, 1) // 8) * 8
    by_vgpr = min(8, 512 // granule)
    lds_cu = (160 if arch.startswith("gfx950") else 64) * 1024
    by_lds = 8 if lds_bytes == 0 else min(8, lds_cu // lds_bytes)  # one wave per SIMD per workgroup
    return min(by_vgpr, by_lds)


def isa_stats(n, k, dtype, arch, bm, bn, bk, *, activation=None, bias=False, residual=False, out_dtype=None):
    """Compile the GEMM for one config in a subprocess; return a dict of ISA statistics."""
    spec = dict(n=n, k=k, dtype=dtype, arch=arch, bm=bm, bn=bn, bk=bk, activation=activation, bias=bias,
                residual=residual, out_dtype=out_dtype or dtype)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DUMP_IR="1",
                   FLYDSL_DUMP_DIR=d, FLYDSL_RUNTIME_ENABLE_CACHE="0")
        proc = subprocess.run([sys.executable, "-m", "translator_kernels.gemm_isa", json.dumps(spec)],
                              env=env, capture_output=True, text=True)
        isa = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith("final_isa.s")]
        if proc.returncode or not isa:
            raise RuntimeError(f"gemm ISA compile failed for {spec}:\n{proc.stderr[-3000:]}")
        text = open(isa[0]).read()
    stats = {key: int(re.search(pat, text).group(1)) for key, pat in _FIELDS.items()}
    stats["mfma_static"] = len(re.findall(r"^\s*v_mfma", text, re.M))
    stats["mfma_ops"] = sorted(set(re.findall(r"^\s*(v_mfma\w+)", text, re.M)))
    stats["waves_per_simd"] = waves_per_simd(stats["vgpr"], stats["lds_bytes"], arch)
    return dict(spec, **stats)


def _compile_one(spec):
    from .gemm_kernel import build_gemm
    from .preshuffle import padded_shape

    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if "ROCM_PATH" not in os.environ or not os.path.exists(os.path.join(os.environ["ROCM_PATH"], "llvm/bin/ld.lld")):
        from flysim.toolchain import ensure_compile_env  # finds an ld.lld for the ISA link step

        ensure_compile_env(spec["arch"])
        os.environ["COMPILE_ONLY"] = "1"
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
    from .gemm import choose_config

    rows = ["| arch | dtype | M bucket | tile BMxBNxBK | VGPR | AGPR | SGPR | spills (v/s) | LDS B | waves/SIMD | MFMA op (static count) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arch, dt, mb in ((a, d, b) for a in archs for d in dtypes for b in buckets):
        c = choose_config(mb, n, k, dt, arch)
        s = isa_stats(n, k, dt, arch, c.bm, c.bn, c.bk, activation="gelu", bias=True, residual=True)
        rows.append(f"| {arch} | {dt} | {mb} | {c.bm}x{c.bn}x{c.bk} | {s['vgpr']} | {s['agpr']} | {s['sgpr']} | "
                    f"{s['vgpr_spill']}/{s['sgpr_spill']} | {s['lds_bytes']} | {s['waves_per_simd']} | "
                    f"{', '.join(s['mfma_ops'])} ({s['mfma_static']}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1] == "--table":  # python -m translator_kernels.gemm_isa --table  (regenerates notes/gemm.md's table)
        print(markdown_table())
    else:
        _compile_one(json.loads(sys.argv[1]))
