"""ISA statistics of the MoE grouped GEMM against the dense GEMM at equal tiles (COMPILE_ONLY, no GPU).

Both are translator_kernels/gemm/kernel.py's kernel; the grouped one (`grouped=True`) reads its M tile's
expert (one int32 load per workgroup, made uniform), exits where it is -1 (a tile past the real rows,
moe/tile_exit.py) and offsets W by expert x stride. The table shows what that
costs in registers, instructions and occupancy, for the gate/up projection (gated SwiGLU epilogue) and
the down projection at Mixtral-8x7B's expert shapes (H = 4096, I = 14336), bf16.

    python -m bench.isa_moe            # markdown table, both archs
"""

from __future__ import annotations

import argparse

import torch

from translator_kernels.isa import compile_many

_ENTRY = "bench.isa_moe:_compile_one"
SHAPES = {"up (gated)": (14336, 4096, "silu"), "down": (4096, 14336, None)}
TILES = [(16, 128, 64), (64, 128, 64), (128, 128, 64)]
SPLIT = 4  # decode's down projection at 16x128x64 also compiled split-K (moe/grouped.py grouped_split: Mixtral, T = 1)


def _compile_one(spec):
    """Launch one GEMM (dense or grouped) under COMPILE_ONLY (runs in the compile child)."""
    from translator_kernels.gemm.gated import gated_shape
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.gemm.preshuffle import padded_shape

    n, k, gate, bm, bn, bk = spec["n"], spec["k"], spec["gate"], spec["bm"], spec["bn"], spec["bk"]
    n_pad, k_pad = gated_shape(n, k) if gate else padded_shape(n, k)
    split = spec.get("split", 1)
    launch = build_gemm.__wrapped__(n, k, n_pad, k_pad, "bf16", "bf16", spec["arch"], bm, bn, bk, None, False, False,
                                    split, "shuffled", gate, 1, grouped=spec["grouped"])
    m, e = 4 * bm, 2 if spec["grouped"] else 1
    a, w, c = torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(e, n_pad, k_pad, dtype=torch.bfloat16), \
        torch.zeros(m, n, dtype=torch.bfloat16)
    tiles = torch.zeros(4, dtype=torch.int32)
    # split-K: P the fp32 partials, Cnt the tickets, and a grouped kernel's tile map in the residual slot
    res, cnt = (tiles if spec["grouped"] else c, torch.zeros(64, dtype=torch.int32)) if split > 1 else (c, tiles)
    launch(c, a, w, torch.zeros(1), res, torch.zeros(1), cnt, m, 1, m * k, n_pad * k_pad, m * n, 1.0,
           a.numel() * 2, w.numel() * 2, c.numel() * 2, 4, cnt.numel() * 4)


def rows(archs=("gfx942", "gfx950")) -> list[dict]:
    out = []
    for arch in archs:
        specs = [dict(arch=arch, shape=name, n=n, k=k, gate=gate, bm=bm, bn=bn, bk=bk, grouped=g)
                 for name, (n, k, gate) in SHAPES.items() for bm, bn, bk in TILES for g in (False, True)]
        n, k, _ = SHAPES["down"]
        specs += [dict(arch=arch, shape="down", n=n, k=k, gate=None, bm=16, bn=128, bk=64, grouped=g, split=SPLIT)
                  for g in (False, True)]
        for spec, c in zip(specs, compile_many([(_ENTRY, (s,), {}) for s in specs], arch)):
            if isinstance(c, Exception):
                raise RuntimeError(f"compile failed for {spec}: {c}")
            s = c.main
            out.append(dict(spec, vgpr=s.meta["vgpr"], sgpr=s.meta["sgpr"], spills=(s.meta["vgpr_spill"],
                                                                                    s.meta["sgpr_spill"]),
                            lds=s.meta["lds"], waves=s.occupancy[0], instr=s.instructions,
                            mfma=s.mix.get("MFMA", 0), vmem=s.mix.get("vmem_load", 0), salu=s.mix.get("SALU", 0)))
    return out


def markdown(rs) -> str:
    lines = ["| arch | GEMM | tile BMxBNxBK | kernel | VGPR | SGPR | spills (v/s) | LDS B | waves/SIMD | instructions "
             "| MFMA | vector loads | scalar ALU |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['arch']} | {r['shape']} | {r['bm']}x{r['bn']}x{r['bk']} | "
                     f"{'grouped' if r['grouped'] else 'dense'}{' split ' + str(r['split']) if r.get('split') else ''} | {r['vgpr']} | {r['sgpr']} | {r['spills'][0]}/"
                     f"{r['spills'][1]} | {r['lds']} | {r['waves']} | {r['instr']} | {r['mfma']} | {r['vmem']} | "
                     f"{r['salu']} |")
    return "\n".join(lines)


def parse_archs(argv, doc: str) -> tuple:
    """The --archs of the MoE benches (this one and bench.moe_model)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--archs", default="gfx942,gfx950")
    return tuple(ap.parse_args(argv).archs.split(","))


def main(argv=None):
    print(markdown(rows(parse_archs(argv, __doc__))))


if __name__ == "__main__":
    main()
