"""Pointers, llvm loads/stores, aggregates and AMDGPU buffer operations.

A pointer is an int64 address. Address space 3 is LDS (offset inside the
workgroup's allocation), 8 a buffer resource, anything else global memory.
A buffer resource is a tuple ``(base, num_records)``; a buffer access reads
byte ``base + soffset + voffset + imm``. Its bounds check compares only
``voffset + imm`` (unsigned 32-bit) with num_records: soffset is excluded, as
LLVM's AMDGPU buffer intrinsics document. Elements past num_records read 0 and
write nothing, per element, as the hardware does; such accesses are counted in
``oob_buffer_accesses``.
"""

from __future__ import annotations

import torch

from .program import op
from .types import INT_OF, tinfo


def _ti(v):
    return tinfo(str(v.type))


def _from_bits(raw, ti, N):
    """int tensor [N, count] of the element width -> value of type ti."""
    v = raw.view(ti.dtype) if ti.dtype.is_floating_point else raw.to(ti.dtype) if ti.dtype == torch.bool else raw.view(ti.dtype)
    return v.reshape(N, *ti.vshape) if ti.vshape else v.reshape(N)


def _to_bits(x, ti, N):
    if x.dtype == torch.bool:
        x = x.to(torch.int8)
    x = x.view(INT_OF[x.element_size()]) if x.dtype.is_floating_point else x
    count = max(1, ti.nbytes // _esize(ti))
    return x.expand(N, *ti.vshape).reshape(N, count) if x.dim() <= len(ti.vshape) else x.reshape(N, count)


def _esize(ti):
    return ti.nbytes // max(1, _count(ti))


def _count(ti):
    n = 1
    for s in ti.vshape:
        n *= s
    return n


@op("llvm.load")
def _load(d, o):
    (p,) = d.ins(o)
    (out,) = d.outs(o)
    pt, ti = _ti(o.operands[0]), _ti(o.results[0])
    es, cnt = _esize(ti), _count(ti)
    loc = None

    def f(ex):
        if pt.addrspace == 3:
            raw = ex.lds.load(ex, ex.R[p], es, cnt, f.loc)
        else:
            ex.lds.vm_issue(ex)
            raw = ex.mem.load(ex.R[p], ti.dtype, es, cnt, ex.mask, ex.N)
        ex.R[out] = _from_bits(raw, ti, ex.N)

    return f


@op("llvm.store")
def _store(d, o):
    v, p = d.ins(o)
    pt, ti = _ti(o.operands[1]), _ti(o.operands[0])
    es, cnt = _esize(ti), _count(ti)

    def f(ex):
        bits = _to_bits(ex.R[v], ti, ex.N)
        if pt.addrspace == 3:
            ex.lds.store(ex, ex.R[p], bits, es, cnt, f.loc)
        else:
            ex.mem.store(ex.R[p], bits, es, cnt, ex.mask, ex.N)

    return f


@op("llvm.getelementptr")
def _gep(d, o):
    from flydsl._mlir import ir

    base, *dyn = d.ins(o)
    (out,) = d.outs(o)
    raw = list(ir.DenseI32ArrayAttr(o.attributes["rawConstantIndices"]))
    et = tinfo(str(ir.TypeAttr(o.attributes["elem_type"]).value))
    steps = []  # (scale, const or dynamic slot)
    cur = et
    it = iter(dyn)
    for k, r in enumerate(raw):
        idx = next(it) if r == -(1 << 31) else int(r)
        if k == 0:
            steps.append((cur.nbytes, idx, isinstance(idx, int) and r != -(1 << 31)))
        elif cur.kind == "struct":
            off = sum(f.nbytes for f in cur.fields[:idx])
            steps.append((1, off, True))
            cur = cur.fields[idx]
        else:
            cur = cur.fields[0] if cur.kind == "array" else tinfo(cur.text.split("x")[-1].rstrip(">"))
            steps.append((cur.nbytes, idx, r != -(1 << 31)))

    def f(ex):
        a = ex.R[base]
        for scale, idx, const in steps:
            a = a + (idx if const else ex.R[idx].to(torch.int64)) * scale
        ex.R[out] = a

    return f


@op("llvm.extractvalue")
def _extractvalue(d, o):
    from flydsl._mlir import ir

    (s,) = d.ins(o)
    (out,) = d.outs(o)
    pos = list(ir.DenseI64ArrayAttr(o.attributes["position"]))

    def f(ex):
        v = ex.R[s]
        for p in pos:
            v = v[p] if isinstance(v, tuple) else v[..., p]
        ex.R[out] = v

    return f


@op("llvm.insertvalue")
def _insertvalue(d, o):
    from flydsl._mlir import ir

    s, v = d.ins(o)
    (out,) = d.outs(o)
    pos = list(ir.DenseI64ArrayAttr(o.attributes["position"]))

    def put(agg, path, val):
        if not path:
            return val
        if isinstance(agg, tuple):
            lst = list(agg)
            lst[path[0]] = put(agg[path[0]], path[1:], val)
            return tuple(lst)
        y = agg.clone() if agg.dim() >= val.dim() + 1 else agg.expand(*val.shape, agg.shape[-1]).clone()
        y[..., path[0]] = val
        return y

    def f(ex):
        ex.R[out] = put(ex.R[s], pos, ex.R[v])

    return f


@op("llvm.addrspacecast", "llvm.ptrtoint", "llvm.inttoptr")
def _ptrcast(d, o):
    (a,) = d.ins(o)
    (out,) = d.outs(o)
    to = _ti(o.results[0])

    def f(ex):
        ex.R[out] = ex.R[a].to(to.dtype)

    return f


@op("llvm.mlir.addressof")
def _addressof(d, o):
    (out,) = d.outs(o)
    name = str(o.attributes["global_name"]).lstrip("@")
    off, _size = d.info.lds_globals[name]
    val = torch.tensor(off, dtype=torch.int64)

    def f(ex):
        ex.R[out] = val.to(ex.device)

    return f


# -- buffer resources -----------------------------------------------------------


@op("rocdl.make.buffer.rsrc")
def _make_rsrc(d, o):
    base, _stride, nrec, _flags = d.ins(o)
    (out,) = d.outs(o)

    def f(ex):
        ex.R[out] = (ex.R[base], ex.R[nrec].to(torch.int64) & 0xFFFFFFFF if ex.R[nrec].dtype != torch.int64 else ex.R[nrec])

    return f


def _buffer_offsets(ex, voff, soff, imm):
    """(checked, soffset): the bounds-checked part voffset + imm, and the unchecked soffset.

    The access reads base + soffset + voffset + imm; only voffset + imm is compared with
    num_records (LLVM's AMDGPU buffer intrinsics: soffset is "excluded from bounds checking")."""
    checked = ex.R[voff].to(torch.int64) & 0xFFFFFFFF
    if imm:
        checked = checked + imm
    return checked.expand(ex.N), ex.R[soff].to(torch.int64) & 0xFFFFFFFF


def _all_inside(off, nrec, nbytes, mask):
    """Every active lane's whole access lies inside num_records (uniform nrec only)."""
    if nrec.dim() != 0:
        return False
    hi = off.max() if mask is None else torch.where(mask, off, 0).max()
    return int(hi) + nbytes <= int(nrec)


def _oob_mask(ex, off, nrec, es, cnt):
    """[N, cnt] bool: element j of lane l lies inside num_records."""
    ends = off.reshape(-1, 1) + torch.arange(1, cnt + 1, device=off.device) * es
    return ends <= nrec.reshape(-1, 1) if nrec.dim() else ends <= nrec


@op("rocdl.raw.ptr.buffer.load")
def _buf_load(d, o):
    rs, voff, soff = d.ins(o)[:3]
    (out,) = d.outs(o)
    ti = _ti(o.results[0])
    es, cnt = _esize(ti), _count(ti)
    if es < 4 and cnt > 1:
        pass

    def f(ex):
        base, nrec = ex.R[rs]
        N = ex.N
        off, soffset = _buffer_offsets(ex, voff, soff, 0)
        base = base + soffset
        m = ex.mask
        ex.lds.vm_issue(ex)
        if _all_inside(off, nrec, es * cnt, m):
            ex.R[out] = _from_bits(ex.mem.load(base + off, ti.dtype, es, cnt, m, N), ti, N)
            return
        inb = _oob_mask(ex, off, nrec, es, cnt)
        act = inb if m is None else inb & m.view(-1, 1)
        lane_ok = act.all(1)
        partial = act.any(1) & ~lane_ok
        ex.oob_buffer += int(((~inb).any(1) if m is None else ((~inb).any(1) & m)).sum())
        if bool(partial.any()):
            raw = torch.zeros(N, cnt, dtype=INT_OF[es], device=off.device)
            for j in range(cnt):
                mj = act[:, j]
                raw[:, j] = ex.mem.load(base + off + j * es, ti.dtype, es, 1, mj, N)[:, 0]
        else:
            raw = ex.mem.load(base + off, ti.dtype, es, cnt, lane_ok, N)
        ex.R[out] = _from_bits(raw, ti, N)

    f.rsrc = rs  # OutOfBoundsError names its num_records
    return f


@op("rocdl.raw.ptr.buffer.store")
def _buf_store(d, o):
    v, rs, voff, soff = d.ins(o)[:4]
    ti = _ti(o.operands[0])
    es, cnt = _esize(ti), _count(ti)

    def f(ex):
        base, nrec = ex.R[rs]
        N = ex.N
        off, soffset = _buffer_offsets(ex, voff, soff, 0)
        base = base + soffset
        m = ex.mask
        bits = _to_bits(ex.R[v], ti, N)
        if _all_inside(off, nrec, es * cnt, m):
            ex.mem.store(base + off, bits, es, cnt, m, N)
            return
        inb = _oob_mask(ex, off, nrec, es, cnt)
        act = inb if m is None else inb & m.view(-1, 1)
        ex.oob_buffer += int(((~inb).any(1) if m is None else ((~inb).any(1) & m)).sum())
        lane_ok = act.all(1)
        if bool((act.any(1) & ~lane_ok).any()):
            for j in range(cnt):
                ex.mem.store(base + off + j * es, bits[:, j:j + 1], es, 1, act[:, j], N)
        else:
            ex.mem.store(base + off, bits, es, cnt, lane_ok, N)

    f.rsrc = rs  # OutOfBoundsError names its num_records
    return f


@op("rocdl.raw.ptr.buffer.load.lds", "rocdl.raw.ptr.buffer.load.async.lds")
def _buf_load_lds(d, o):
    """Buffer load written straight into LDS (LDS DMA; gfx950 adds 12- and 16-byte sizes).

    Global byte offset voffset + soffset + imm, bounds-checked per lane like any buffer load
    (an out-of-range lane writes zeros); LDS byte address: the wave's first active lane's
    LDS pointer (the hardware takes it from M0) + imm + lane-in-wave * size. The async form
    (completion tracked by asyncmark / wait_asyncmark instead of the compiler's waits) is
    executed at issue like the synchronous one: flysim does not check its waits.
    """
    from flydsl._mlir import ir

    rs, ldsptr, size, voff, soff, imm, aux = d.ins(o)[:7] if len(o.operands) >= 7 else (d.ins(o) + [None] * 7)[:7]
    attrs = {n: o.attributes[n] for n in o.attributes}

    def f(ex):
        R = ex.R
        nbytes = int(R[size]) if size is not None else int(ir.IntegerAttr(attrs["size"]).value)
        ioff = int(R[imm]) if imm is not None else 0
        base, nrec = R[rs]
        N = ex.N
        off, soffset = _buffer_offsets(ex, voff, soff, ioff)
        base = base + soffset
        inb = (off + nbytes) <= nrec
        m = ex.mask
        act = inb if m is None else inb & m
        ex.oob_buffer += int((~inb).sum() if m is None else (~inb & m).sum())
        es = nbytes if nbytes in INT_OF else 1
        cnt = nbytes // es
        raw = ex.mem.load(base + off, None, es, cnt, act, N)
        lp = R[ldsptr].to(torch.int64)
        lp = _first_active(ex, lp) if lp.dim() else lp
        dst = lp + ioff + ex.lane_in_wave * nbytes
        ex.lds.vm_issue(ex)
        ex.lds.store(ex, dst, raw, es, cnt, f.loc, dma=True)

    f.rsrc = rs  # OutOfBoundsError names its num_records
    return f


def _first_active(ex, x):
    """Per-wave value of the first active lane, broadcast to all lanes of the wave."""
    W = ex.N // 64
    xw = x.reshape(W, 64, *x.shape[1:])
    m = torch.ones(W, 64, dtype=torch.bool, device=x.device) if ex.mask is None else ex.mask.reshape(W, 64)
    first = torch.where(m.any(1), m.to(torch.int8).argmax(1), 0)
    sel = xw[torch.arange(W, device=x.device), first]
    return sel.repeat_interleave(64, dim=0)


# -- gfx950 LDS transpose reads -------------------------------------------------

_TR = {"rocdl.ds.read.tr4.b64": (4, 8), "rocdl.ds.read.tr8.b64": (8, 8),
       "rocdl.ds.read.tr6.b96": (6, 12), "rocdl.ds.read.tr16.b64": (16, 8)}


def transpose_read(raw, w):
    """ds_read_tr<w>: exchange of w-bit elements within each group of 16 lanes.

    Each lane of a 16-lane group reads its own ``S`` bits (64, or 96 for tr6):
    E = S / w elements. The group's 16*E elements, lane-major, form a matrix of
    E rows x 16 columns (row r = lanes (16/E)*r.. of the group, for tr16 a 4x16
    tile whose row r is lanes 4r..4r+3); lane t receives column t, so element v
    of lane t is element ``t + 16 v`` of the group's stream. This is FlyDSL's
    CDNA4 LdsReadTranspose copy atom (source layout (16 thr, S bits):(S, 1),
    destination (16 thr, (w, E)):(w, (1, 16 w)) in bits). ``raw``: uint8 [N, S/8].
    """
    N, nb = raw.shape
    E = nb * 8 // w
    if w in (8, 16):
        el = raw.contiguous().view(torch.int8 if w == 8 else torch.int16)  # [N, E]
        return el.reshape(N // 16, E, 16).transpose(1, 2).reshape(N, E).contiguous().view(torch.uint8)
    bits = (raw.to(torch.int32).unsqueeze(-1) >> torch.arange(8, device=raw.device)) & 1  # [N, nb, 8] lsb first
    bits = bits.reshape(N // 16, E, 16, w).transpose(1, 2).reshape(N, nb, 8)
    return (bits << torch.arange(8, device=raw.device)).sum(-1).to(torch.uint8)


@op(*_TR)
def _ds_read_tr(d, o):
    (p,) = d.ins(o)[:1]
    (out,) = d.outs(o)
    w, nbytes = _TR[o.name]
    ti = _ti(o.results[0])
    es, cnt = _esize(ti), _count(ti)

    def f(ex):
        raw = ex.lds.load(ex, ex.R[p], 1, nbytes, f.loc).view(torch.uint8)
        tr = transpose_read(raw, w).view(INT_OF[es])
        ex.R[out] = _from_bits(tr, ti, ex.N)

    return f
