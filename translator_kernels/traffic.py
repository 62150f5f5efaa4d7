"""A global-memory traffic MODEL of our kernels (not a measurement): bytes moved per call.

For each kernel family, `model_bytes(family, dtype, shape, arch)` predicts the bytes our kernel
moves from the launch geometry it really uses (the norm's grid, the GEMM tile and its split-K partials, the attention tile
plan of this arch, causal flag and head dim: `attention_bytes`), with no cache: every load the
kernel issues reaches HBM, and loads the hardware drops (buffer accesses past a descriptor's
bounds) move nothing. `compulsory_bytes` is each input read once plus each output written once.
translator_kernels/measure/traffic.py checks the model against flysim's counted bytes at reduced shapes; bench prints
the ratios.
"""

from __future__ import annotations

import math

import torch

from translator_kernels.arch import NAMED_DTYPES

ESIZE = {name: torch.empty((), dtype=NAMED_DTYPES[name]).element_size() for name in ("f32", "bf16", "f16")}
TD = NAMED_DTYPES


def compulsory_bytes(family, dt, shape) -> int:
    e = ESIZE[dt]
    if family == "softmax":
        m, n = shape
        return 2 * m * n * e
    if family == "layer_norm":
        m, n = shape
        return 2 * m * n * e + 2 * n * 4
    if family == "rms_norm":
        m, n = shape
        return 2 * m * n * e + n * e
    if family == "gemm":
        m, n, k = shape
        return (m * k + n * k + m * n) * e
    if family == "attention":
        b, s, h, d = shape
        return 4 * b * h * s * d * e
    raise ValueError(family)


def norm_grid(family, dt, shape) -> int:
    """Workgroups of our norm kernel (its own `_grid` on meta tensors of the same shape)."""
    from translator_kernels.rows import norm
    from translator_kernels.rows import common as rc

    m, n = shape
    x = torch.empty(m, n, dtype=TD[dt], device="meta")
    w = torch.empty(n, dtype=torch.float32 if family == "layer_norm" else TD[dt], device="meta")
    b = torch.empty(n, device="meta") if family == "layer_norm" else None
    vec = rc.pick_vec(n, x.dtype, x, w, *([b] if b is not None else []))
    return norm._grid(m, n, vec, x.element_size(), False, w, b, "row")


def norm_rows_per_block(dt, shape) -> int:
    from translator_kernels.rows import common as rc

    m, n = shape
    x = torch.empty(m, n, dtype=TD[dt], device="meta")
    tiling = rc.row_tiling(n, rc.pick_vec(n, x.dtype, x))
    return tiling.rows_per_block if rc.row_fits(tiling) else 1


def gemm_tile(dt, shape, arch):
    from translator_kernels.gemm import choose_config, m_bucket

    m, n, k = shape
    return choose_config(m_bucket(m), n, k, dt, arch)


def model_bytes(family, dt, shape, arch="gfx942") -> int:
    """Predicted global bytes of our kernel (no cache); see the module docstring."""
    e = ESIZE[dt]
    if family == "softmax":
        return compulsory_bytes(family, dt, shape)
    if family in ("layer_norm", "rms_norm"):
        m, n = shape
        pbytes = compulsory_bytes(family, dt, shape) - 2 * m * n * e
        # each row group of a workgroup (rows_per_block of them when short rows share it) loads the
        # weights once; a workgroup keeps them in registers while it walks further row-blocks
        return 2 * m * n * e + norm_grid(family, dt, shape) * min(m, norm_rows_per_block(dt, shape)) * pbytes
    if family == "gemm":
        from translator_kernels.gemm.preshuffle import padded_shape

        from translator_kernels.gemm.tiles import partial_bytes

        m, n, k = shape
        c = gemm_tile(dt, shape, arch)
        n_pad, k_pad = padded_shape(n, k)
        written, read = partial_bytes(m, n, k, c)  # split-K's fp32 partial tiles
        return (m * k * math.ceil(n / c.bn) + n_pad * k_pad * math.ceil(m / c.bm) + m * n) * e + written + read
    if family == "attention":
        b, s, h, d = shape
        return attention_bytes(dt, s, s, d, arch, causal=True, heads=b * h)
    raise ValueError(family)


