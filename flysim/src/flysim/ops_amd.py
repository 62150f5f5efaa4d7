"""gpu and rocdl ops: ids, barriers, cross-lane ops, MFMA and AMDGPU intrinsics.

Cross-lane ops act within each wave of 64 lanes (values reshaped [W, 64, ...]).
MFMA lane layouts follow FlyDSL's MmaAtom (CDNA3/CDNA4) for single-block
MFMAs with M = N = MN, GroupK = 64 / MN and KPT = K / GroupK values per lane:
lane l holds A[l % MN][KPT*(l // MN) + v] and B[KPT*(l // MN) + v][l % MN];
with GroupM = 64 / N, accumulator value v of lane l is
D[4*(l // N) + v % 4 + 4*GroupM*(v // 4)][l % N].
"""

from __future__ import annotations

import re

import torch

from .errors import UnsupportedOpError
from .ops_lanes import _wave, dpp_intrinsic
from .ops_mem import _first_active
from .program import op
from .types import INT_OF, tinfo
from .waves import arrive

DIMS = {"x": 0, "y": 1, "z": 2}


def _ti(v):
    return tinfo(str(v.type))


def _dim(o):
    return DIMS[str(o.attributes["dimension"]).split()[-1].rstrip(">")]


@op("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim")
def _ids(d, o):
    (out,) = d.outs(o)
    k = _dim(o)
    kind = o.name

    def f(ex):
        if kind == "gpu.thread_id":
            ex.R[out] = ex.tid[k]
        elif kind == "gpu.block_id":
            ex.R[out] = ex.bid[k]
        elif kind == "gpu.block_dim":
            ex.R[out] = torch.tensor(ex.block[k], device=ex.device)
        else:
            ex.R[out] = torch.tensor(ex.grid[k], device=ex.device)

    return f


@op("rocdl.workitem.id.x", "rocdl.workitem.id.y", "rocdl.workitem.id.z",
    "rocdl.workgroup.id.x", "rocdl.workgroup.id.y", "rocdl.workgroup.id.z")
def _rocdl_ids(d, o):
    (out,) = d.outs(o)
    k = DIMS[o.name[-1]]
    dt = _ti(o.results[0]).dtype
    work = "workitem" in o.name

    def f(ex):
        ex.R[out] = (ex.tid if work else ex.bid)[k].to(dt)

    return f


@op("gpu.lane_id")
def _lane_id(d, o):
    (out,) = d.outs(o)

    def f(ex):
        ex.R[out] = ex.lane_in_wave

    return f


@op("gpu.barrier", "rocdl.s.barrier", "rocdl.barrier")
def _barrier(d, o):
    if d.depth > 1:
        d.nested_barrier = True
    fenced = o.name != "rocdl.s.barrier"  # gpu.barrier / rocdl.barrier: fence + s_barrier

    def f(ex):
        ex.lds.lgkm_fence(ex, fenced)
        arrive(ex)

    return f


_NOOPS = ("rocdl.sched.barrier", "rocdl.sched.group.barrier", "rocdl.s.setprio",
          "rocdl.s.nop", "rocdl.sched.setprio", "rocdl.s.sleep", "rocdl.iglp.opt", "llvm.intr.assume",
          "rocdl.s.waitcnt.vscnt", "rocdl.s.wait.loadcnt", "rocdl.s.wait.dscnt", "gpu.dealloc",
          "rocdl.asyncmark")  # async LDS loads complete at issue; their waits are below


@op(*_NOOPS)
def _noop(d, o):
    return None


def vmcnt_of(bitfield: int) -> int:
    """The vmcnt of a gfx9 s_waitcnt immediate: bits [3:0] and [15:14]."""
    return (bitfield & 0xF) | ((bitfield >> 10) & 0x30)


def lgkmcnt_of(bitfield: int) -> int:
    """The lgkmcnt of a gfx9 s_waitcnt immediate: bits [11:8]."""
    return (bitfield >> 8) & 0xF


