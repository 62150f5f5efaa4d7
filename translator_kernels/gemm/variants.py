"""Kernel variants of the GEMM that are priced by the timing MODEL but not built: which one would lift mid M?

Issue 29 item 3 asks for at least 0.8 of the achievable HBM bandwidth for every M <= 256 at N = K = 4096
under the MODEL (translator_kernels.timing through tiles.model_estimate). The kernel as built (kernel.py:
one K tile of W in flight, one workgroup per output tile x split, a short first K tile: `head`) reaches it
up to M = 128 on both archs. Two more structural changes were proposed (docs/timing-model.md):

- **persistent**: G workgroups walk the output tiles (x split) round-robin and load each later tile's first
  K tile under the previous tile's last K step, so a workgroup pays one prologue, not one per tile;
- **prefetch 2**: two K tiles of W (and A) in flight per workgroup: half the exposed latency per K step, at
  the price of a third W register set and a second A staging set (occupancy) and a prologue that loads two
  W tiles before the loop.

One more prices what split-K's fp32 partials cost (at M = 256 a 2-way split adds 8.4 MB to 37.7 MB compulsory):

- **partials free (bound)**: a K split whose partials cost no HBM bytes (an in-workgroup split that meets in
  LDS would; at the tiles that need it, 4-8 K groups of 4 waves at ~236 VGPRs, it does not fit a CU).

`model_terms(m, n, k, dtype, arch, cfg)` prices each term of one tile's MODEL time by taking it away (docs/
timing-model.md's per-M table: which term stops each M).

`best(m, n, k, dtype, arch, variant)` searches every legal tile of the family (BM 16-128, BN 16-256, BK 32-512,
kw 1 / 4, split 1-16, head 0 / 32, two W register sets or a ring (kernel.py `ring`); for persistent also G = 1, 2,
3, 4 or 8 workgroups per CU, up to the resident slots)
under the MODEL with the variant's features priced honestly: the first tile of each workgroup is still a
prologue (every resident workgroup loads it at once), the extra register sets cost occupancy, the extra W
tiles are prologue bytes. "prologue free" prices no prologue at all: a bound that no kernel of this family
reaches (each workgroup has to load its first tile before its first MFMA), kept to show what the prologue
costs. `python -m bench.calibration --gemm-tables` prints the table; docs/timing-model.md keeps it.
"""

from __future__ import annotations

from translator_kernels.arch import GPUS
from translator_kernels.gemm.preshuffle import padded_shape
from translator_kernels.gemm.tiles import (MAX_SPLIT, MAX_VGPR_EST, GemmConfig, head_ring, arch_key, config_fits,
                                           model_estimate, vgpr_estimate, workgroups_per_cu)

VARIANTS = ("as built", "prefetch 2", "persistent", "persistent + prefetch 2", "prologue free (bound)",
            "partials free (bound)")
_PER_CU = (1, 2, 3, 4, 8)  # persistent grids: workgroups per CU


def candidates(n: int, k: int, dtype: str, arch: str, prefetch: int = 1):
    """Every legal 4-wave tile of the family for (N, K) whose registers hold `prefetch` + 1 W sets."""
    k_pad = padded_shape(n, k)[1]
    for bm in (16, 32, 64, 128):
        for kw, bns in ((1, (64, 128, 256)), (4, (16, 32, 64, 128))):
            for bn in bns:
                for bk in (32, 64, 128, 256, 512):
                    if k_pad % bk or bk % (32 * kw):
                        continue
                    nkt = k_pad // bk
                    for sp in (d for d in range(1, min(nkt, MAX_SPLIT) + 1) if nkt % d == 0):
                        for head, ring, quad in head_ring(kw):
                            c = GemmConfig(bm, bn, bk, sp, kw, head=head if head < bk else 0, ring=ring, quad=quad)
                            if head < bk and not config_fits(c, dtype, arch) and vgpr_estimate(c, dtype, prefetch) <= MAX_VGPR_EST:
                                yield c


