"""``llvm.atomicrmw`` on global memory and LDS.

One instruction of N lanes may hit the same address many times (FlyDSL's RMSNorm backward
adds every row's contribution into one dweight row). The hardware serializes those
read-modify-writes in an order it does not specify; flysim picks one: lanes in increasing
global lane id (workgroup, then thread), element by element for vector operands. Each lane
gets the value its own update replaced (LLVM's result), and memory ends with the result of
the whole chain, so the returned old values form one valid serialization.

- add / sub / fadd / fsub: one pass. Per address, an exclusive prefix sum in lane order
  (int64 for integers, wrapped to the width; float64 for floats, rounded once) gives
  every lane's old value, the segment total the final one. The hardware rounds after each
  float addition, so float results may differ from it in the last bits.
- every other operation (xchg, cmpswap (buffer: operand pairs of new value and compared value), and, or, xor, nand, max, min, umax, umin, fmax, fmin,
  fmaximum, fminimum, uinc_wrap, udec_wrap, usub_cond, usub_sat): rounds; round r applies the r-th update of
  every address at once, so the rounds are as many as the most repeated address.

Byte counters count each lane's update once as read and once as written. Ordering and
syncscope are ignored: within a launch flysim executes each instruction for
all lanes before the next. LDS atomics are not part of the LDS race detector.
"""

from __future__ import annotations

import torch

from .errors import UnsupportedOpError
from .memory import _gather, _scatter
from .program import op
from .types import INT_OF, tinfo

_SUMS = {"add": 1, "sub": -1, "fadd": 1, "fsub": -1}


def _unsigned(x, bits):
    return x.to(torch.int64) & ((1 << bits) - 1)


def _update(kind, old, x, bits):
    """The value an atomic of ``kind`` stores, from the old value and the operand."""
    if kind == "xchg":
        return x
    if kind == "cmpswap":  # x [n, 2]: (new value, compared value)
        return torch.where(old == x[:, 1], x[:, 0], old)
    if kind == "and":
        return old & x
    if kind == "or":
        return old | x
    if kind == "xor":
        return old ^ x
    if kind == "nand":
        return ~(old & x)
    if kind in ("max", "min"):
        return torch.maximum(old, x) if kind == "max" else torch.minimum(old, x)
    if kind in ("umax", "umin"):
        uo, ux = _unsigned(old, bits), _unsigned(x, bits)
        return torch.where((ux > uo) if kind == "umax" else (ux < uo), x, old)
    if kind in ("fmax", "fmaximumnum"):
        return torch.fmax(old, x)
    if kind in ("fmin", "fminimumnum"):
        return torch.fmin(old, x)
    if kind in ("fmaximum", "fminimum"):
        return torch.maximum(old, x) if kind == "fmaximum" else torch.minimum(old, x)
    if kind == "uinc_wrap":
        uo, ux = _unsigned(old, bits), _unsigned(x, bits)
        return torch.where(uo >= ux, 0, uo + 1).to(old.dtype)
    if kind == "udec_wrap":
        uo, ux = _unsigned(old, bits), _unsigned(x, bits)
        return torch.where((uo == 0) | (uo > ux), ux, uo - 1).to(old.dtype)
    if kind in ("usub_cond", "usub_sat"):
        uo, ux = _unsigned(old, bits), _unsigned(x, bits)
        keep = uo if kind == "usub_cond" else torch.zeros_like(uo)
        return torch.where(uo >= ux, uo - ux, keep).to(old.dtype)
    raise UnsupportedOpError(f"flysim does not implement llvm.atomicrmw {kind}")


def _sum_only(kind, addr, x, read, write):
    """add / sub whose old values nobody reads: per address, the updates summed in lane order
    (float64 / int64: index_add_ over a dense window of the addresses, no sort), added once.
    False when the addresses are too sparse for the window."""
    lo, hi = int(addr.min()), int(addr.max())
    if hi - lo >= 8 * addr.numel() + (1 << 16):
        return False
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    rel = addr - lo
    acc = torch.zeros(hi - lo + 1, dtype=wide, device=x.device).index_add_(0, rel, x.to(wide) * _SUMS[kind])
    hit = torch.zeros(hi - lo + 1, dtype=torch.bool, device=x.device)
    hit[rel] = True
    pos = hit.nonzero().squeeze(1)
    uniq = pos + lo
    write(uniq, (read(uniq).to(wide) + acc[pos]).to(x.dtype))
    return True