@op("rocdl.s.waitcnt", "rocdl.wait.asyncmark")
def _waitcnt(d, o):
    """s_waitcnt vmcnt(n) retires all but the last n VMEM loads of each active wave (LDS DMA
    reads by other waves check it: memory.LDS), lgkmcnt(n) all but the last n LDS accesses;
    wait_asyncmark drains every VMEM load (lenient)."""
    from flydsl._mlir import ir

    bits = int(ir.IntegerAttr(o.attributes["bitfield"]).value) if o.name == "rocdl.s.waitcnt" else None
    n = 0 if bits is None else vmcnt_of(bits)

    def f(ex):
        ex.lds.vm_wait(ex, n)
        if bits is not None:
            ex.lds.lgkm_wait(ex, lgkmcnt_of(bits))

    return f


# -- cross-lane ----------------------------------------------------------------


def _gather_lanes(x, src, N):
    """x [N, ...] value, src [N] lane-in-wave source index -> x from that lane of the same wave."""
    xw = _wave(x, N)
    W = N // 64
    s = _wave(src, N).to(torch.int64)
    return xw[torch.arange(W, device=s.device).unsqueeze(1), s].reshape(N, *xw.shape[2:])


def _shuffle_dst(mode, lane, k, w):
    """Source lane and validity of gpu.shuffle for lanes ``lane`` (offset k, width w)."""
    start = lane - lane % w
    if mode == "xor":
        dst = lane ^ k
        ok = (dst >= start) & (dst < start + w)
    elif mode == "down":
        dst = lane + k
        ok = dst < start + w
    elif mode == "up":
        dst = lane - k
        ok = dst >= start
    else:
        dst = start + k
        ok = dst < start + w
    return torch.where(ok, dst, lane), ok