def attention_bytes(dt, sq, sk, d, arch="gfx942", causal=False, heads=1, group=1) -> int:
    """Global bytes of one attention() call (no mask, no head scale) over `heads` = B x H query
    heads (`group` = H / Hkv: at decode the group's heads are the rows of one block, attention/gqa.py,
    so the call is priced as heads / group heads of group * Sq rows), launch by launch as translator_kernels.attention tiles it (tile_geometry, split_geometry,
    tiles.kernel_config for this arch / causal / dtype / head dim):

    * each workgroup's waves load BLOCK_M query rows of the padded head dim (rows past Sq are
      clamped to row Sq - 1 and still loaded);
    * with LDS (more than one wave) K and V come in BLOCK_N-key tiles from key 0 (or the split
      slice's first key) while a tile starts below the key bound (Sk; causal: min(Sk, end of the
      query block)); each tile's buffer descriptors end at key Sk - 1, so the last tile moves
      only its min(BLOCK_N, Sk - kb) real keys of the real head dim;
    * without LDS (one wave) every lane reads its K / V rows with the key clamped to Sk - 1:
      each step moves BLOCK_N whole padded rows of K and of V;
    * the output rows below Sq (real head dim) are written once; a split KV launch writes fp32
      partials (padded head dim, plus m and l per row) that the last slice of each wave's rows reads
      back in the same launch (fwd.merge_rows: every lane loads its row's m and l and its 4 or 8 fp32
      columns per slice slot); each wave of each slice takes a ticket (int32 atomic) and the last resets it.
    """
    from translator_kernels.attention import attention_config, split_geometry
    from translator_kernels.attention.gqa import pack_group
    from translator_kernels.attention.tiles import padded_head_dim

    pk = pack_group(group, 1, sq, causal=causal, head_scale=None)
    sq, heads = sq * pk, heads // pk
    e, dp = ESIZE[dt], padded_head_dim(d)
    cfg = attention_config(dt, d, sq, arch, causal)
    bm, bn = cfg["block_m"], cfg["block_n"]
    nsplit, chunk = split_geometry(1, heads, sq, sk, d, dt, arch)
    nq = -(-sq // bm)
    kv = 0  # K + V bytes of one head, summed over query blocks and KV slices
    for i in range(nq):
        end = min(sk, (i + 1) * bm) if causal else sk
        for part in range(nsplit):
            lo, hi = part * chunk, min(end, (part + 1) * chunk) if nsplit > 1 else end
            if cfg["use_lds"]:  # the first tile is loaded before the loop, the rest prefetched
                kv += 2 * sum(min(bn, sk - kb) for kb in range(lo, max(hi, lo + 1), bn)) * d * e
            else:
                kv += 2 * -(-max(0, hi - lo) // bn) * bn * dp * e
    q = nq * nsplit * bm * dp * e
    if nsplit == 1:
        return heads * (q + kv + sq * d * e)
    partials = nsplit * sq * (dp + 2) * 4
    # the last slice's merge, in the same launch (fwd.merge_rows): every lane of the merging wave loads, per
    # pass of `rpp` rows and per slot of a batch of `per` slices (a slot past nsplit re-reads the last slice),
    # its row's m, l and its `cpl` fp32 columns; + per wave a ticket (an int32 atomic: 4 B read, 4 written) of
    # each slice and the counter reset
    cpl = 8 if dp % 128 == 0 else 4
    rpp, per, wave_rows = 64 // (dp // cpl), 64 // cpl, bm // (cfg["threads"] // 64)
    passes = sum(-(-max(0, min(wave_rows, sq - r0)) // rpp) for r0 in range(0, nq * bm, wave_rows))
    combine = (passes * -(-nsplit // per) * per * 64 * (8 + 4 * cpl) + sq * d * e
               + nq * (cfg["threads"] // 64) * (8 * nsplit + 4))
    return heads * (q + kv + partials + combine)
