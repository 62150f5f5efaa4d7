"""ISA statistics of one generated elementwise kernel, compiled without a GPU through
translator_kernels.isa (a child process: FlyDSL's COMPILE_ONLY / dump switches are process-wide).

    python -m bench.isa_elementwise '<program json>' '[[shape], ...]' '["f32", ...]' gfx942
"""

from __future__ import annotations

import json
import sys

from translator_kernels.isa import compile_isa
from translator_kernels.isa import summary_row as row
from translator_kernels.isa import tensor_specs


def isa_stats(program: str, shapes, dtypes, arch: str) -> dict:
    c = compile_isa("translator_kernels.codegen.elementwise:fused_elementwise", (tensor_specs(shapes, dtypes), program),
                    arch=arch)
    return row(c)


if __name__ == "__main__":
    print(json.dumps(isa_stats(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4])))
