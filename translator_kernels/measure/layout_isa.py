"""ISA statistics of the layout kernel for each data-movement op, compiled without a GPU through
translator_kernels.isa (one child process per arch): registers, spills, and the widths of the
buffer loads and stores (128-bit where the map keeps vectors contiguous). The tests assert on
these rows; bench.isa_layout prints them.
"""

from __future__ import annotations

from translator_kernels.isa import TensorSpec, compile_many

E = "translator_kernels.layout:"
X = TensorSpec((64, 1024), "float32")
B = TensorSpec((64, 1024), "bfloat16")
IDS = TensorSpec((48,), "int64")
CASES = {  # name -> (entry, args)
    "pad f32 (8, 8)": (E + "pad", (X, [8, 8], "constant", 0.0)),
    "pad bf16 reflect (3, 3)": (E + "pad", (B, [3, 3], "reflect", 0.0)),
    "roll bf16 (-5, dim 0)": (E + "roll", (B, [-5], [0])),
    "repeat f32 (2, 3)": (E + "repeat", (X, [2, 3])),
    "expand f32 [64,1] -> [64,1024]": (E + "expand", (TensorSpec((64, 1), "float32"), [64, 1024])),
    "index_select f32 dim 0, int64 ids": (E + "index_select", (X, 0, IDS)),
    "unfold bf16 dim 1 (16, 8)": (E + "unfold", (B, 1, 16, 8)),
    "repeat_interleave bf16 x2 dim 0": (E + "repeat_interleave", (B, 2, 0)),
    "fill f32 [64,1024]": (E + "fill", ([64, 1024], 0.0, "float32")),
}


def _job(entry, args):
    if entry.endswith(":fill"):  # the dtype travels by name (jobs are pickled)
        import torch

        return entry, (args[0], args[1], getattr(torch, args[2])), {}
    return entry, args, {}


def isa_rows(arch: str) -> dict:
    """{case: {vgpr, sgpr, spills, loads, stores, waves_per_simd}} for `arch`."""
    results = compile_many([_job(*c) for c in CASES.values()], arch)
    rows = {}
    for name, r in zip(CASES, results):
        if isinstance(r, Exception):
            rows[name] = {"error": str(r)[:200]}
            continue
        s = r.main
        rows[name] = dict(vgpr=s.meta["vgpr"], sgpr=s.meta["sgpr"], spills=s.spills, loads=s.mnemonics("buffer_load"),
                          stores=s.mnemonics("buffer_store"), waves_per_simd=s.occupancy[0])
    return rows
