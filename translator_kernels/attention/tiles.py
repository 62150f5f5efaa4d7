"""The attention kernel's tile plan and data layouts (static, per specialization).

Contractions may permute their K index freely, so the head dimension is laid out to make
every access a contiguous per-lane vector (lane = 16 g + r):
  * QKᵀ: lane group g covers d in [g*D/4, (g+1)*D/4); k-step s reads 4 (8, 1) of them.
  * PV with LDS on gfx942 (more than one wave): V is staged *transposed*, Vᵀ[d][key] (row
    stride BLOCK_N + 4: 16 lanes' 8-byte reads hit all 32 banks), written with ds_write_b16 /
    ds_write_b16_d16_hi (no VALU); MFMA row m of Oᵀ tile dt stands for d = 16 dt + m and an
    operand (4 keys of one d) is one 8-byte read.
  * PV with LDS on gfx950 (16-bit inputs): V is staged row-major like K (16-byte writes) and
    each operand is read transposed by the LDS itself (ds_read_b64_tr_b16: lane 4j + q of a
    16-lane group reads 4 d of key 4g + j; the group's 4 x 16 tile comes back transposed), the
    same "tile order" as gfx942's; two reads make a 16x16x32 operand (a pair of key tiles).
  * PV without LDS (one wave: decode): row m stands for d = m * D/16 + dt, so a lane reads
    D/16 contiguous elements of one V row and regroups them (v_perm).
Keys per iteration: register-bounded without LDS; with LDS a K tile of K_TILE_BYTES (8 KB; 16 KB
on gfx950 for causal 16-bit D=128), at most 64 keys.
"""

import flydsl.expr as fx
from flydsl._mlir import ir

LOG2E = 1.4426950408889634
AFN = fx.arith.FastMathFlags.afn
# the row max ignores NaN quieting (no v_max x, x canonicalize per score): a NaN score still
# reaches the output through exp2(s - m) and the row sum
NNAN = fx.arith.FastMathFlags.nnan

# unmasked tiles keep a reference row max and rescale O and l only when some row's max outgrows
# it by more than this (log2 units): p = exp2(c s - m_ref) <= 2^8 meanwhile, far inside fp32 and
# bf16 range, and the steady state skips the rescale (FlashAttention-4's conditional rescaling)
RESCALE_TAU = 8.0

# mask kinds (constexpr)
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2

FX_DTYPES = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}
ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def ir_elem(name: str):
    return {"f32": ir.F32Type.get, "bf16": ir.BF16Type.get, "f16": ir.F16Type.get}[name]()


def chunk_elems(n: int, elem_bytes: int) -> int:
    """Largest power-of-two chunk (<= 16 bytes) that divides n elements."""
    c = 16 // elem_bytes
    while c > 1 and n % c:
        c //= 2
    return c


def padded_head_dim(head_dim: int) -> int:
    """The head dim the MFMA tiles cover: the next multiple of 16 (padding masked in the kernel)."""
    return -(-head_dim // 16) * 16


def v_transpose_read(arch: str, dtype: str, num_waves: int) -> bool:
    """gfx950, 16-bit, V through LDS: V is staged row-major and each PV operand is read transposed
    by the hardware (ds_read_b64_tr_b16); gfx942 stages Vᵀ with 2-byte writes instead."""
    return arch.startswith("gfx950") and dtype != "f32" and num_waves > 1


# bytes of one K tile staged in LDS: 8 KB (about 17 KB of K + V staging with padding) lets three
# 4-wave workgroups share a gfx942 CU's 64 KB. gfx950 (160 KB) stages 16 KB tiles for causal
# 16-bit attention at 96 < D <= 128: 64 keys per iteration, so the per-iteration rescale test,
# bookkeeping and loop control spread over twice the scores, at the 2 waves/SIMD D=128 has
# anyway (242 VGPRs). Measured elsewhere: non-causal D=128 takes 260 VGPRs at 64 keys (1
# wave/SIMD; a spill under waves_per_eu=2), D = 80 and 256 drop from 3 to 2 waves/SIMD and
# D = 96 needs about 216 VGPRs, so they keep 8 KB.
K_TILE_BYTES, WIDE_K_TILE_BYTES = 8192, 16384


def wide_kv_tile(arch: str, dtype: str, head_dim: int, num_waves: int, causal: bool) -> bool:
    """gfx950, 16-bit, causal, LDS path, 96 < padded D <= 128: WIDE_K_TILE_BYTES K tiles."""
    return (arch.startswith("gfx950") and ELEM_BYTES[dtype] == 2 and num_waves > 1 and causal
            and 96 < padded_head_dim(head_dim) <= 128)


def kernel_config(dtype: str, head_dim: int, num_waves: int, row_groups: int = 1, arch: str = "gfx942",
                  causal: bool = False) -> dict:
    """Static tile parameters of one specialization (also used by bench/isa_attention.py)."""
    eb = ELEM_BYTES[dtype]
    head_dim = padded_head_dim(head_dim)
    use_lds = num_waves > 1
    wide = wide_kv_tile(arch, dtype, head_dim, num_waves, causal)
    budget = (WIDE_K_TILE_BYTES if wide else K_TILE_BYTES) if use_lds else 16384
    n_tiles = max(1, min(4, budget // (16 * head_dim * eb)))
    block_n = 16 * n_tiles
    kstride = head_dim + 16 // eb          # padded LDS row: conflict-free 16-byte row reads
    vstride = block_n + 4                  # Vᵀ row (one d, all keys): 16 lanes' 8-byte reads hit 32 banks
    return dict(
        n_tiles=n_tiles,
        block_n=block_n,
        block_m=16 * row_groups * num_waves,
        rows_per_wave=16 * row_groups,
        threads=64 * num_waves,
        use_lds=use_lds,
        lds_stride=kstride,
        lds_vstride=vstride,
        lds_bytes=(block_n * kstride + (block_n * kstride if v_transpose_read(arch, dtype, num_waves)
                                         else head_dim * vstride)) * eb if use_lds else 0,
    )




def merge_geometry(head_dim: int) -> dict:
    """The split-KV merge's lane plan (fwd.merge_rows), from the padded head dim D: a lane takes `cpl` fp32
    columns of one row (8 = two 16-byte loads where D % 128 == 0, else 4), `rpp` = 64 / (D / cpl) rows per
    pass, and folds `slices` = 64 / cpl slices per batch, whose loads ((2 + cpl) VGPRs each: 80 or 96 in
    all) are issued together: one dependent round trip per (pass, batch)."""
    d = padded_head_dim(head_dim)
    cpl = 8 if d % 128 == 0 else 4
    return dict(cpl=cpl, lpr=d // cpl, rpp=64 // (d // cpl), slices=64 // cpl)


def merge_trips(head_dim: int, rows: int, nsplit: int) -> int:
    """Dependent round trips of one wave's merge over `rows` rows (<= 16 per wave at decode) and nsplit slices."""
    g = merge_geometry(head_dim)
    return -(-max(0, rows) // g["rpp"]) * -(-nsplit // g["slices"])
