"""ISA statistics of one generated elementwise kernel: compile without a GPU (a subprocess,
since FlyDSL's COMPILE_ONLY / dump switches are process-wide) and read the metadata.

    python -m translator_kernels.elementwise_isa '<program json>' '[[shape], ...]' '["f32", ...]' gfx942
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
           "vgpr_spill": r"\.vgpr_spill_count:\s+(\d+)", "sgpr_spill": r"\.sgpr_spill_count:\s+(\d+)"}


def isa_stats(program: str, shapes, dtypes, arch: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DUMP_IR="1",
                   FLYDSL_DUMP_DIR=d, FLYDSL_RUNTIME_ENABLE_CACHE="0")
        args = [program, json.dumps([list(s) for s in shapes]), json.dumps(list(dtypes)), arch]
        proc = subprocess.run([sys.executable, "-m", "translator_kernels.elementwise_isa", *args],
                              env=env, capture_output=True, text=True)
        isa = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith("final_isa.s")]
        if proc.returncode or not isa:
            raise RuntimeError(f"elementwise ISA compile failed ({arch}):\n{proc.stderr[-3000:]}")
        text = open(isa[0]).read()
    stats = {k: int(re.search(p, text).group(1)) for k, p in _FIELDS.items()}
    stats["loads"] = sorted(set(re.findall(r"^\s*(buffer_load_\w+)", text, re.M)))
    stats["stores"] = sorted(set(re.findall(r"^\s*(buffer_store_\w+)", text, re.M)))
    return stats


def _main(program, shapes, dtypes, arch):
    if "ROCM_PATH" not in os.environ or not os.path.exists(os.path.join(os.environ["ROCM_PATH"], "llvm/bin/ld.lld")):
        from flysim.toolchain import ensure_compile_env

        ensure_compile_env(arch)
        os.environ["COMPILE_ONLY"] = "1"
    from .elementwise import fused_elementwise
    from .elementwise_program import TORCH

    inputs = [torch.zeros(s, dtype=TORCH[dt]) for s, dt in zip(shapes, dtypes)]
    fused_elementwise(inputs, program)


if __name__ == "__main__":
    _main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4])
