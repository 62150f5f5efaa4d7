"""ISA statistics of one generated reduction kernel, compiled without a GPU in a subprocess
(FlyDSL's COMPILE_ONLY / dump switches are process-wide); same fields as elementwise_isa.

    python -m translator_kernels.reduce_isa '<program>' '[[shape], ...]' '["f32", ...]' sum '[1]' '[]' gfx942
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch

from .elementwise_isa import _FIELDS


def isa_stats(program: str, shapes, dtypes, kind: str, dims, params, arch: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DUMP_IR="1",
                   FLYDSL_DUMP_DIR=d, FLYDSL_RUNTIME_ENABLE_CACHE="0")
        args = [program, json.dumps([list(s) for s in shapes]), json.dumps(list(dtypes)), kind,
                json.dumps(list(dims)), json.dumps(list(params)), arch]
        proc = subprocess.run([sys.executable, "-m", "translator_kernels.reduce_isa", *args],
                              env=env, capture_output=True, text=True)
        isa = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith("final_isa.s")]
        if proc.returncode or not isa:
            raise RuntimeError(f"reduce ISA compile failed ({arch}):\n{proc.stderr[-3000:]}")
        text = open(isa[0]).read()
    stats = {k: int(re.search(p, text).group(1)) for k, p in _FIELDS.items()}
    stats["lds"] = int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", text).group(1))
    stats["loads"] = sorted(set(re.findall(r"^\s*(buffer_load_\w+)", text, re.M)))
    stats["stores"] = sorted(set(re.findall(r"^\s*(buffer_store_\w+)", text, re.M)))
    return stats


def _main(program, shapes, dtypes, kind, dims, params, arch):
    if "ROCM_PATH" not in os.environ or not os.path.exists(os.path.join(os.environ["ROCM_PATH"], "llvm/bin/ld.lld")):
        from flysim.toolchain import ensure_compile_env

        ensure_compile_env(arch)
        os.environ["COMPILE_ONLY"] = "1"
    from .elementwise_program import TORCH
    from .reduce import fused_reduce

    inputs = [torch.zeros(s, dtype=TORCH[dt]) for s, dt in zip(shapes, dtypes)]
    fused_reduce(inputs, program, kind, dims, False, params)


if __name__ == "__main__":
    a = sys.argv[1:]
    _main(a[0], json.loads(a[1]), json.loads(a[2]), a[3], json.loads(a[4]), json.loads(a[5]), a[6])
