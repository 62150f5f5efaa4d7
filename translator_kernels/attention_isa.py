"""ISA statistics of the attention kernel per config and arch (no GPU needed).

    ROCM_PATH=/work/main/.toolchain/rocm .venv/bin/python -m translator_kernels.attention_isa \
        [--quick] [--gfx942-only | --gfx950-only]

Each config is compiled to AMDGPU ISA with COMPILE_ONLY=1 in a subprocess (the arch is read
from the environment) with FLYDSL_DUMP_IR, and the metadata of 22_final_isa.s is read back:
VGPR / AGPR / SGPR counts, spills, LDS bytes, and occupancy (waves per SIMD from the VGPR
count, 512 registers per lane on CDNA3/4). Prints a markdown table.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile

_FIELDS = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
           "group_segment_fixed_size")

_CHILD = r"""
import sys, torch
from translator_kernels.attention import attention
dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[sys.argv[1]]
D, causal, mask, sq, sk, hkv = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
q = torch.zeros(1, 4, sq, D, dtype=dt); k = torch.zeros(1, hkv, sk, D, dtype=dt); v = torch.zeros_like(k)
m = None
if mask == "bool": m = torch.ones(sq, sk, dtype=torch.bool)
if mask == "add": m = torch.zeros(sq, sk, dtype=torch.float32)
attention(q, k, v, mask=m, causal=causal)
"""


def isa_stats(arch, dtype, head_dim, causal=False, mask="none", sq=128, sk=128, hkv=4):
    """Compile one config for `arch` and return its ISA metadata as a dict."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DUMP_IR="1",
                   FLYDSL_DUMP_DIR=d, FLYDSL_RUNTIME_ENABLE_CACHE="0")
        env.setdefault("ROCM_PATH", os.path.join(os.path.dirname(__file__), "..", ".toolchain", "rocm"))
        args = [sys.executable, "-c", _CHILD, dtype, str(head_dim), "1" if causal else "0", mask,
                str(sq), str(sk), str(hkv)]
        p = subprocess.run(args, env=env, capture_output=True, text=True)
        isa = glob.glob(os.path.join(d, "*", "22_final_isa.s"))
        if p.returncode or not isa:
            raise RuntimeError(f"compile failed for {arch} {dtype} D={head_dim}:\n{p.stderr[-3000:]}")
        text = open(isa[0]).read()
    out = {}
    for f in _FIELDS:
        m = re.search(rf"^\s+\.{f}:\s+(\d+)", text, re.M)
        out[f] = int(m.group(1)) if m else 0
    regs = out["vgpr_count"] + out["agpr_count"]
    out["waves_per_simd"] = min(8, 512 // max(8, -(-regs // 8) * 8))
    return out


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
        for dt, d, c, m in configs:
            s = isa_stats(arch, dt, d, c, m)
            print(f"| {arch} | {dt} | {d} | {int(c)} | {m} | {s['vgpr_count']} | {s['agpr_count']} | "
                  f"{s['sgpr_count']} | {s['vgpr_spill_count']}/{s['sgpr_spill_count']} | "
                  f"{s['group_segment_fixed_size']} | {s['waves_per_simd']} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