def serialize(kind, addr, x, read, write, bits, need_old=True):
    """Apply the updates ``x`` [n] at element addresses ``addr`` [n] in index order.

    ``read(uniq)`` returns the current values at distinct addresses, ``write(uniq, vals)``
    stores them. Returns each update's old value [n] (None when not ``need_old`` and the sum
    took the no-sort path).
    """
    if not need_old and kind in _SUMS and addr.numel() and _sum_only(kind, addr, x, read, write):
        return None
    order = torch.argsort(addr, stable=True)
    a, xs = addr[order], x[order]
    uniq, inv, counts = torch.unique_consecutive(a, return_inverse=True, return_counts=True)
    cur = read(uniq)
    starts = torch.cumsum(counts, 0) - counts
    if kind in _SUMS:
        wide_dt = torch.float64 if x.dtype.is_floating_point else torch.int64
        w = xs.to(wide_dt) * _SUMS[kind]
        cs = torch.cumsum(w, 0)
        before = cs - w  # inclusive sum of the earlier updates (of every address)
        seg0 = before[starts]
        old = (cur.to(wide_dt)[inv] + before - seg0[inv]).to(x.dtype)
        final = (cur.to(wide_dt) + cs[starts + counts - 1] - seg0).to(x.dtype)
    else:
        old = torch.empty(xs.shape[:1], dtype=cur.dtype, device=xs.device)
        rank = torch.arange(a.numel(), device=a.device) - starts[inv]
        final = cur.clone()
        for r in range(int(counts.max()) if counts.numel() else 0):
            sel = (rank == r).nonzero().squeeze(1)
            seg = inv[sel]
            old[sel] = final[seg]
            final[seg] = _update(kind, final[seg], xs[sel], bits)
    write(uniq, final)
    out = torch.empty_like(old)
    out[order] = old
    return out


def _has_uses(o):
    """Whether a result of the op is read (an atomic whose old value nobody reads can skip it)."""
    try:
        return any(True for r in o.results for _ in r.uses)
    except AttributeError:  # bindings without use lists: assume used
        return True


def _bits_of(v, es):
    return v.view(INT_OF[es]) if v.dtype.is_floating_point else v.to(INT_OF[es])


def _of_bits(b, dtype):
    return b.view(dtype) if dtype.is_floating_point else b.to(dtype)


