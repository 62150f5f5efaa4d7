"""The GEMM kernel's epilogue stores (kernel.py): a lane's fp32 accumulators -> C.

Lane (l16, q) of a wave holds C[row0 + mr*16 + q*4 + i, col0 + nr*16 + l16] for i in 0..3 of each of its
m_rep x n_rep 16x16 accumulators. Per element, in this order: y = scale * acc; y *= sw[col] (a per-column
W scale); y *= sa[row] (a per-row A scale); y *= rstd[row] (rownorm.py); y += bias[col]; y = program(y)
(the epilogue program, epilogue.py); y += residual[row, col]; C = y cast to the output dtype. Rows >= M
and columns >= N get the sentinel offset OOB: the buffer store drops them, the residual load reads 0.

Two forms:
  * `store_c`: C leaves in 16-byte row pieces staged through LDS (cstore.py) where N allows (`store_vec`),
    else one element per lane and store;
  * `store_gated`: the gated MLP's accumulator pairs (2j, 2j + 1) are the gate and up value of one output
    column: act(gate(g) * up(u)) with gate / up / act epilogue programs (gated.py, fp8_gated.py).

Both are straight-line code (compile-time loops only): the kernel calls them where its control flow
(split-K's last arriver, kw = 4's wave 0) decides who stores. `Epilogue` carries what they read: the
kernel's compile-time switches and the workgroup's traced values.
"""

from dataclasses import dataclass

import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from translator_kernels.gemm import cstore
from translator_kernels.gemm.common import OOB, _raw, epilogue_scales
from translator_kernels.gemm.epilogue import apply_epilogue_device


