"""ISA statistics of one generated scan kernel, compiled without a GPU through
translator_kernels.isa (a child process); same fields as elementwise_isa.

    python -m bench.isa_scan '<program>' '[[shape], ...]' '["f32", ...]' cumsum -1 0 0 gfx942
"""

from __future__ import annotations

import json
import sys

from translator_kernels.isa import summary_row as row
from translator_kernels.isa import tensor_specs
from translator_kernels.isa import compile_isa


def isa_stats(program: str, shapes, dtypes, kind: str, dim: int, reverse: bool, exclusive: bool, arch: str) -> dict:
    args = (tensor_specs(shapes, dtypes), program, kind, dim, reverse, exclusive)
    return row(compile_isa("translator_kernels.codegen.scan:scan", args, arch=arch))


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(isa_stats(a[0], json.loads(a[1]), json.loads(a[2]), a[3], int(a[4]), a[5] == "1", a[6] == "1",
                               a[7])))
