"""Global-memory traffic: flysim's counted bytes at a reduced size, against a byte MODEL.

For each kernel family, `model_bytes(family, dtype, shape, arch)` predicts the bytes our kernel
moves from the launch geometry it really uses (the norm's grid G, the GEMM tile, the attention
block sizes), with no cache: every load the kernel issues reaches HBM. `compulsory_bytes` is
each input read once plus each output written once. `measure` runs the kernel under flysim at
a reduced, countable shape and reads `global_bytes_read + global_bytes_written`.

The anchor ratio is extrapolated as  model(anchor) / compulsory(anchor) x (measured / model at
the reduced shape): the model carries the shape dependence, flysim checks the model.
Real GPUs serve part of the GEMM / attention re-reads from L2 / MALL, so for those families the
ratio is an upper bound on HBM traffic; row kernels have no re-reads besides norm weights.
"""

from __future__ import annotations

import math
import time

import torch

TD = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
ESIZE = {"f32": 4, "bf16": 2, "f16": 2}


def _inputs(family, dt, shape, device="cpu", init=torch.randn):
    if family in ("softmax", "layer_norm", "rms_norm"):
        m, n = shape
        x = init(m, n).to(TD[dt]).to(device)
        if family == "softmax":
            return (x,)
        if family == "layer_norm":
            return x, init(n).to(device), init(n).to(device)  # fp32 affine, as the lowering passes it
        return x, init(n).to(TD[dt]).to(device)
    if family == "gemm":
        m, n, k = shape
        return init(m, k).to(TD[dt]), init(n, k).to(TD[dt])
    if family == "attention":
        b, s, h, d = shape
        return tuple(init(b, h, s, d).to(TD[dt]) for _ in range(3))
    raise ValueError(family)


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
    plan = rc.plan_row(n, rc.pick_vec(n, x.dtype, x))
    return plan.rows_per_block if rc.row_fits(plan) else 1


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

        m, n, k = shape
        c = gemm_tile(dt, shape, arch)
        n_pad, k_pad = padded_shape(n, k)
        return (m * k * math.ceil(n / c.bn) + n_pad * k_pad * math.ceil(m / c.bm) + m * n) * e
    if family == "attention":
        from translator_kernels.attention import attention_config

        b, s, h, d = shape
        cfg = attention_config(dt, d, s)
        bm, bn = cfg["block_m"], cfg["block_n"]
        # causal: q tile i walks keys [0, min(s, (i+1)*bm)) in blocks of bn (no prefetch past the last)
        keys = sum(math.ceil(min(s, (i + 1) * bm) / bn) * bn for i in range(math.ceil(s / bm)))
        return b * h * (2 * s * d + 2 * keys * d) * e
    raise ValueError(family)


def run_ours(family, dt, args):
    if family == "softmax":
        from translator_kernels.rows.softmax import softmax

        return softmax(*args)
    if family == "layer_norm":
        from translator_kernels.rows.norm import layer_norm

        return layer_norm(*args)
    if family == "rms_norm":
        from translator_kernels.rows.norm import rms_norm

        return rms_norm(*args)
    if family == "gemm":
        from translator_kernels.gemm import gemm
        from translator_kernels.gemm.preshuffle import shuffle_weight

        a, w = args
        return gemm(a, shuffle_weight(w), w.shape[0], w.shape[1])
    if family == "attention":
        from translator_kernels.attention import attention

        return attention(*args, causal=True)
    raise ValueError(family)


def measure(family, dt, shape, arch="gfx942") -> dict:
    """Run our kernel under flysim at `shape`; return counted, modeled and compulsory bytes."""
    import flysim

    args = _inputs(family, dt, shape)
    t0 = time.time()
    with flysim.simulate(arch=arch, check_races=False) as sim:
        run_ours(family, dt, args)
    rec = [r for r in sim.launches if "shuffle" not in r.kernel][-1]
    moved = rec.counters["global_bytes_read"] + rec.counters["global_bytes_written"]
    return dict(family=family, dtype=dt, shape=tuple(shape), arch=arch, moved=moved,
                model=model_bytes(family, dt, shape, arch), compulsory=compulsory_bytes(family, dt, shape),
                wall_s=time.time() - t0, launches=len(sim.launches))


def extrapolate(meas: dict, anchor_shape) -> dict:
    """Anchor-shape ratio from the model, corrected by the reduced-size model error."""
    fam, dt, arch = meas["family"], meas["dtype"], meas["arch"]
    check = meas["moved"] / meas["model"]
    model_a = model_bytes(fam, dt, anchor_shape, arch)
    comp_a = compulsory_bytes(fam, dt, anchor_shape)
    return dict(anchor=tuple(anchor_shape), model_ratio=model_a / comp_a, ratio=check * model_a / comp_a,
                bytes=check * model_a, compulsory=comp_a)
