"""ISA statistics of one generated reduction kernel, compiled without a GPU through
translator_kernels.isa (a child process); same fields as elementwise_isa.

    python -m bench.isa_reduce '<program>' '[[shape], ...]' '["f32", ...]' sum '[1]' '[]' gfx942
"""

from __future__ import annotations

import json
import sys

from translator_kernels.isa import summary_row as row
from translator_kernels.isa import tensor_specs
from translator_kernels.isa import compile_isa


def isa_stats(program: str, shapes, dtypes, kind: str, dims, params, arch: str) -> dict:
    args = (tensor_specs(shapes, dtypes), program, kind, list(dims), False, tuple(params))
    return row(compile_isa("translator_kernels.codegen.reduce:fused_reduce", args, arch=arch))


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(isa_stats(a[0], json.loads(a[1]), json.loads(a[2]), a[3], json.loads(a[4]), json.loads(a[5]),
                               a[6])))
