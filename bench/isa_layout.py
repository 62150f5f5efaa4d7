"""ISA statistics of the layout kernel for each data-movement op, compiled without a GPU through
translator_kernels.isa (one child process per arch): registers, spills, and the widths of the
buffer loads and stores (128-bit where the map keeps vectors contiguous).

    python -m bench.isa_layout [gfx942|gfx950 ...]
"""

from __future__ import annotations

import json
import sys

from translator_kernels.measure.layout_isa import isa_rows


if __name__ == "__main__":
    for arch in sys.argv[1:] or ["gfx942", "gfx950"]:
        print(arch)
        for name, row in isa_rows(arch).items():
            print(f"  {name:36s} {json.dumps(row)}")
