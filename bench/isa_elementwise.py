"""ISA statistics of one generated elementwise kernel, compiled without a GPU through
translator_kernels.isa (a child process: FlyDSL's COMPILE_ONLY / dump switches are process-wide).

    python -m bench.isa_elementwise '<program json>' '[[shape], ...]' '["f32", ...]' gfx942
"""

from __future__ import annotations

import json
import sys

from translator_kernels.isa import TensorSpec, compile_isa

_TORCH_NAME = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def tensor_specs(shapes, dtypes) -> list[TensorSpec]:
    """Zero-input specs for kernel-program dtype names (f32 / bf16 / f16 or torch names)."""
    return [TensorSpec(tuple(s), _TORCH_NAME.get(dt, dt)) for s, dt in zip(shapes, dtypes)]


def row(compiled) -> dict:
    """The main kernel's metadata (vgpr, agpr, sgpr, vgpr_spill, sgpr_spill, lds, block), its buffer
    load / store mnemonics and occupancy."""
    s = compiled.main
    return dict(s.meta, loads=s.mnemonics("buffer_load"), stores=s.mnemonics("buffer_store"),
                waves_per_simd=s.occupancy[0])


def isa_stats(program: str, shapes, dtypes, arch: str) -> dict:
    c = compile_isa("translator_kernels.codegen.elementwise:fused_elementwise", (tensor_specs(shapes, dtypes), program),
                    arch=arch)
    return row(c)


if __name__ == "__main__":
    print(json.dumps(isa_stats(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4])))
