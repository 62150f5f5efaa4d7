"""Entry points of bench.isa's compiles: launch one kernel at one shape under COMPILE_ONLY (no GPU).

`ours(family, dtype, shape)` / `flydsl(family, dtype, shape)` run in translator_kernels.isa's child,
which sets COMPILE_ONLY, ARCH and the dump switches; the launch compiles to AMDGPU ISA and returns
without executing. Tensors are torch.empty on CPU (never touched). They return {"config": ...}
when the tile config is worth naming. FlyDSL's own kernels are imported from the source checkout
named by $FLYDSL_SRC; a case FlyDSL has no kernel for raises LookupError.
"""

from __future__ import annotations

import os
import sys

import torch

from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.measure.rows_isa import FAMILIES as ROW_FAMILIES
from translator_kernels.measure.rows_isa import compile_one as compile_rows

TD = NAMED_DTYPES  # translator_kernels.arch


def ours(family, dt, shape):
    if family in ROW_FAMILIES:
        compile_rows(family, dt, shape)
    elif family == "gemm":
        from translator_kernels.gemm import choose_config, m_bucket
        from translator_kernels.measure.gemm_isa import compile_one as _compile_one

        m, n, k = shape
        c = choose_config(m_bucket(m), n, k, dt, os.environ["ARCH"])
        _compile_one(dict(n=n, k=k, dtype=dt, arch=os.environ["ARCH"], bm=c.bm, bn=c.bn, bk=c.bk, activation=None,
                          bias=False, residual=False, out_dtype=dt, wm=c.wm))
        return {"config": f"{c.bm}x{c.bn}x{c.bk}" + (" 8 waves" if c.wm > 1 else "")}
    elif family == "attention":
        from translator_kernels.measure.attention_isa import compile_bshd

        compile_bshd(dt, shape)
    else:
        raise ValueError(f"unknown family {family}")


def flydsl(family, dt, shape):
    src = os.environ.get("FLYDSL_SRC")
    if not src:
        raise LookupError("FLYDSL_SRC is not set")
    sys.path.insert(0, src)
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    fxt = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}

    def ptr(t):
        return flyc.from_c_void_p(fxt[dt], t.data_ptr())

    if family in ("softmax", "layer_norm", "rms_norm"):
        m, n = shape
        x, o = torch.empty(m, n, dtype=TD[dt]), torch.empty(m, n, dtype=TD[dt])
        g, b = torch.empty(n, dtype=TD[dt]), torch.empty(n, dtype=TD[dt])
        if family == "softmax":
            from kernels.norm.softmax_kernel import build_softmax_module

            build_softmax_module(m, n, dt)(x, o, m)
        elif family == "layer_norm":
            from kernels.norm.layernorm_kernel import build_layernorm_module

            build_layernorm_module(n, dt)(ptr(x), ptr(g), ptr(b), ptr(o), m)
        else:
            from kernels.norm.rmsnorm_kernel import build_rmsnorm_module

            build_rmsnorm_module(n, dt)(x, g, o, m)
    elif family == "gemm":
        if dt not in ("bf16", "f16"):
            raise LookupError("FlyDSL's preshuffle GEMM takes fp8/int8/fp16/bf16 inputs, not " + dt)
        from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm

        m, n, k = shape
        tm, tn, tk = 128, 128, 128  # FlyDSL's own large-shape test tile
        fn = compile_preshuffle_gemm(N=n, K=k, tile_m=tm, tile_n=tn, tile_k=tk, in_dtype={"bf16": "bf16", "f16": "fp16"}[dt],
                                     out_dtype=dt)
        a, w, c = torch.empty(m * k, dtype=TD[dt]), torch.empty(n * k, dtype=TD[dt]), torch.empty(m * n, dtype=TD[dt])
        e = torch.empty(0, dtype=torch.float32)
        fn(c, a, w, e, e, torch.empty(0, dtype=TD[dt]), m, n, None)
        return {"config": f"{tm}x{tn}x{tk}"}
    elif family == "attention":
        from kernels.attention.flash_attn_generic import build_flash_attn_func_module

        b, s, h, d = shape
        q = torch.empty(b, s, h, d, dtype=TD[dt])
        exe = build_flash_attn_func_module(num_heads=h, head_dim=d, causal=True, dtype_str=dt, num_kv_heads=h,
                                           cross_seqlen=False, block_m=128, flat_work_group_size=256, path_tag="auto",
                                           waves_per_eu=2, daz=True, return_lse=False)
        exe(q, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), b, s, lse=None, stream=None)
        return {"config": "generic block_m=128, 256 threads"}
    else:
        raise ValueError(f"unknown family {family}")