@op("gpu.shuffle")
def _shuffle(d, o):
    v, off, width = d.ins(o)
    out, valid = d.outs(o)
    mode = str(o.attributes["mode"]).split()[-1].rstrip(">")
    need_valid = any(True for _ in o.results[1].uses)
    perms = {}  # uniform (offset, width) -> the same 64-lane permutation for every wave

    def f(ex):
        x, k, w = ex.R[v], ex.R[off], ex.R[width]
        if k.dim() == 0 and w.dim() == 0:
            key = (int(k), int(w), x.device)
            p = perms.get(key)
            if p is None:
                p = perms[key] = _shuffle_dst(mode, torch.arange(64, device=x.device), key[0], key[1])
            dst, ok = p
            if x.dim() == 0:
                ex.R[out] = x
            else:
                xw = _wave(x, ex.N)
                ex.R[out] = xw.index_select(1, dst).reshape(ex.N, *xw.shape[2:])
            if need_valid:
                ex.R[valid] = ok.repeat(ex.N // 64)
            return
        dst, ok = _shuffle_dst(mode, ex.lane_in_wave, k.to(torch.int64), w.to(torch.int64))
        ex.R[out] = x if x.dim() == 0 else _gather_lanes(x, dst, ex.N)
        ex.R[valid] = ok

    return f


@op("rocdl.readfirstlane", "rocdl.readlane")
def _readfirstlane(d, o):
    ins = d.ins(o)
    (out,) = d.outs(o)
    first = o.name.endswith("readfirstlane")

    def f(ex):
        x = ex.R[ins[0]]
        if x.dim() == 0:
            ex.R[out] = x
        elif first:
            ex.R[out] = _first_active(ex, x)
        else:
            ex.R[out] = _gather_lanes(x, ex.R[ins[1]].expand(ex.N), ex.N)

    return f


@op("rocdl.ds_bpermute")
def _bpermute(d, o):
    a, v = d.ins(o)
    (out,) = d.outs(o)

    def f(ex):
        src = (ex.R[a].to(torch.int64) // 4) % 64
        ex.R[out] = _gather_lanes(ex.R[v], src.expand(ex.N), ex.N)

    return f


@op("rocdl.mbcnt.lo", "rocdl.mbcnt.hi")
def _mbcnt(d, o):
    m, base = d.ins(o)[:2]
    (out,) = d.outs(o)
    hi = o.name.endswith("hi")

    def f(ex):
        mask = ex.R[m].to(torch.int64) & 0xFFFFFFFF
        lane = ex.lane_in_wave
        n = (lane - 32).clamp(0, 32) if hi else lane.clamp(max=32)
        below = torch.where(n >= 32, torch.full_like(n, 0xFFFFFFFF), (1 << n) - 1)
        bits = mask & below
        cnt = torch.zeros_like(bits)
        for b in range(32):
            cnt += (bits >> b) & 1
        ex.R[out] = (cnt + ex.R[base].to(torch.int64)).to(torch.int32)

    return f


def f32_to_f16_rtz(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 rounded toward zero (v_cvt_pkrtz_f16_f32): torch rounds to nearest, so a
    result whose magnitude overshoots |x| steps one ulp back toward zero on its bits (an
    overflow to inf lands on 65504; NaN stays NaN)."""
    y = x.to(torch.float16)
    over = (y.float().abs() > x.abs()) & ~torch.isnan(x)
    return (y.view(torch.int16) - over.to(torch.int16)).view(torch.float16)


@op("rocdl.cvt.pkrtz")
def _cvt_pkrtz(d, o):
    """Two fp32 -> a <2 x half> rounded toward zero (v_cvt_pkrtz_f16_f32)."""
    a, b = d.ins(o)[:2]
    (out,) = d.outs(o)

    def f(ex):
        x = torch.stack([ex.R[a].float().expand(ex.N), ex.R[b].float().expand(ex.N)], dim=-1)
        ex.R[out] = f32_to_f16_rtz(x)

    return f


def _cvt_pk_f8(fmt_index):
    def h(d, o):
        """Two fp32 -> 8-bit floats written into 16-bit word word_sel of `old` (v_cvt_pk_fp8_f32 /
        v_cvt_pk_bf8_f32; the arch's formats: fnuz on gfx942, OCP on gfx950), round to nearest even.
        Values past the format's range are the caller's to clamp (the hardware without the clamp
        modifier does not saturate; torch's cast is what this returns)."""
        from flydsl._mlir import ir

        a, b, old = d.ins(o)[:3]
        (out,) = d.outs(o)
        attr = o.attributes["wordSel"]
        try:
            hi = bool(ir.IntegerAttr(attr).value)
        except ValueError:
            hi = bool(ir.BoolAttr(attr).value)

        def f(ex):
            dt = _FP8[ex.arch][fmt_index]
            x = torch.stack([ex.R[a].float().expand(ex.N), ex.R[b].float().expand(ex.N)], dim=-1)
            byt = x.to(dt).view(torch.uint8).to(torch.int64)
            word = byt[..., 0] | (byt[..., 1] << 8)
            o64 = ex.R[old].to(torch.int64).expand(ex.N) & 0xFFFFFFFF
            res = (o64 & 0x0000FFFF) | (word << 16) if hi else (o64 & 0xFFFF0000) | word
            ex.R[out] = torch.where(res >= 2**31, res - 2**32, res).to(torch.int32)

        return f

    return h


op("rocdl.cvt.pk.fp8.f32")(_cvt_pk_f8(0))
op("rocdl.cvt.pk.bf8.f32")(_cvt_pk_f8(1))


# -- scalar math intrinsics ---------------------------------------------------------

_UN = {"rocdl.exp2": torch.exp2, "rocdl.rcp": torch.reciprocal, "rocdl.rsq": torch.rsqrt,
       "rocdl.sqrt": torch.sqrt, "rocdl.log": torch.log2, "llvm.intr.exp2": torch.exp2,
       "llvm.intr.fabs": torch.abs, "llvm.intr.sqrt": torch.sqrt, "rocdl.fmed3": None}


def _mk_un(fn):
    def h(d, o):
        (a,) = d.ins(o)[:1]
        (out,) = d.outs(o)

        def f(ex):
            ex.R[out] = fn(ex.R[a])

        return f

    return h


for _n, _fn in _UN.items():
    if _fn is not None:
        op(_n)(_mk_un(_fn))


@op("llvm.intr.maxnum", "llvm.intr.minnum", "llvm.intr.maximum", "llvm.intr.minimum")
def _minmax(d, o):
    a, b = d.ins(o)
    (out,) = d.outs(o)
    fn = {"maxnum": torch.fmax, "minnum": torch.fmin, "maximum": torch.maximum, "minimum": torch.minimum}[o.name.split(".")[-1]]

    def f(ex):
        ex.R[out] = fn(ex.R[a], ex.R[b])

    return f


def _perm(src0, src1, sel):
    """v_perm_b32: byte i of the result is selected by byte i of sel from {src0:src1}."""
    comb = (src0.to(torch.int64) & 0xFFFFFFFF) << 32 | (src1.to(torch.int64) & 0xFFFFFFFF)
    s = sel.to(torch.int64) & 0xFFFFFFFF
    res = torch.zeros(torch.broadcast_shapes(comb.shape, s.shape), dtype=torch.int64, device=comb.device)
    for i in range(4):
        b = (s >> (8 * i)) & 0xFF
        pick = (comb >> (8 * b.clamp(max=7))) & 0xFF
        sign = ((comb >> (8 * (2 * (b - 8) + 1).clamp(0, 7) + 7)) & 1) * 0xFF
        byte = torch.where(b < 8, pick, torch.where(b < 12, sign, torch.where(b == 12, torch.zeros_like(b), torch.full_like(b, 0xFF))))
        res |= byte << (8 * i)
    return torch.where(res >= 1 << 31, res - (1 << 32), res).to(torch.int32)


@op("llvm.call_intrinsic")
def _call_intrinsic(d, o):
    name = str(o.attributes["intrin"]).strip('"')
    ins = d.ins(o)
    outs = d.outs(o)
    if name == "llvm.amdgcn.perm":
        def f(ex):
            ex.R[outs[0]] = _perm(*(ex.R[i] for i in ins))

        return f
    if name == "llvm.amdgcn.s.waitcnt":
        def f(ex):
            bits = int(ex.R[ins[0]])
            ex.lds.vm_wait(ex, vmcnt_of(bits))
            ex.lds.lgkm_wait(ex, lgkmcnt_of(bits))

        return f
    if name in ("llvm.amdgcn.sched.barrier", "llvm.amdgcn.s.setprio"):
        return None
    if name.startswith("llvm.amdgcn.update.dpp"):
        return dpp_intrinsic(d, o)
    raise UnsupportedOpError(f"flysim does not implement intrinsic {name}")


# -- MFMA -----------------------------------------------------------------------

_MFMA_RE = re.compile(r"rocdl\.mfma\.(?:scale\.)?(f32|i32)\.(\d+)x(\d+)x(\d+)\.?([a-z0-9.]*?)(\.1k)?$")
_FP8 = {"gfx942": (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz), "gfx950": (torch.float8_e4m3fn, torch.float8_e5m2)}
_FORMATS = {"fp8_e4m3": 0, "fp8_e5m2": 1, "fp6_e2m3": 2, "fp6_e3m2": 3, "fp4_e2m1": 4}  # cbsz / blgp format codes
_F8F6F4_BYTES = {0: 32, 1: 32, 2: 24, 3: 24, 4: 16}  # register bytes of one lane's 32 values


def _minifloat_table(ebits, mbits, bias):
    """Values of every code of a sign / ebits / mbits float without inf or NaN (OCP MX fp6, fp4)."""
    codes = torch.arange(1 << (1 + ebits + mbits))
    e = (codes >> mbits) & ((1 << ebits) - 1)
    m = (codes & ((1 << mbits) - 1)).double()
    mag = torch.where(e == 0, m / (1 << mbits) * 2.0 ** (1 - bias), (1 + m / (1 << mbits)) * torch.exp2(e.double() - bias))
    return torch.where(codes >> (ebits + mbits) == 1, -mag, mag)


_MINIFLOAT = {2: _minifloat_table(2, 3, 1), 3: _minifloat_table(3, 2, 3), 4: _minifloat_table(2, 1, 1)}


def _f8f6f4_codes(b, fmt):
    """Bytes [N, n] of one lane's register -> its 32 codes [N, 32], value v at bits [w*v, w*(v+1))
    of the little-endian register stream (fp4: low nibble first; fp6: 4 values per 3 bytes)."""
    b = b.to(torch.int64)
    if fmt == 4:
        return torch.stack([b & 0xF, b >> 4], dim=2).reshape(b.shape[0], -1)
    g = b.reshape(b.shape[0], -1, 3)
    b0, b1, b2 = g[..., 0], g[..., 1], g[..., 2]
    return torch.stack([b0 & 0x3F, (b0 >> 6) | ((b1 & 0xF) << 2), (b1 >> 4) | ((b2 & 0x3) << 4), b2 >> 2],
                       dim=2).reshape(b.shape[0], -1)


def _f8f6f4_operand(x, arch, N, fmt):
    """A scaled-MFMA operand register (vector<8|6|4xi32>) in format ``fmt`` -> float64 [N, 32].
    Only the format's leading bytes are read (fp6: 6 VGPRs, fp4: 4), as the hardware does."""
    b = x.contiguous().view(torch.uint8).reshape(N, -1)
    need = _F8F6F4_BYTES[fmt]
    if b.shape[1] < need:
        raise UnsupportedOpError(f"f8f6f4 format {fmt} needs {need // 4} dwords per lane, got {b.shape[1] // 4}")
    b = b[:, :need]
    if fmt < 2:
        return b.contiguous().view(_FP8[arch][fmt]).to(torch.float64)
    return _MINIFLOAT[fmt].to(b.device)[_f8f6f4_codes(b, fmt)]


def _e8m0(v, N, opsel):
    """Per-lane E8M0 scale (the byte ``opsel`` of the i32 operand) -> float64 2**(e - 127); 255 is NaN."""
    e = (v.to(torch.int64).expand(N) >> (8 * opsel)) & 0xFF
    return torch.where(e == 255, torch.full_like(e, float("nan"), dtype=torch.float64), torch.exp2(e.double() - 127))


def _operand(x, kind, arch, N, fmt=None):
    """Per-lane MFMA operand -> float tensor [N, KPT] (``fmt``: a scaled MFMA's f8f6f4 format code)."""
    if x.dim() == 0 or (x.dim() == 1 and x.shape[0] != N):
        x = x.expand(N, *x.shape)
    x = x.reshape(N, -1) if x.dim() > 1 else x.reshape(N, 1)
    if fmt is not None:
        return _f8f6f4_operand(x, arch, N, fmt)
    if "fp8" in kind or "bf8" in kind:
        b = x.contiguous().view(torch.uint8)
        return b.view(_FP8[arch][0 if kind.startswith("fp8") else 1]).to(torch.float32)
    if kind.startswith("bf16"):
        return x.contiguous().view(torch.bfloat16).to(torch.float32) if x.dtype != torch.bfloat16 else x.float()
    if kind.startswith("f16"):
        return x.contiguous().view(torch.float16).float() if x.dtype != torch.float16 else x.float()
    if kind.startswith("i8"):
        return x.contiguous().view(torch.int8).to(torch.float64)
    return x.float()


def _int_attr(a):
    from flydsl._mlir import ir

    try:
        return ir.IntegerAttr(a).value
    except ValueError:
        text = str(a)
        if text.endswith(" none>"):
            return 0
        for name, code in _FORMATS.items():
            if text.endswith(f" {name}>"):
                return code
        raise UnsupportedOpError(f"MFMA modifier {text} is not simulated")


def _is_const_zero(v):
    from flydsl._mlir import ir

    try:
        owner = v.owner
        if owner.name not in ("arith.constant", "llvm.mlir.constant"):
            return False
        return ir.IntegerAttr(owner.attributes["value"]).value == 0
    except (AttributeError, ValueError):
        return False


def _split_kinds(kind):
    parts = [p for p in kind.split(".") if p and p != "1k"]
    return (parts[0], parts[-1]) if parts else ("f32", "f32")


def _mfma(d, o):
    from flydsl._mlir import ir

    m = _MFMA_RE.match(o.name)
    if not m:
        raise UnsupportedOpError(f"unknown MFMA {o.name}")
    acc, M, N_, K, kind = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
    scaled = ".scale." in o.name
    ins = d.ins(o)
    (out,) = d.outs(o)
    ka, kb = _split_kinds(kind) if kind else ("f32", "f32")
    if kind in ("", "f32") or kind == "xf32":
        ka = kb = "f32"
    attrs = {n: _int_attr(o.attributes[n]) for n in o.attributes
             if n in ("cbsz", "abid", "blgp", "opselA", "opselB")}
    if not scaled and any(attrs.get(n, 0) for n in ("cbsz", "abid", "blgp")):
        raise UnsupportedOpError(f"{o.name}: broadcast/permute modifiers (cbsz/abid/blgp) are not simulated")
    MN = M
    GK = 64 // MN
    KPT = K // GK
    GM = 64 // N_
    V1 = M // 4 // GM
    short = o.name[len("rocdl."):]
    # Scale operands that are the constant 0 make LLVM select the unscaled
    # v_mfma_*_f8f6f4 (FlyDSL's fp8 GEMM relies on it); other values are E8M0
    # exponents with bias 127, one per lane's 32 K-values (byte chosen by opsel).
    # Scaled kinds: products and sum in float64 (exact for the fp4 / fp6 / fp8 codes and
    # scales of normal range), C added, rounded to f32 once.
    unscaled = scaled and all(_is_const_zero(v) for v in list(o.operands)[3:])

    def f(ex):
        R = ex.R
        Nl = ex.N
        W = Nl // 64
        fa = fb = None
        if scaled:
            fa, fb = attrs.get("cbsz", 0), attrs.get("blgp", 0)
            if fa not in _F8F6F4_BYTES or fb not in _F8F6F4_BYTES:
                raise UnsupportedOpError(f"{o.name}: operand format code cbsz={fa} / blgp={fb} is not one of 0..4")
        a = _operand(R[ins[0]], ka, ex.arch, Nl, fa)
        b = _operand(R[ins[1]], kb, ex.arch, Nl, fb)
        if a.shape[1] != KPT or b.shape[1] != KPT:
            raise UnsupportedOpError(f"{o.name}: expected {KPT} values per lane, got {a.shape[1]} (multi-block MFMA?)")
        if scaled and not unscaled:
            ia, ib = (3, 4) if len(ins) == 5 else (4, 6)
            a = a * _e8m0(R[ins[ia]], Nl, attrs.get("opselA", 0)).unsqueeze(1)
            b = b * _e8m0(R[ins[ib]], Nl, attrs.get("opselB", 0)).unsqueeze(1)
        c = R[ins[2]]
        c = c.expand(Nl, *c.shape) if c.dim() <= 1 and (c.dim() == 0 or c.shape[0] != Nl) else c
        A = a.reshape(W, GK, MN, KPT).permute(0, 2, 1, 3).reshape(W, MN, K)
        B = b.reshape(W, GK, MN, KPT).permute(0, 1, 3, 2).reshape(W, K, MN)
        cdt = torch.float64 if acc == "i32" or scaled else torch.float32
        C = c.to(cdt).reshape(W, GM, N_, V1, 4).permute(0, 3, 1, 4, 2).reshape(W, M, N_)
        D = torch.baddbmm(C, A.to(cdt), B.to(cdt))
        dv = D.reshape(W, V1, GM, 4, N_).permute(0, 2, 4, 1, 3).reshape(Nl, V1 * 4)
        R[out] = dv.to(torch.int32) if acc == "i32" else dv.to(torch.float32)
        ex.mfma[short] = ex.mfma.get(short, 0) + _waves_executing(ex, W)

    return f


def _waves_executing(ex, W):
    """Waves that issue the instruction: those with an active lane (a wave whose lanes all
    skip a branch jumps over it on the hardware, so its MFMAs are not executed)."""
    if ex.mask is None:
        return W
    return int(ex.mask.reshape(W, 64).any(1).sum())


from .program import PREFIX_OPS  # noqa: E402

PREFIX_OPS.update({"rocdl.mfma.": _mfma, "rocdl.mfma.scale.": _mfma})


@op("rocdl.ballot")
def _ballot_op(d, o):
    (a,) = d.ins(o)[:1]
    (out,) = d.outs(o)
    wide = _ti(o.results[0]).nbytes == 8

    def f(ex):
        b = ex.R[a].expand(ex.N).reshape(-1, 64).to(torch.int64)
        if ex.mask is not None:
            b = b & ex.mask.reshape(-1, 64).to(torch.int64)
        w = (b << torch.arange(64, device=b.device)).sum(1).repeat_interleave(64)
        ex.R[out] = w if wide else (w & 0xFFFFFFFF).to(torch.int32)

    return f


@op("llvm.intr.expect")
def _expect(d, o):
    a = d.ins(o)[0]
    (out,) = d.outs(o)

    def f(ex):
        ex.R[out] = ex.R[a]

    return f
