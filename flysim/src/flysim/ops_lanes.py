"""DPP and permlane swaps: cross-lane moves inside 16-lane rows of a wave.

DPP (``rocdl.update.dpp`` and ``llvm.amdgcn.update.dpp.*``): lane ``i`` of the wave takes
``src`` from the lane that ``dpp_ctrl`` names, within its row of 16 (r = i % 16):
  - 0x00-0xFF quad_perm: lane 4q + k reads lane 4q + ((ctrl >> 2k) & 3);
  - 0x101-0x10F row_shl:n reads r + n; 0x111-0x11F row_shr:n reads r - n (out of the row:
    invalid); 0x121-0x12F row_ror:n reads (r - n) mod 16;
  - 0x130 wave_shl:1 reads i + 1, 0x134 wave_rol:1 (i + 1) mod 64, 0x138 wave_shr:1 i - 1,
    0x13C wave_ror:1 (i - 1) mod 64 (CDNA keeps these gfx9 controls);
  - 0x140 row_mirror reads 15 - r, 0x141 row_half_mirror reads the mirror within 8;
  - 0x142 row_bcast:15 gives rows 1-3 lane 15 of the row before; 0x143 row_bcast:31 gives
    rows 2-3 lane 31 (other rows invalid).
A lane whose row is off in ``row_mask`` or whose bank (r // 4) is off in ``bank_mask`` keeps
``old``; an enabled lane with an invalid source writes 0 when ``bound_ctrl`` is set, else keeps
``old`` (LLVM's update.dpp). Approximation: a source lane that EXEC disables is read as if it
were enabled (flysim keeps every lane's value; the hardware treats it as invalid).

permlane16 / permlane32 swap (gfx950 ``v_permlane{16,32}_swap``): the odd rows (of 16 or 32
lanes) of ``old`` trade places with the even rows of ``src``; rows 2k and 2k + 1 pair up.
"""

from __future__ import annotations

import functools

import torch

from .errors import UnsupportedOpError
from .program import op


def _wave(x, N):
    """x [N, ...] (or a scalar) as [N / 64 waves, 64 lanes, ...]."""
    x = x.expand(N, *x.shape) if x.dim() == 0 or x.shape[0] != N else x
    return x.reshape(N // 64, 64, *x.shape[1:])


@functools.lru_cache(maxsize=None)
def dpp_source(ctrl: int):
    """(source lane [64], valid [64]) of a DPP control, as CPU tensors."""
    i = torch.arange(64)
    r, row = i % 16, i // 16
    valid = torch.ones(64, dtype=torch.bool)
    if ctrl <= 0xFF:
        s = (i & ~3) | ((ctrl >> (2 * (i & 3))) & 3)
    elif 0x101 <= ctrl <= 0x10F or 0x111 <= ctrl <= 0x11F:
        rr = r + (ctrl & 15) if ctrl <= 0x10F else r - (ctrl & 15)
        valid = (rr >= 0) & (rr < 16)
        s = row * 16 + rr.clamp(0, 15)
    elif 0x121 <= ctrl <= 0x12F:
        s = row * 16 + (r - (ctrl & 15)) % 16
    elif ctrl in (0x130, 0x134, 0x138, 0x13C):
        step = 1 if ctrl in (0x130, 0x134) else -1
        s = i + step
        if ctrl in (0x130, 0x138):
            valid = (s >= 0) & (s < 64)
        s = s % 64
    elif ctrl == 0x140:
        s = row * 16 + 15 - r
    elif ctrl == 0x141:
        s = row * 16 + (r & 8) + 7 - (r & 7)
    elif ctrl in (0x142, 0x143):
        first = 1 if ctrl == 0x142 else 2
        valid = row >= first
        s = torch.where(row >= first, (row * 16 - 1) if ctrl == 0x142 else torch.full_like(i, 31), i)
    else:
        raise UnsupportedOpError(f"flysim does not implement DPP control {ctrl:#x}")
    return s, valid


def dpp(ex, old, src, ctrl, row_mask, bank_mask, bound_ctrl):
    """The update.dpp result for every lane of ``ex`` (see the module docstring)."""
    N = ex.N
    s, valid = dpp_source(ctrl)
    i = torch.arange(64)
    enabled = (((row_mask >> (i // 16)) & 1) == 1) & (((bank_mask >> ((i % 16) // 4)) & 1) == 1)
    dev = ex.device
    s, valid, enabled = s.to(dev), valid.to(dev), enabled.to(dev)
    sw, ow = _wave(src, N), _wave(old, N)
    moved = sw[:, s]
    keep = ~enabled | (~valid & (not bound_ctrl))
    zero = enabled & ~valid & bound_ctrl
    shape = (1, 64) + (1,) * (sw.dim() - 2)
    out = torch.where(keep.view(shape), ow, moved)
    out = torch.where(zero.view(shape), torch.zeros_like(out), out)
    return out.reshape(N, *sw.shape[2:])


def _int_attr(o, name):
    from flydsl._mlir import ir

    a = o.attributes[name]
    try:
        return int(ir.IntegerAttr(a).value)
    except (ValueError, TypeError):
        return int(bool(ir.BoolAttr(a).value))


@op("rocdl.update.dpp")
def _update_dpp(d, o):
    old, src = d.ins(o)[:2]
    (out,) = d.outs(o)
    ctrl, rm, bm, bc = (_int_attr(o, k) for k in ("dppCtrl", "rowMask", "bankMask", "boundCtrl"))

    def f(ex):
        ex.R[out] = dpp(ex, ex.R[old], ex.R[src], ctrl, rm, bm, bool(bc))

    return f


def dpp_intrinsic(d, o):
    """llvm.call_intrinsic @llvm.amdgcn.update.dpp.*(old, src, ctrl, row_mask, bank_mask, bound_ctrl)."""
    old, src, ctrl, rm, bm, bc = d.ins(o)
    (out,) = d.outs(o)

    def f(ex):
        R = ex.R
        ex.R[out] = dpp(ex, R[old], R[src], int(R[ctrl]), int(R[rm]), int(R[bm]), bool(R[bc]))

    return f


@op("rocdl.permlane16.swap", "rocdl.permlane32.swap")
def _permlane_swap(d, o):
    old, src = d.ins(o)[:2]
    (out,) = d.outs(o)
    w = 16 if "16" in o.name else 32

    def f(ex):
        a, b = _wave(ex.R[old], ex.N), _wave(ex.R[src], ex.N)
        ar, br = (t.reshape(t.shape[0], 64 // w // 2, 2, w, *t.shape[2:]) for t in (a, b))
        na = torch.stack([ar[:, :, 0], br[:, :, 0]], 2)  # even rows of old, even rows of src
        nb = torch.stack([ar[:, :, 1], br[:, :, 1]], 2)  # odd rows of old, odd rows of src
        ex.R[out] = (na.reshape(ex.N, *a.shape[2:]), nb.reshape(ex.N, *b.shape[2:]))

    return f
