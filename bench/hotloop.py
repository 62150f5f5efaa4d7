"""Print the hot-loop MODEL (translator_kernels/hotloop.py) of a kernel: matrix, vector and LDS
cycles per loop iteration (not a measurement).

    python -m bench.hotloop FILE.s [--arch gfx942] [--kernel NAME]      any dumped ISA
    python -m bench.hotloop --attention [--arch gfx950] [--dtype bf16] [--d 128]
"""

from __future__ import annotations

import argparse
import os
import sys

from translator_kernels.hotloop import compile_isa_texts, hot_loop, main_text


def format_row(name: str, arch: str, c: dict, steady: bool = True) -> str:
    """One markdown row; `steady=False` leaves the steady columns empty (a kernel whose skipped
    tail is not known to be rare)."""
    n, st = c["counts"], c["steady"]
    tail = (f"{st['counts']['VALU']} ({st['counts']['trans']} trans) | {st['vector_cycles']} | "
            f"{st['matrix_over_vector']:.2f} |") if steady else "- | - | - |"
    return (f"| {name} | {arch} | {n['MFMA']} | {c['matrix_cycles']} | {n['VALU']} ({n['trans']} trans) | "
            f"{c['vector_cycles']} | {n['LDS']} | {c['lds_cycles']} | {n['vmem']} | "
            f"{c['matrix_over_vector']:.2f} | {c['bound']} | " + tail)


HEADER = ("| kernel | arch | MFMA | matrix cyc | VALU | vector cyc | LDS ops | LDS cyc | VMEM | matrix/vector "
          "| bound | steady VALU | steady vector cyc | steady matrix/vector |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hotloop", description=__doc__.splitlines()[0])
    p.add_argument("isa", nargs="?", help="an ISA file (e.g. a FLYDSL_DUMP_IR 22_final_isa.s)")
    p.add_argument("--arch", default="gfx942", choices=["gfx942", "gfx950"])
    p.add_argument("--kernel", help="kernel symbol in the ISA file (default: the first)")
    p.add_argument("--attention", action="store_true", help="compile our attention kernel (B1 S2048 H32, causal)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--ops", action="store_true", help="also list the loop body's mnemonics")
    a = p.parse_args(argv)
    if a.attention:
        text = main_text(compile_isa_texts("bench._isa_child:ours", ("attention", a.dtype, [1, 2048, 32, a.d]),
                                           arch=a.arch))
        name = f"attention {a.dtype} D{a.d}"
    elif a.isa:
        text, name = open(a.isa).read(), os.path.basename(a.isa)
    else:
        p.error("give an ISA file or --attention")
    c = hot_loop(text, a.arch, a.kernel)
    print("Hot-loop MODEL, cycles per iteration per wave (not a measurement; see translator_kernels/hotloop.py)\n")
    print(HEADER)
    print(format_row(name, a.arch, c))
    if a.ops:
        print("\n" + " ".join(f"{mn}x{n}" for mn, n in c["ops"].items()))
        if c["skipped"]:
            print("\nskipped by the steady path: " + " ".join(f"{mn}x{n}" for mn, n in c["skipped"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
