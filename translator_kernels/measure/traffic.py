"""Global-memory traffic: flysim's counted bytes at a reduced size, against the byte MODEL of
translator_kernels/traffic.py; this module measures (the tests and bench.kernels read it, bench prints).

For each kernel family, `model_bytes(family, dtype, shape, arch)` predicts the bytes our kernel
moves from the launch geometry it really uses (the norm's grid G, the GEMM tile, the attention
tile plan of this arch, causal flag and head dim: `attention_bytes`), with no cache: every load
the kernel issues reaches HBM, and loads the hardware drops (buffer accesses past a descriptor's
bounds) move nothing. `compulsory_bytes` is
each input read once plus each output written once. `measure` runs the kernel under flysim at
a reduced, countable shape and reads `global_bytes_read + global_bytes_written`.

The anchor ratio is extrapolated as  model(anchor) / compulsory(anchor) x (measured / model at
the reduced shape): the model carries the shape dependence, flysim checks the model.
Real GPUs serve part of the GEMM / attention re-reads from L2 / MALL, so for those families the
ratio is an upper bound on HBM traffic; row kernels have no re-reads besides norm weights.
"""

from __future__ import annotations

import time

import torch

from translator_kernels.arch import NAMED_DTYPES
from translator_kernels.traffic import (ESIZE, attention_bytes, compulsory_bytes, gemm_tile, model_bytes,  # noqa: F401
                                        norm_grid, norm_rows_per_block)

TD = NAMED_DTYPES  # translator_kernels.arch


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


def _moved(launches) -> int:
    return sum(r.counters["global_bytes_read"] + r.counters["global_bytes_written"] for r in launches)


def measure(family, dt, shape, arch="gfx942") -> dict:
    """Run our kernel under flysim at `shape`; return counted, modeled and compulsory bytes."""
    import flysim

    args = _inputs(family, dt, shape)
    t0 = time.time()
    with flysim.simulate(arch=arch, check_races=False) as sim:
        run_ours(family, dt, args)
    recs = [r for r in sim.launches if "shuffle" not in r.kernel]
    # attention: every launch (one, its split-KV merge inside); the others' last launch is the kernel
    moved = _moved(recs if family == "attention" else recs[-1:])
    return dict(family=family, dtype=dt, shape=tuple(shape), arch=arch, moved=moved,
                model=model_bytes(family, dt, shape, arch), compulsory=compulsory_bytes(family, dt, shape),
                wall_s=time.time() - t0, launches=len(sim.launches))


def measure_attention(dt, sq, sk, d, arch="gfx942", causal=False, b=1, h=1, hkv=None) -> dict:
    """flysim's global bytes of one attention() call (every launch) at q [b, h, sq, d], k / v
    [b, hkv, sk, d], the figure `attention_bytes(dt, sq, sk, d, arch, causal, b * h)` models."""
    import flysim
    from translator_kernels.attention import attention

    q = torch.randn(b, h, sq, d).to(TD[dt])
    k, v = (torch.randn(b, hkv or h, sk, d).to(TD[dt]) for _ in range(2))
    with flysim.simulate(arch=arch, check_races=False) as sim:
        attention(q, k, v, causal=causal)
    return dict(moved=_moved(sim.launches), kernels=[r.kernel for r in sim.launches])


def extrapolate(meas: dict, anchor_shape) -> dict:
    """Anchor-shape ratio from the model, corrected by the reduced-size model error."""
    fam, dt, arch = meas["family"], meas["dtype"], meas["arch"]
    check = meas["moved"] / meas["model"]
    model_a = model_bytes(fam, dt, anchor_shape, arch)
    comp_a = compulsory_bytes(fam, dt, anchor_shape)
    return dict(anchor=tuple(anchor_shape), model_ratio=model_a / comp_a, ratio=check * model_a / comp_a,
                bytes=check * model_a, compulsory=comp_a)
