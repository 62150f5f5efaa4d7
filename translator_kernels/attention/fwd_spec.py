"""The build-time constants of one attention specialization (fwd.py's kernel body reads them as `S.NAME`).

One specialization = (dtype, head dim, causal, mask kind and dtype, waves, arch, soft-cap, row groups,
K / V dtype). From it and the tile plan (tiles.kernel_config: waves, BLOCK_M, BLOCK_N, LDS strides) follow
the MFMA extents (D, the head dim rounded up to 16; DV the real one), the per-lane slices of Q / K rows
(QN) and V / O rows (VN) and their load chunks, which MFMA forms run (QK32 / PV32: gfx950's 16x16x32;
ONES_L: the row sum as an MFMA), how the row max is exchanged (BPERM), whether K / V go through LDS
(USE_LDS, VT, VTR) and how the workgroup copies a tile (CE, ROW_CH, TILE_CH, CH_ITERS), and the hot-loop
switches (RAW_MAX, HOIST_KV, SKIP_DEAD, KEY_SKIP). Each is commented where it is computed below.
"""

import math

import flydsl.expr as fx

from translator_kernels.attention.tiles import (ELEM_BYTES, FX_DTYPES, MASK_NONE, chunk_elems, kernel_config,
                                                merge_geometry, padded_head_dim, v_transpose_read)
from translator_kernels.errors import KernelInputError


class FwdSpec:
    """Every name computed in __init__ (and every argument) is an attribute: S.N_TILES, S.USE_LDS, ..."""

    def __init__(self, dtype: str, head_dim: int, causal: bool, mask_kind: int, mask_dtype: str, num_waves: int,
                 arch: str, softcap: bool, row_groups: int, kv_dtype: str | None):
        RG = row_groups                  # 16-row groups per wave: they share every K / V operand read
        D = padded_head_dim(head_dim)    # MFMA extent; columns [DV, D) are padding
        DV = head_dim                    # the real head dim
        PADDED = D != DV
        is_f32 = dtype == "f32"
        eb = ELEM_BYTES[dtype]
        cfg = kernel_config(dtype, DV, num_waves, row_groups, arch, causal)
        N_TILES, BLOCK_N, BLOCK_M, THREADS = cfg["n_tiles"], cfg["block_n"], cfg["block_m"], cfg["threads"]
        QN = D // 4                      # d elements per lane for Q / K rows
        QC = chunk_elems(math.gcd(QN, DV), eb)  # load chunk (elements): never straddles the padding edge
        VN = D // 16                     # d elements per lane for V / O rows (= number of Oᵀ tiles)
        VC = chunk_elems(math.gcd(VN, DV), eb)
        WC = chunk_elems(VN, 4)               # fp32 partial-output store chunk (split KV)
        # split-KV merge (merge_rows): a lane takes MERGE_CPL fp32 columns of one row (one or two 16-byte loads
        # per slice), MERGE_RPP rows per pass, MERGE_SLICES slices per batch (their loads in flight together)
        MG = merge_geometry(D)
        MERGE_CPL, MERGE_LPR, MERGE_RPP, MERGE_SLICES = MG["cpl"], MG["lpr"], MG["rpp"], MG["slices"]
        MERGE_OC = chunk_elems(math.gcd(MERGE_CPL, DV), eb)  # output store chunk
        OC = chunk_elems(math.gcd(4, DV), eb)  # output store chunk in "tile" order (4 d per lane and tile)
        KSTEPS = D // 4 if is_f32 else D // 16
        # gfx950: 16x16x32 bf16/f16 MFMA (8 k-elements per lane) for QKᵀ when a lane's D/4 slice
        # splits into 8-element steps, and for PV over pairs of 16-key tiles
        QK32 = arch.startswith("gfx950") and not is_f32 and QN % 8 == 0 and QC == 8
        # gfx950 16x16x32 for PV too when V is staged transposed in LDS (an operand = two 8-byte
        # reads); gathering 8 keys from global V rows would cost ~56 VGPRs, so decode keeps 16x16x16
        PV32 = arch.startswith("gfx950") and not is_f32 and N_TILES % 2 == 0 and cfg["use_lds"]
        # 16-bit inputs: the row sum l is an MFMA of a ones tile with the Pᵀ operand the PV product
        # reads (no VALU adds, and l sums exactly the rounded p that weight V), so P may be rounded
        # toward zero: on gfx942 bf16 by keeping the high half of the bits (one v_perm per 2 values)
        ONES_L = not is_f32
        TRUNC_P = dtype == "bf16" and arch.startswith("gfx942")  # P to bf16 by truncation (mma.p_to_elem)
        # unmasked tiles without soft-cap take the row max of the raw scores and fold the scale into
        # one fma per score, exp2(c s - m) (c > 0: a negative scale negates Q once instead)
        RAW_MAX = not softcap
        BPERM = arch.startswith("gfx950")  # row max exchange by ds_bpermute (lane_xor)
        Elem = FX_DTYPES[dtype]
        KV32 = kv_dtype == "f32" and not is_f32  # fp32 K / V, rounded to Elem as they are loaded
        if KV32 and cfg["use_lds"]:
            raise KernelInputError(f"attention: fp32 K / V with {dtype} Q are read by the one-wave kernel only, "
                                   f"not {num_waves} waves; cast K / V to {dtype}")
        MElem = FX_DTYPES.get(mask_dtype, fx.Float32)
        USE_LDS, LSTR, VSTR = cfg["use_lds"], cfg["lds_stride"], cfg["lds_vstride"]
        # With LDS, V is staged transposed (Vᵀ[d][key]) so that a PV operand (4 keys of one d) is one
        # contiguous read, and MFMA row m of Oᵀ tile dt stands for d = 16 dt + m ("tile" order);
        # without LDS a lane reads V rows from global memory and row m stands for d = m VN + dt.
        VT = USE_LDS
        VTR = v_transpose_read(arch, dtype, num_waves)  # V row-major in LDS, operands read transposed
        CE = chunk_elems(DV, eb)              # elements per cooperative chunk (16 bytes unless DV is odd-sized)
        ROW_CH = DV // CE                # chunks per K/V row
        PAD_EL = BLOCK_N * (D - DV)      # zero padding columns of the K / V LDS tiles
        PAD_ITERS = -(-PAD_EL // THREADS)
        TILE_CH = BLOCK_N * ROW_CH       # chunks per K (or V) tile
        CH_ITERS = -(-TILE_CH // THREADS)
        CH_EXACT = TILE_CH % THREADS == 0
        # one wave (decode): a tile's K and V loads all go before its first MFMA (one round trip a tile, not
        # one per 16-key step; docs/attention.md "The slice count"), except fp32 at D > 128, where the held
        # tile would leave 1 wave per SIMD, and fp32 K / V under a 16-bit dtype (KV32), whose loads
        # land in fp32 registers before the rounding (D 128: 360 VGPRs + 104 AGPRs, spills; D 64: 1 wave)
        HOIST_KV = not USE_LDS and not (is_f32 and D > 128) and not KV32
        # causal, several waves: a diagonal tile none of whose keys a wave's rows see skips that wave's math
        SKIP_DEAD = causal and num_waves > 1
        # a user mask, one wave (K / V read straight from global memory): the wave loads a tile's mask
        # bytes first and skips its K / V loads and math when no row keeps any of its keys (a bool False,
        # an additive -inf): a wave-uniform branch decided on the device, no host read
        KEY_SKIP = mask_kind != MASK_NONE and not USE_LDS
        vars(self).update({k: v for k, v in locals().items() if k != "self"})