def _estimates(m, n, k, dtype, arch, variant):
    a = arch_key(arch)
    pf = 2 if "prefetch 2" in variant else 1
    free = variant.startswith("prologue free")
    partials = "free" if variant == "partials free (bound)" else "all"
    for c in candidates(n, k, dtype, a, pf):
        if variant.startswith("persistent"):
            slots = GPUS[a].cus * workgroups_per_cu(c, dtype, a, pf)
            for g in sorted({min(slots, GPUS[a].cus * p) for p in _PER_CU}):
                yield model_estimate(m, n, k, dtype, a, c, pf, persistent=g), c
        else:
            yield model_estimate(m, n, k, dtype, a, c, pf, prologue=not free, partials=partials), c


def best(m: int, n: int, k: int, dtype: str, arch: str, variant: str = "as built") -> tuple[dict, GemmConfig]:
    """(model_estimate's dict, config) of the tile with the least MODEL kernel time under `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} not in {VARIANTS}")
    return min(_estimates(m, n, k, dtype, arch, variant), key=lambda ec: (ec[0]["kernel_t"], ec[0]["rank_t"]))


def model_terms(m: int, n: int, k: int, dtype: str, arch: str, cfg: GemmConfig) -> dict:
    """What each term of the MODEL adds to the kernel time of `cfg`: the time saved by taking that term alone
    away (seconds; the launch floor left out). t_issue's terms: A's LDS traffic, the loop's vector work, the
    exposed part of each K step's memory round trip (EXPOSED x MEM_LATENCY), the prologue's bytes at the CU's
    share of the bandwidth; what is left of t_issue is the MFMAs with the prologue's one latency and the
    rounds of workgroups (wave quantization). t_mem's: the split-K partials. `binds` names the largest of
    t_mem, t_issue and t_l2 (the bytes every workgroup loads through the L2s, timing.launch_time)."""
    e = model_estimate(m, n, k, dtype, arch, cfg)

    def gain(**kw):
        return e["kernel_t"] - model_estimate(m, n, k, dtype, arch, cfg, **kw)["kernel_t"]

    def issue(**kw):
        return e["t_issue"] - model_estimate(m, n, k, dtype, arch, cfg, **kw)["t_issue"]

    terms = dict(lds=issue(edit=dict(loop_lds=0)), vector=issue(edit=dict(loop_vector=0)),
                 exposed_latency=issue(consts=dict(exposed=0.0)), prologue_bytes=issue(prologue=False))
    no_partials = model_estimate(m, n, k, dtype, arch, cfg, partials="free")
    return dict(e, terms=terms, mfma_and_rest=e["t_issue"] - sum(terms.values()),
                partial_t=e["t_mem"] - no_partials["t_mem"],
                binds=max(("t_mem", "t_issue", "t_l2"), key=lambda t: e[t]),
                gain_without=dict(lds=gain(edit=dict(loop_lds=0)), exposed_latency=gain(consts=dict(exposed=0.0)),
                                  prologue_bytes=gain(prologue=False), partials=gain(partials="free")))


def prologue_bytes(isa_text: str, arch: str) -> int:
    """Bytes one wave loads before its first `s_waitcnt vmcnt` (the compiled prologue: what the MODEL's
    estimated features charge as the first tiles; masked lanes count at the instruction's full width).
    timing.features' `straight_bytes` counts every load outside the hot loop, the peeled last K steps and the
    split-K partial reads included."""
    from translator_kernels.isa import parse_isa
    from translator_kernels.timing import _INSTR, _body_lines, _vmem_bytes

    stats = max(parse_isa(isa_text, arch), key=lambda s: s.instructions)
    total = 0
    for ln in _body_lines(isa_text, stats.kernel):
        m = _INSTR.match(ln.split(";")[0])
        if m and m.group(1).startswith("s_waitcnt") and "vmcnt" in m.group(2):
            break
        if m:
            total += _vmem_bytes(m.group(1), m.group(2))
    return total
