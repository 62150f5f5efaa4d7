"""ISA statistics of our GEMM for one tile config: compile to AMDGPU ISA without a GPU (through
translator_kernels.isa, in a child process) and read the kernel metadata (VGPRs, SGPRs, spills, LDS
bytes, static MFMA count, occupancy bound). The tests assert on these rows; bench.isa_gemm prints
them beside FlyDSL's own GEMM.
"""

from __future__ import annotations

import torch

from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.isa import compile_many, occupancy

ENTRY = "translator_kernels.measure.gemm_isa:compile_one"


def waves_per_simd(vgpr: int, lds_bytes: int, arch: str) -> int:
    """Occupancy bound (waves per SIMD) of a 4-wave workgroup from VGPRs and LDS (translator_kernels.isa's model)."""
    return occupancy(vgpr, 0, lds_bytes, 256, arch)[0]


def spec(n, k, dtype, arch, bm, bn, bk, activation=None, bias=False, residual=False, out_dtype=None,
          split=1, kw=1, wm=1, head=0, ring=False, quad=False) -> dict:
    return dict(n=n, k=k, dtype=dtype, arch=arch, bm=bm, bn=bn, bk=bk, activation=activation, bias=bias,
                residual=residual, out_dtype=out_dtype or dtype, split=split, kw=kw, wm=wm, head=head, ring=ring,
                quad=quad)


def row(spec, compiled) -> dict:
    if isinstance(compiled, Exception):
        raise RuntimeError(f"gemm ISA compile failed for {spec}:\n{compiled}")
    s = compiled.main
    w, _ = s.occupancy
    return dict(spec, vgpr=s.meta["vgpr"], sgpr=s.meta["sgpr"], vgpr_spill=s.meta["vgpr_spill"],
                sgpr_spill=s.meta["sgpr_spill"], lds_bytes=s.meta["lds"], agpr=s.meta["agpr"],
                mfma_static=s.mix.get("MFMA", 0), mfma_ops=s.mnemonics("v_mfma"), waves_per_simd=w)


def isa_stats_many(specs: list[dict]) -> list[dict]:
    """Several configs, one child per arch."""
    out: dict = {}
    for arch in dict.fromkeys(s["arch"] for s in specs):
        idx = [i for i, s in enumerate(specs) if s["arch"] == arch]
        for i, c in zip(idx, compile_many([(ENTRY, (specs[i],), {}) for i in idx], arch)):
            out[i] = row(specs[i], c)
    return [out[i] for i in range(len(specs))]


def isa_stats(n, k, dtype, arch, bm, bn, bk, *, activation=None, bias=False, residual=False, out_dtype=None,
              split=1, kw=1, wm=1, head=0, ring=False, quad=False):
    """Compile the GEMM for one config (a GemmConfig's fields: tile, split-K, K waves, M waves, short first tile,
    W register ring, 2 x 2 waves) in a child process; return a dict of ISA statistics."""
    return isa_stats_many([spec(n, k, dtype, arch, bm, bn, bk, activation, bias, residual, out_dtype,
                                 split, kw, wm, head, ring, quad)])[0]


def gemm_isa_text(n: int, k: int, dtype: str, arch: str, bm: int, bn: int, bk: int, split: int = 1, kw: int = 1,
                  wm: int = 1, **epilogue):
    """(ISA text, metadata dict) of our GEMM at one tile, compiled without a GPU in a child process."""
    from translator_kernels.hotloop import compile_isa_texts, main_text
    from translator_kernels.isa import parse_isa

    s = spec(n, k, dtype, arch, bm, bn, bk, **epilogue)
    s.update(split=split, kw=kw, wm=wm)
    text = main_text(compile_isa_texts(ENTRY, (s,), arch=arch))
    return text, max(parse_isa(text, arch), key=lambda st: st.instructions).meta


def compile_one(spec):
    """Launch the GEMM for `spec` at M = 2 * BM + 1 under COMPILE_ONLY (runs in the child)."""
    from translator_kernels.gemm.kernel import build_gemm
    from translator_kernels.gemm.preshuffle import padded_shape

    tdt = NAMED_DTYPES
    n, k = spec["n"], spec["k"]
    n_pad, k_pad = padded_shape(n, k)
    m = 2 * spec["bm"] + 1
    dt, odt = tdt[spec["dtype"]], tdt[spec["out_dtype"]]
    split, kw = spec.get("split", 1), spec.get("kw", 1)
    launch = build_gemm.__wrapped__(n, k, n_pad, k_pad, spec["dtype"], spec["out_dtype"], spec["arch"], spec["bm"],
                                    spec["bn"], spec["bk"], spec["activation"], spec["bias"], spec["residual"], split,
                                    "shuffled", None, kw, spec.get("store_vec", True), spec.get("wm", 1),
                                    **({"head": spec["head"]} if spec.get("head") else {}),
                                    **({"ring": True} if spec.get("ring") else {}),
                                    **({"quad": True} if spec.get("quad") else {}))
    a, w, c = torch.zeros(m, k, dtype=dt), torch.zeros(n_pad, k_pad, dtype=dt), torch.zeros(m, n, dtype=odt)
    p, cnt = torch.zeros(max(1, split * 3 * n_pad * spec["bm"] * 2)), torch.zeros(4096, dtype=torch.int32)
    launch(c, a, w, torch.zeros(n), c, p, cnt, m, 1, 0, 0, 0, 1.0, a.numel() * a.element_size(),
           w.numel() * w.element_size(), c.numel() * c.element_size(), p.numel() * 4, cnt.numel() * 4)