def _bin_op(attr):
    """The operation's name (LLVM's enum spelling without a leading underscore)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects.llvm import AtomicBinOp

    try:
        return str(AtomicBinOp(ir.IntegerAttr(attr).value)).lstrip("_")
    except (ValueError, TypeError):
        return str(attr).split()[-1].rstrip(">")


@op("llvm.atomicrmw")
def _atomicrmw(d, o):
    p, v = d.ins(o)
    (out,) = d.outs(o)
    kind = _bin_op(o.attributes["bin_op"])
    pt, ti = tinfo(str(o.operands[0].type)), tinfo(str(o.operands[1].type))
    cnt = 1
    for s in ti.vshape:
        cnt *= s
    es = ti.nbytes // cnt
    if kind not in _SUMS:
        _update(kind, torch.zeros(1, dtype=ti.dtype), torch.zeros(1, dtype=ti.dtype), 8 * es)  # unknown kind: fail at decode
    used = _has_uses(o)

    def f(ex):
        N = ex.N
        val = ex.R[v]
        val = val.expand(N, *ti.vshape) if val.dim() <= len(ti.vshape) else val
        val = val.reshape(N, cnt)
        ptr = ex.R[p].to(torch.int64).expand(N)
        if pt.addrspace == 3:
            lanes, base = ex.lds._lanes(ex, ptr, es * cnt, "atomic", f.loc)
            u8 = ex.lds.mem

            counted = ex.lds

            def read(a):
                return _of_bits(_gather(u8, a, es, 1, None)[:, 0], ti.dtype)

            def write(a, vals):
                _scatter(u8, a, es, 1, _bits_of(vals, es).unsqueeze(1))
        else:
            lanes = None if ex.mask is None else ex.mask.nonzero().squeeze(1)
            base = ptr if lanes is None else ptr[lanes]
            counted = ex.mem
            nr, nw = counted.bytes_read, counted.bytes_written

            def read(a):
                return _of_bits(ex.mem.load(a, ti.dtype, es, 1, None, a.numel())[:, 0], ti.dtype)

            def write(a, vals):
                ex.mem.store(a, _bits_of(vals, es).unsqueeze(1), es, 1, None, a.numel())
        x = val if lanes is None else val[lanes]
        addr = (base.unsqueeze(1) + torch.arange(cnt, device=base.device) * es).reshape(-1)
        old = serialize(kind, addr, x.reshape(-1), read, write, 8 * es, used)
        if counted is ex.mem:  # the byte counters count every lane's update, read and written
            counted.bytes_read, counted.bytes_written = nr, nw
        counted.bytes_read += addr.numel() * es
        counted.bytes_written += addr.numel() * es
        if old is None:
            return
        old = old.reshape(-1, cnt)
        res = old if lanes is None else torch.zeros(N, cnt, dtype=old.dtype, device=old.device).index_copy_(0, lanes, old)
        ex.R[out] = res.reshape(N, *ti.vshape) if ti.vshape else res.reshape(N)

    return f


_BUFFER_KINDS = {"fadd": "fadd", "fmax": "fmax", "smax": "max", "umin": "umin", "add": "add", "smin": "min",
                 "umax": "umax", "swap": "xchg", "and": "and", "or": "or", "xor": "xor", "fmin": "fmin",
                 "cmpswap": "cmpswap"}


@op(*(f"rocdl.raw.ptr.buffer.atomic.{k}" for k in _BUFFER_KINDS))
def _buffer_atomic(d, o):
    """Buffer atomics (vdata, [cmp,] rsrc, voffset, soffset, aux): address base + soffset +
    voffset. A vector operand (``buffer_atomic_pk_add_f16 / bf16``: vector<2xf16>,
    vector<2xbf16>) updates its elements at consecutive addresses, each one an update of its own
    in the serialization. A lane whose voffset + operand size passes num_records does nothing
    and returns 0 (as a buffer store is dropped), counted in oob_buffer_accesses. cmpswap
    stores vdata where memory holds cmp and returns the old value. Lanes serialize as
    llvm.atomicrmw's do."""
    from .ops_mem import _buffer_offsets

    kind = _BUFFER_KINDS[o.name.rsplit(".", 1)[1]]
    ins = d.ins(o)
    cmp = ins[1] if kind == "cmpswap" else None
    v, rs, voff, soff = (ins[0],) + tuple(ins[2:5] if cmp is not None else ins[1:4])
    outs = d.outs(o)
    used = bool(outs) and _has_uses(o)
    ti = tinfo(str(o.operands[0].type))
    cnt = 1
    for n in ti.vshape:
        cnt *= n
    es = ti.nbytes // cnt

    def f(ex):
        N = ex.N
        base, nrec = ex.R[rs]
        off, soffset = _buffer_offsets(ex, voff, soff, 0)
        inb = (off + ti.nbytes) <= nrec
        act = inb if ex.mask is None else inb & ex.mask
        ex.oob_buffer += int((~inb).sum() if ex.mask is None else (~inb & ex.mask).sum())
        lanes = act.nonzero().squeeze(1)
        start = (base + soffset + off).expand(N)[lanes]
        addr = (start.unsqueeze(1) + torch.arange(cnt, device=start.device) * es).reshape(-1)
        x = ex.R[v].expand(N, *ti.vshape).reshape(N, cnt)[lanes].reshape(-1)
        if cmp is not None:
            x = torch.stack([x, ex.R[cmp].expand(N)[lanes]], 1)
        nr, nw = ex.mem.bytes_read, ex.mem.bytes_written

        def read(a):
            return _of_bits(ex.mem.load(a, ti.dtype, es, 1, None, a.numel())[:, 0], ti.dtype)

        def write(a, vals):
            ex.mem.store(a, _bits_of(vals, es).unsqueeze(1), es, 1, None, a.numel())

        old = serialize(kind, addr, x, read, write, 8 * es, used)
        ex.mem.bytes_read, ex.mem.bytes_written = nr + addr.numel() * es, nw + addr.numel() * es
        if old is not None:
            old = old.reshape(-1, cnt)
            res = torch.zeros(N, cnt, dtype=ti.dtype, device=old.device).index_copy_(0, lanes, old.to(ti.dtype))
            ex.R[outs[0]] = res.reshape(N, *ti.vshape) if ti.vshape else res.reshape(N)

    return f