@dataclass
class Epilogue:
    """What the stores read. Compile time: the output geometry and switches of build_gemm; traced: the
    workgroup's tile, lane and tensors (rsrc(t, nbytes) makes a buffer resource; rn_v: rownorm's rstd per
    16-row block, or None; zero: the i32 0 of the buffer ops' soffset)."""
    # compile time
    n: int
    n_pad: int
    bn: int
    m_rep: int
    n_rep: int
    n_per_wave: int
    kw: int
    grouped: bool
    has_bias: bool
    has_residual: bool
    a_ep: str
    w_ep: str
    rownorm: object
    store_vec: bool
    activation: object
    gate: object
    up: object
    osz: int
    out_t: object
    # traced
    rsrc: object
    Bias: object
    Res: object
    Sa: object
    Sw: object
    rc: object
    lds: object
    p_bytes: object
    c_bytes: object
    m: object
    scale: object
    bz: object
    by: object
    c_bs: object
    b_base: object
    wcol: object
    wave: object
    lane: object
    l16: object
    q: object
    a_row0: object
    a_rowe: object
    rn_v: object
    zero: object

    def store_gated(e, accs):  # gated MLP: lane pairs (gate, up) -> act(g) * u
        n_rep, zero, out_t = e.n_rep, e.zero, e.out_t
        c_base = e.bz * e.c_bs
        if const_expr(e.has_bias):
            rbg = e.rsrc(e.Bias, e.p_bytes if e.grouped else e.n_pad * 4)
        if const_expr(e.has_residual):
            rrg = e.rsrc(e.Res, e.c_bytes)
        # scales (fp8_gated.py): Sw arranged like W ([2 * N16]: the gate's, then the up's), sa per row
        w_ep, a_ep = e.w_ep, e.a_ep
        s0 = e.b_base if w_ep == "col" else 0  # grouped: Sw [E, N_pad], the tile's expert's row (moe/grouped_fp8.py)
        rsw = e.rsrc(e.Sw, (e.n_pad + s0 if w_ep == "col" else 1) * 4) if w_ep else None
        rsa = e.rsrc(e.Sa, (e.m if a_ep == "row" else 1) * 4) if a_ep else None
        sw_v, sa_v = epilogue_scales(rsw, rsa, w_ep, a_ep, e.by * e.bn + e.wcol + e.l16 + s0, e.a_row0, e.q, e.m,
                                     e.n_pad + s0, e.m_rep, n_rep)
        for j in range_constexpr(n_rep // 2):
            colg = e.by * e.bn + e.wave * e.n_per_wave + 2 * j * 16 + e.l16  # arranged column of the gate
            col = (e.by * e.bn + e.wave * e.n_per_wave) // 2 + j * 16 + e.l16
            col_ok = col < e.n
            sv = fx.Vector.filled(4, e.scale, fx.Float32)
            for mr in range_constexpr(e.m_rep):
                gv = fx.Vector(_raw(accs[mr * n_rep + 2 * j])) * sv
                uv = fx.Vector(_raw(accs[mr * n_rep + 2 * j + 1])) * sv
                if const_expr(w_ep != ""):  # scale * acc * sw[col] * sa[row], as store_c
                    gv = gv * fx.Vector.filled(4, sw_v[2 * j], fx.Float32)
                    uv = uv * fx.Vector.filled(4, sw_v[2 * j + 1], fx.Float32)
                if const_expr(a_ep != ""):
                    sav = fx.Vector.from_elements(sa_v[mr], fx.Float32)
                    gv, uv = gv * sav, uv * sav
                if const_expr(e.rownorm):
                    rnv = fx.Vector.from_elements(e.rn_v[mr], fx.Float32)
                    gv, uv = gv * rnv, uv * rnv
                if const_expr(e.has_bias):
                    bgv = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rbg, _raw((colg + e.b_base) * 4), zero))
                    buv = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rbg, _raw((colg + e.b_base + 16) * 4), zero))
                    gv = gv + fx.Vector.filled(4, bgv, fx.Float32)
                    uv = uv + fx.Vector.filled(4, buv, fx.Float32)
                yv = apply_epilogue_device(apply_epilogue_device(gv, e.gate) * apply_epilogue_device(uv, e.up),
                                           e.activation)
                for i in range_constexpr(4):
                    row = e.a_row0 + mr * 16 + e.q * 4 + i
                    c_off = ((row < e.m) & col_ok).select((c_base + row * e.n + col) * e.osz, fx.Int32(OOB))
                    y = yv[i]
                    if const_expr(e.has_residual):
                        y = y + out_t(rocdl.raw_ptr_buffer_load(out_t.ir_type, rrg, _raw(c_off), zero)).to(fx.Float32)
                    rocdl.raw_ptr_buffer_store(_raw(y.to(out_t)), e.rc, _raw(c_off), zero)

    def store_c(e, accs):
        # ---- epilogue: lane holds C[mr*16 + q*4 + i, nr*16 + l16] ----
        m_rep, n_rep, n, m, zero, out_t = e.m_rep, e.n_rep, e.n, e.m, e.zero, e.out_t
        c_base = e.bz * e.c_bs
        rb = rr = None
        if const_expr(e.has_bias):
            rb = e.rsrc(e.Bias, e.p_bytes if e.grouped else n * 4)
        if const_expr(e.has_residual):
            rr = e.rsrc(e.Res, e.c_bytes)
        col0 = e.by * e.bn + e.wcol + e.l16
        w_ep, a_ep = e.w_ep, e.a_ep
        s0 = e.b_base if w_ep == "col" else 0  # grouped: Sw [E, N], the tile's expert's row (moe/grouped_fp8.py)
        rsw = e.rsrc(e.Sw, (n + s0 if w_ep == "col" else 1) * 4) if w_ep else None
        rsa = e.rsrc(e.Sa, (m if a_ep == "row" else 1) * 4) if a_ep else None
        sw_v, sa_v = epilogue_scales(rsw, rsa, w_ep, a_ep, col0 + s0, e.a_rowe, e.q, m, n + s0, m_rep, n_rep)

        def scaled(mr, nr):  # scale * acc, then x sw[col], then x sa[row] (fp32, in this order)
            yv = fx.Vector(_raw(accs[mr * n_rep + nr])) * fx.Vector.filled(4, e.scale, fx.Float32)
            if const_expr(w_ep != ""):
                yv = yv * fx.Vector.filled(4, sw_v[nr], fx.Float32)
            if const_expr(a_ep != ""):
                yv = yv * fx.Vector.from_elements(sa_v[mr], fx.Float32)
            if const_expr(e.rownorm):  # x rstd[row] (rownorm.py)
                yv = yv * fx.Vector.from_elements(e.rn_v[mr], fx.Float32)
            return yv

        if const_expr(e.store_vec):
            bias_v = [None] * n_rep
            if const_expr(e.has_bias):
                for nr in range_constexpr(n_rep):
                    b_off = (col0 + nr * 16 < n).select((col0 + nr * 16 + e.b_base) * 4, fx.Int32(OOB))
                    bias_v[nr] = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rb, _raw(b_off), zero))

            def y_of(mr, nr):
                yv = scaled(mr, nr)
                if const_expr(e.has_bias):
                    yv = yv + fx.Vector.filled(4, bias_v[nr], fx.Float32)
                return apply_epilogue_device(yv, e.activation)

            cstore.store_rows_vec(y_of, e.lds.a.ptr, (e.wave if e.kw == 1 else 0) * cstore.region_dw(e.n_per_wave),
                                  e.lane, m_rep, n_rep, e.n_per_wave, e.a_rowe, e.by * e.bn + e.wcol, m, n, c_base,
                                  e.rc, rr, out_t, e.osz)
            return
        for nr in range_constexpr(n_rep):
            col = col0 + nr * 16
            col_ok = col < n
            if const_expr(e.has_bias):
                b_off = col_ok.select((col + e.b_base) * 4, fx.Int32(OOB))
                bias_v = fx.Float32(rocdl.raw_ptr_buffer_load(T.f32, rb, _raw(b_off), zero))
            for mr in range_constexpr(m_rep):
                yv = scaled(mr, nr)
                if const_expr(e.has_bias):
                    yv = yv + fx.Vector.filled(4, bias_v, fx.Float32)
                yv = apply_epilogue_device(yv, e.activation)
                for i in range_constexpr(4):
                    row = e.a_rowe + mr * 16 + e.q * 4 + i
                    ok = (row < m) & col_ok
                    c_off = ok.select((c_base + row * n + col) * e.osz, fx.Int32(OOB))
                    y = yv[i]
                    if const_expr(e.has_residual):
                        rv = rocdl.raw_ptr_buffer_load(out_t.ir_type, rr, _raw(c_off), zero)
                        y = y + out_t(rv).to(fx.Float32)
                    rocdl.raw_ptr_buffer_store(_raw(y.to(out_t)), e.rc, _raw(c_off), zero)
