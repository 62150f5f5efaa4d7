"""RoPE of q and k and the K / V cache writes of one attention layer in one launch.

A Llama-style layer after its QKV GEMM rotates q and k (rotary position embeddings) and writes k
and v into the static cache [B, Hkv, S_max, D] at the step's positions. Written as separate kernels
that is four launches of next to no work each (two rotations, two scatters); here it is one kernel
whose workgroups are split into sections:

    rope section   out(c) = x(c) * cos(c) - x(p) * sin(c)   first member of a pair (m = 0)
                   out(c) = x(c) * cos(c) + x(p) * sin(c)   second member (m = 1)
                   over the rotated tensor R (its last dim holds the pairs' members h = R[-1] / 2
                   apart: rotate-half has h = D / 2; interleaved pairs are R = [.., D / 2, 2], h = 1);
                   p is c's partner, m = c[-1] // h. x, cos and sin are any strided views over R
                   (a column slice of the QKV GEMM's output is read in place; cos / sin broadcast
                   by stride 0, one coefficient per pair or per element). The result goes to a
                   fresh contiguous output (q; k where there is no cache) or straight into the
                   cache: R's flat index o is the written region's element sum(c_d * vs_d) (vs: the
                   region's strides over R, from the graph's view chain), the indexed dim read
                   from the positions on the device. Partial rotary (`rot` < R[-1], GPT-NeoX's
                   rotary_pct): features c[-1] >= rot are x's own values (eager's `cat` of the
                   rotated and the pass-through parts), so the whole head leaves this launch.
    norm           (optional, per rope section) x RMS-normalized first, in fp32, rounded to x's dtype:
                   over R's last dim (a head row of n elements, n a power of two <= BLOCK: the row is n
                   consecutive threads of one workgroup, each loads its own element, and the row's sum of
                   squares is a butterfly over its lanes, plus the waves' sums through LDS where n > 64;
                   other n: a workgroup per row, as below), or over
                   several dims of R (`wide`: OLMo2's norm over all heads of a token): then the section
                   runs one workgroup per token, whose threads take the row's elements t, t + BLOCK, ...,
                   and the row's sum of squares is a butterfly per wave plus the waves' sums in LDS.
    copy section   the cache write of v, the scatter kernel's map (layout/scatter.py): the values
                   a strided view of the QKV output, the destination the cache, in place.

Math in fp32 (x, cos, sin loaded in their dtype), one rounding to the output's dtype: in fp32 it is
eager's own sequence (a product, a product, a sum) and bit-exact. The output's dtype may be narrower
than the inputs' (out_dtype): gpt-fast's `x.float()` ... `.type_as(x)` around a bf16 model's rotation
is this kernel reading bf16 x and storing bf16, the fp32 math in between (translator/lowerings/
rope_casts.py); a rotation stored into the cache is rounded to the cache's dtype. One thread per
element of a rope section (the partner is loaded again by its own thread; decode moves a few KB), one per vector of
the copy section. A position out of range stores nothing and raises the flag word; on CPU tensors
(flysim) the host raises IndexError, as the scatter kernel does. Everything is static: the builder
is memoized per `Fused` and arch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, range_constexpr
import torch

from translator_kernels import device_math as em
from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.arch import DTYPE_NAMES, NAMED_DTYPES
from translator_kernels.codegen.host import current_arch
from translator_kernels.errors import KernelInputError
from translator_kernels.layout import _DUMMY, _INT, MAX_BYTES, _geometry_index
from translator_kernels.layout.kernel import BLOCK, _raise_flag, _store, _value, vector_grid
from translator_kernels.rows import common as rc
from translator_kernels.layout.scatter import Scatter, _check_ids, _dst_offset, dst_offset, scatter_map

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class RopeSec:
    """One rotated tensor, static."""

    shape: tuple  # R
    x: tuple  # element strides of x, cos, sin over R's dims
    cos: tuple
    sin: tuple
    dts: tuple  # dtype names of x, cos, sin, the output
    region: tuple = ()  # into a cache: the written region's shape
    vs: tuple = ()  # its strides over R's flat index
    dst: tuple = ()  # SrcDim per cache dim (the indexed one reads the positions)
    dst_strides: tuple = ()
    norm: str = ""  # RMS-normalized over the last dim before the rotation: the weight's dtype name
    rot: int = 0  # rotated features of the last dim (partial rotary); the rest pass through; 0: all
    wide: tuple = ()  # a norm over more than the last dim (OLMo2's q_norm over all heads): R's dims of one
    # norm row, outermost first (the weight's index row-major over them); R's last dim is the innermost. Also
    # (R's last dim,) for a head row that a workgroup's threads do not hold whole (_coop): a workgroup per row

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row(self) -> int:
        """Elements of one norm row (wide sections)."""
        return math.prod(self.shape[d] for d in self.wide)

    @property
    def tokens(self) -> tuple:
        """R's dims outside the norm row (wide sections): one workgroup per index over them."""
        return tuple(d for d in range(len(self.shape)) if d not in self.wide)


@dataclass(frozen=True)
class Fused:
    ropes: tuple  # RopeSec, one or two
    copy: Scatter | None  # v into its cache
    id_words: int  # 1: int32 positions, 2: int64, 0: none
    eps: float = 0.0  # of the norms (RopeSec.norm)


def _grids(f: Fused) -> list:
    g = [max(1, math.prod(r.shape[d] for d in r.tokens) if r.wide else -(-r.numel // BLOCK)) for r in f.ropes]
    if f.copy is not None:
        g.append(vector_grid(f.copy.read)[3])
    return g


def _coords(o, shape):
    """o's index per dim of the contiguous `shape` (plain Python over static sizes)."""
    out, acc = [], 1
    for d in range(len(shape) - 1, -1, -1):
        c = o if acc == 1 else o // acc
        out.append(c % shape[d] if d > 0 else c)
        acc *= shape[d]
    return out[::-1]


def _dot(coords, strides):
    off = 0
    for c, st in zip(coords, strides):
        if st:
            off = off + (c if st == 1 else c * st)
    return fx.Int32(off) if not isinstance(off, int) else off


def _round(v, dt: str):
    """fp32 lanes rounded to dtype `dt` and widened back (what a store and a load in dt give)."""
    return v if dt == "f32" else v.to({"bf16": fx.BFloat16, "f16": fx.Float16}[dt]).to(em.F32)


def _coop(sec: RopeSec) -> bool:
    """A per-head norm whose rows the threads of a workgroup reduce together: n = R's last dim a power of two
    <= BLOCK, so a row is n consecutive threads of one workgroup (R's flat index is the thread's). Other n run
    as a wide section of one dim (_rope_sec), a workgroup per row."""
    return bool(sec.norm) and not sec.wide


def _scaled(sec: RopeSec, c, x, xp, W, rstd):
    """x and its partner times the norm row's rstd and their weights, rounded to x's dtype (flydsl.rms_norm's
    output). The weight index is row-major over the row's dims (R's last dim for a per-head norm); the partner
    differs in the last dim only."""
    pos, acc = 0, 1
    for d in (sec.wide or (len(sec.shape) - 1,))[::-1]:
        pos = pos + (c[d] if acc == 1 else c[d] * acc)
        acc *= sec.shape[d]
    h = sec.shape[-1] // 2
    ppos = pos + h - (c[-1] // h) * (2 * h)
    w, wp = em.load_vec(W, sec.norm, 1, pos), em.load_vec(W, sec.norm, 1, ppos)
    dt = sec.dts[0]
    return _round(x * rstd * w, dt), _round(xp * rstd * wp, dt)


def _rotate(sec: RopeSec, o, X, C, S):
    """The rotated value at R's flat index o (a 1-lane fp32 vector)."""
    c = _coords(o, sec.shape)
    if not sec.rot:
        return _rotate_at(sec, c, X, C, S)
    # partial rotary: features at or past `rot` are x itself; the rotation is computed at a clamped column
    # (its loads stay inside x's rotated part and cos / sin) and the pass-through value selected over it
    inside = c[-1] < sec.rot
    y = _rotate_at(sec, [*c[:-1], inside.select(c[-1], 0)], X, C, S)
    x = em.load_vec(X, sec.dts[0], 1, _dot(c, sec.x))
    return fx.Vector.filled(1, inside, fx.Boolean).select(y, x)


def _rotate_at(sec: RopeSec, c, X, C, S, W=None, rstd=None, x=None):
    """The rotated value at R's coordinates c (inside the rotated part of the last dim); rstd: the norm row's
    (wide and cooperative sections), x: the element's value where the caller loaded it."""
    h = (sec.rot or sec.shape[-1]) // 2
    xo, co, so = _dot(c, sec.x), _dot(c, sec.cos), _dot(c, sec.sin)
    m = c[-1] if h == 1 else c[-1] // h
    ps = h * sec.x[-1]  # the partner's distance in x
    po = xo + ps - m * (2 * ps)
    x = em.load_vec(X, sec.dts[0], 1, xo) if x is None else x
    xp = em.load_vec(X, sec.dts[0], 1, po)
    if rstd is not None:
        x, xp = _scaled(sec, c, x, xp, W, rstd)
    a = x * em.load_vec(C, sec.dts[1], 1, co)
    t = xp * em.load_vec(S, sec.dts[2], 1, so)
    return fx.Vector.filled(1, m == 0, fx.Boolean).select(a - t, a + t)


def _cache_offset(sec: RopeSec, o, Ids, words):
    """(cache element offset of R's element o, positions-in-range flag)."""
    rc = [0 if n == 1 else (o if st == 1 else o // st) % n for n, st in zip(sec.region, sec.vs)]
    return dst_offset(sec.dst, sec.dst_strides, rc, Ids, words)


@kl.builder
def build_rope_cache(f: Fused, arch: str):
    """Launcher `launch(X0, C0, S0, O0, W0, X1, C1, S1, O1, W1, V, Vc, Ids, Flag)`: flat buffers from each
    tensor's first element (O1 is the k cache where the second rope is written into it; W0 / W1 the
    norms' weights; V / Vc as integers of the element width), Ids int32 words, Flag one int32 word;
    absent ones a dummy word. arch keys the cache."""
    grids = _grids(f)
    starts = [sum(grids[:i]) for i in range(len(grids))]
    r0 = f.ropes[0]
    r1 = f.ropes[1] if len(f.ropes) > 1 else None
    sc = f.copy
    words = f.id_words
    if sc is not None:
        vshape, nv, ostride, _ = vector_grid(sc.read)
    B1 = starts[1] if len(grids) > 1 else 0
    B2 = starts[2] if len(grids) > 2 else 0
    cached0, cached1 = bool(r0.region), r1 is not None and bool(r1.region)
    copies = sc is not None
    eps = f.eps
    WAVES = BLOCK // 64

    # the waves' sums of a wide section (its annotation evaluated here: this module's annotations are strings)
    Scratch = fx.struct(type("Scratch", (), {"__annotations__": {"red": fx.Array[fx.Float32, WAVES, 16]}}))

    @flyc.kernel
    def rope_cache_kernel(X0: fx.Tensor, C0: fx.Tensor, S0: fx.Tensor, O0: fx.Tensor, W0: fx.Tensor,
                          X1: fx.Tensor, C1: fx.Tensor, S1: fx.Tensor, O1: fx.Tensor, W1: fx.Tensor,
                          V: fx.Tensor, Vc: fx.Tensor, Ids: fx.Tensor, Flag: fx.Tensor):
        def wide_section(sec, tok, t, X, C, S, O, W, Ids, Flag, slots):
            """One norm row (token `tok`) of a wide section: each thread sums the squares of elements t, t + BLOCK,
            ... of the row, the workgroup adds them (a butterfly per wave, the waves' sums through LDS), then each
            thread normalizes, rotates and stores its elements."""
            n, NI = sec.row, -(-sec.row // BLOCK)
            tc = _coords(tok, [sec.shape[d] for d in sec.tokens])
            coords, oks, xs, acc = [], [], [], None
            for i in range_constexpr(NI):
                e = t + i * BLOCK
                ok = e < n if (i + 1) * BLOCK > n else None
                ec = _coords(ok.select(e, 0) if ok is not None else e, [sec.shape[d] for d in sec.wide])
                c = [0] * len(sec.shape)
                for d, v in zip(sec.tokens, tc):
                    c[d] = v
                for d, v in zip(sec.wide, ec):
                    c[d] = v
                x = em.load_vec(X, sec.dts[0], 1, _dot(c, sec.x))
                sq = x * x
                if ok is not None:
                    sq = fx.Vector.filled(1, ok, fx.Boolean).select(sq, em.splat(0.0, 1))
                acc = sq if acc is None else acc + sq
                coords.append(c)
                oks.append(ok)
                xs.append(x)
            w = rc.wave_allreduce(acc[0], "sum")
            if t % 64 == 0:
                fx.memref_store(w, slots, t // 64)
            gpu.barrier()
            total = fx.memref_load(slots, 0)
            for i in range_constexpr(1, WAVES):
                total = total + fx.memref_load(slots, i)
            rstd = em.rsqrt(em.splat(total, 1) * (1.0 / n) + eps)
            cont = [math.prod(sec.shape[d + 1:]) for d in range(len(sec.shape))]
            for i in range_constexpr(NI):
                c, ok = coords[i], oks[i]
                y = _rotate_at(sec, c, X, C, S, W, rstd, xs[i])
                put(sec, _dot(c, cont), ok, y, O, Ids, Flag)

        def put(sec, o, ok, y, O, Ids, Flag):
            """Store y, R's element o, to the output or into the cache (ok: None where every thread holds an
            element, else whether this one does; a position out of range raises the flag word)."""
            if sec.region:
                off, inb = _cache_offset(sec, o, Ids, words)
                keep = inb if ok is None else inb & ok
                if keep:
                    em.store_vec(O, sec.dts[3], 1, y, off)
                if ~inb:
                    _raise_flag(Flag)
            elif ok is None:
                em.store_vec(O, sec.dts[3], 1, y, o)
            else:
                if ok:
                    em.store_vec(O, sec.dts[3], 1, y, o)

        def head_section(sec, o, t, X, C, S, O, W, Ids, Flag, slots, blocks):
            """The element o of a cooperative per-head norm section (_coop): the thread loads x(o) once, the row's
            n threads add their squares (a butterfly over n lanes; rows over several waves add the waves' sums
            through LDS), then each normalizes, rotates and stores its element."""
            n = sec.shape[-1]
            ok = o < sec.numel if blocks * BLOCK > sec.numel else None  # None: every thread holds an element
            oc = o if ok is None else ok.select(o, 0)
            c = _coords(oc, sec.shape)
            x = em.load_vec(X, sec.dts[0], 1, _dot(c, sec.x))
            sq = x * x
            if ok is not None:
                sq = fx.Vector.filled(1, ok, fx.Boolean).select(sq, em.splat(0.0, 1))
            total = rc.wave_allreduce(sq[0], "sum", min(n, 64))
            if n > 64:
                if t % 64 == 0:
                    fx.memref_store(total, slots, t // 64)
                gpu.barrier()
                first = (t // n) * (n // 64)  # the row's first wave in the workgroup
                total = fx.memref_load(slots, first)
                for i in range_constexpr(1, n // 64):
                    total = total + fx.memref_load(slots, first + i)
            rstd = em.rsqrt(em.splat(total, 1) * (1.0 / n) + eps)
            put(sec, oc, ok, _rotate_at(sec, c, X, C, S, W, rstd, x), O, Ids, Flag)

        b = fx.Int32(fx.block_idx.x)
        t = fx.Int32(fx.thread_idx.x)
        slots = None
        if any(r.wide or (_coop(r) and r.shape[-1] > 64) for r in f.ropes):
            slots = fx.SharedAllocator().allocate(Scratch).peek().red.view(fx.make_layout(WAVES, 1))
        o0 = b * BLOCK + t
        if r0.wide:
            if b < grids[0]:
                wide_section(r0, b, t, X0, C0, S0, O0, W0, Ids, Flag, slots)
        elif _coop(r0):
            if b < grids[0]:
                head_section(r0, o0, t, X0, C0, S0, O0, W0, Ids, Flag, slots, grids[0])
        elif o0 < r0.numel:
            y0 = _rotate(r0, o0, X0, C0, S0)
            if cached0:
                off0, good0 = _cache_offset(r0, o0, Ids, words)
                if good0:
                    em.store_vec(O0, r0.dts[3], 1, y0, off0)
                if ~good0:
                    _raise_flag(Flag)
            else:
                em.store_vec(O0, r0.dts[3], 1, y0, o0)
        if r1 is not None and r1.wide:
            if (b >= B1) & (b < B1 + grids[1]):
                wide_section(r1, b - B1, t, X1, C1, S1, O1, W1, Ids, Flag, slots)
        elif r1 is not None and _coop(r1):
            if (b >= B1) & (b < B1 + grids[1]):
                head_section(r1, (b - B1) * BLOCK + t, t, X1, C1, S1, O1, W1, Ids, Flag, slots, grids[1])
        elif r1 is not None:
            o1 = (b - B1) * BLOCK + t
            if (b >= B1) & (o1 < r1.numel):
                y = _rotate(r1, o1, X1, C1, S1)
                if cached1:
                    off, good = _cache_offset(r1, o1, Ids, words)
                    if good:
                        em.store_vec(O1, r1.dts[3], 1, y, off)
                    if ~good:
                        _raise_flag(Flag)
                else:
                    em.store_vec(O1, r1.dts[3], 1, y, o1)
        if copies:
            v = (b - B2) * BLOCK + t
            if (b >= B2) & (v < nv):
                x, _ = _value(sc.read, v, V, Ids, vshape, ostride)
                off2, good2 = _dst_offset(sc, v, Ids, vshape, ostride)
                if good2:
                    _store(Vc, sc.read.bits, sc.read.vec, x, off2 // sc.read.vec if sc.read.vec > 1 else off2)
                if ~good2:
                    _raise_flag(Flag)

    @flyc.jit
    def launch(X0: fx.Tensor, C0: fx.Tensor, S0: fx.Tensor, O0: fx.Tensor, W0: fx.Tensor, X1: fx.Tensor,
               C1: fx.Tensor, S1: fx.Tensor, O1: fx.Tensor, W1: fx.Tensor, V: fx.Tensor, Vc: fx.Tensor,
               Ids: fx.Tensor, Flag: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        rope_cache_kernel(X0, C0, S0, O0, W0, X1, C1, S1, O1, W1, V, Vc, Ids, Flag).launch(
            grid=(sum(grids), 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch


# --- host entry ----------------------------------------------------------------------------------

MAX_PLANS = 4096
_PLANS: dict = {}


def _expand(op, x, cos, sin, pairs, rot=0):
    """x, cos, sin as views over the rotated shape R (cos / sin per pair: a new last dim of stride 0). With
    `rot` (partial rotary: only x's first rot features rotate) cos / sin span those rot features."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOATS:
            raise KernelInputError(f"{op}: {name} must be a float32, bfloat16 or float16 tensor, got "
                                   f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.device != x.device:
            raise KernelInputError(f"{op}: {name} is on {t.device}, x on {x.device}; move them to one device")
    if pairs:
        if x.dim() < 1 or x.shape[-1] != 2:
            raise KernelInputError(f"{op}: interleaved pairs need x of shape [..., D/2, 2], got {tuple(x.shape)}")
        cos, sin = cos.unsqueeze(-1), sin.unsqueeze(-1)
    elif x.dim() < 1 or (rot or x.shape[-1]) % 2:
        raise KernelInputError(f"{op}: rotate-half needs an even last dim, got x of shape {tuple(x.shape)}")
    if rot and (pairs or not 0 < rot < x.shape[-1]):
        raise KernelInputError(f"{op}: partial rotary takes rotate-half with 0 < rot < x's last dim "
                               f"({x.shape[-1]}), got rot={rot}{' and interleaved pairs' if pairs else ''}")
    xr = x[..., :rot] if rot else x
    try:
        shape = torch.broadcast_shapes(xr.shape, cos.shape, sin.shape)
    except RuntimeError:
        raise KernelInputError(f"{op}: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} do not broadcast to x "
                               f"{tuple(xr.shape)}") from None
    if shape[-1] != xr.shape[-1] or (rot and shape != xr.shape):
        raise KernelInputError(f"{op}: cos / sin widen x ({tuple(xr.shape)} -> {tuple(shape)})")
    if rot:
        return [x, cos.expand(shape), sin.expand(shape)]
    return [t.expand(shape) for t in (x, cos, sin)]


def _extent(t) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0


def _norm_name(op, x, w, pairs, wide=()) -> str:
    """The dtype name of a norm weight over x's last dim (or over x's dims `wide`), checked."""
    if pairs:
        raise KernelInputError(f"{op}: a norm before the rotation takes rotate-half (the row is x's last dim), "
                               "not interleaved pairs")
    n = math.prod(x.shape[d] for d in wide) if wide else x.shape[-1]
    if not isinstance(w, torch.Tensor) or w.dtype not in FLOATS or tuple(w.shape) != (n,):
        raise KernelInputError(f"{op}: a norm weight must be a float tensor of the norm row's length ({n},), got "
                               f"{getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    if w.device != x.device:
        raise KernelInputError(f"{op}: the norm weight is on {w.device}, x on {x.device}")
    return DTYPE_NAMES[w.dtype]


def _wide_dims(op, x, norm_dims) -> tuple:
    """norm_dims checked: distinct dims of x ending with its last (the rotated head row inside the norm row)."""
    nd = tuple(d + x.dim() if d < 0 else d for d in norm_dims)
    if len(set(nd)) != len(nd) or not nd or nd[-1] != x.dim() - 1 or any(not 0 <= d < x.dim() for d in nd):
        raise KernelInputError(f"{op}: norm_dims {tuple(norm_dims)} must be distinct dims of x {tuple(x.shape)} "
                               "ending with its last")
    return () if nd == (x.dim() - 1,) else nd


def _rope_sec(op, x, cos, sin, pairs, dst=None, dim=0, ids=None, order=None, out_dtype=None, w=None,
              rot=0, norm_dims=None) -> RopeSec:
    wide = () if w is None or norm_dims is None else _wide_dims(op, x, norm_dims)
    norm = "" if w is None else _norm_name(op, x, w, pairs, wide)
    if norm and rot:
        raise KernelInputError(f"{op}: a norm before a partial rotation is not supported (the pass-through "
                               "features would be normalized too); rotate the whole head or drop the norm")
    given = tuple(x.shape)
    x, cos, sin = _expand(op, x, cos, sin, pairs, rot)
    if wide and tuple(x.shape) != given:
        raise KernelInputError(f"{op}: cos / sin broadcast x {given} to {tuple(x.shape)}: a norm row over several dims "
                               "takes x's own")
    n = x.shape[-1]
    if norm and not wide and (n & (n - 1) or n > BLOCK):  # a head row no workgroup holds whole: one per row
        wide = (x.dim() - 1,)
    if out_dtype is not None and out_dtype not in FLOATS:
        raise KernelInputError(f"{op}: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    out = out_dtype or torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)
    dts = tuple(DTYPE_NAMES[d] for d in (x.dtype, cos.dtype, sin.dtype, out))
    base = dict(shape=tuple(x.shape), x=tuple(x.stride()), cos=tuple(cos.stride()), sin=tuple(sin.stride()), dts=dts,
                norm=norm, rot=rot, wide=wide)
    if dst is None:
        return RopeSec(**base)
    if dst.device != x.device:
        raise KernelInputError(f"{op}: the cache is on {dst.device}, k on {x.device}")
    dmap, region, _ = _geometry_index(dst, dim, ids)
    region = tuple(region)
    if math.prod(region) != math.prod(x.shape):
        raise KernelInputError(f"{op}: the written region {region} does not hold k's {tuple(x.shape)} elements")
    vs, acc = [0] * len(region), 1
    for d in order:
        vs[d], acc = acc, acc * region[d]
    if any(n > 1 and d not in order for d, n in enumerate(region)):
        raise KernelInputError(f"{op}: region dims {region} outside the order {tuple(order)} have more than "
                               "one element")
    return RopeSec(**base, region=region, vs=tuple(vs), dst=tuple(dmap), dst_strides=tuple(dst.stride()))


def _plan(key, xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype=None, norm_ws=None, eps=0.0, rot=0,
          norm_dims=None):
    op = "rope_cache"
    if not 1 <= len(xs) <= 2 or len(coss) != len(xs) or len(sins) != len(xs):
        raise KernelInputError(f"{op}: one or two tensors to rotate, each with its cos and sin; got "
                               f"{len(xs)} / {len(coss)} / {len(sins)}")
    if norm_ws is not None and len(norm_ws) != len(xs):
        raise KernelInputError(f"{op}: one norm weight per rotated tensor, got {len(norm_ws)} for {len(xs)}")
    if kc is not None and kc.dtype not in FLOATS:
        raise KernelInputError(f"{op}: the k cache must be float32, bfloat16 or float16 (the rotation is rounded "
                               f"to its dtype), got {kc.dtype}")
    if (kc is not None or vc is not None) and ids is None:
        raise KernelInputError(f"{op}: a cache write needs the positions (ids)")
    if ids is not None and (ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1):
        raise KernelInputError(f"{op}: positions must be a 1-D int32 or int64 tensor, got {ids.dtype} "
                               f"{tuple(ids.shape)}")
    secs = [_rope_sec(op, xs[i], coss[i], sins[i], pairs, *((kc, dim, ids, k_order) if kc is not None and
                                                          i == len(xs) - 1 else (None, 0, None, None)),
                      out_dtype=kc.dtype if kc is not None and i == len(xs) - 1 else out_dtype,
                      w=None if norm_ws is None else norm_ws[i], rot=rot, norm_dims=norm_dims)
            for i in range(len(xs))]
    sc = None
    if vc is not None:
        sc, _ = scatter_map(vc, v, dim, ids, op)
    for t in list(xs) + [kc, vc, v]:
        if t is not None and _extent(t) * t.element_size() >= MAX_BYTES:
            raise KernelInputError(f"{op}: a tensor spans >= 2 GiB (32-bit buffer offsets); split it")
    words = 0 if ids is None else (2 if ids.dtype == torch.int64 else 1)
    f = Fused(tuple(secs), sc, words, float(eps) if norm_ws is not None else 0.0)
    return f, build_rope_cache(f, key[-1])


def _flat(t, itype=None):
    f = torch.as_strided(t, (max(_extent(t), 1),), (1,))
    return f if itype is None or f.dtype == itype else f.view(itype)


@kr.replayed
def rope_cache(xs, coss, sins, pairs: bool, kc=None, k_order=None, v=None, vc=None, ids=None, dim: int = 2,
               out_dtype=None, norm_ws=None, eps: float = 0.0, rot: int = 0, norm_dims=None):
    """Rotate each x of `xs` by its cos / sin (rotate-half over x's last dim, or interleaved pairs:
    x [..., D/2, 2] and cos / sin per pair [..., D/2]), in fp32, rounded once: to out_dtype (default: the
    promoted type of x, cos and sin), the one stored in kc to kc's dtype; returns the rotated tensors,
    contiguous, except
    the last when `kc` is given: that one is stored into kc at `ids` along `dim` (R's flat index o is
    the written region's element whose strides over R follow `k_order`, the region dims innermost
    first). v, when given, is stored into vc at ids along dim. `norm_ws` (one [D] weight per x): each x's
    rows (its last dim, rotate-half) RMS-normalized first, `x * rsqrt(mean(x^2) + eps) * w` in fp32 rounded
    to x's dtype, as flydsl.rms_norm returns it (Qwen3's q / k norm). `rot` (partial rotary, GPT-NeoX's
    rotary_pct < 1): only each x's first rot features rotate (cos / sin span those), the rest are x's own
    values, rounded to the output's dtype: the `cat([rotated, x[..., rot:]], -1)` of eager, stored as one
    tensor. `norm_dims` (with norm_ws): each x's norm row spans these dims of x, outermost first, ending with its
    last (OLMo2's q_norm over all heads of a token: [H, D] of x [B, H, S, D] is (1, 3)); the weight is indexed
    row-major over them and one workgroup reduces a row. One launch; the caches in place."""
    if ids is not None and isinstance(ids, torch.Tensor) and ids.dim() == 0:
        ids = ids.reshape(1)
    arch = current_arch()
    try:
        geo = lambda t: None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)  # noqa: E731
        key = (tuple(geo(t) for t in (*xs, *coss, *sins, kc, v, vc, ids, *(norm_ws or ()))), len(xs), bool(pairs),
               None if k_order is None else tuple(k_order), dim, out_dtype, norm_ws is not None, float(eps), int(rot),
               None if norm_dims is None else tuple(norm_dims), arch)
    except AttributeError:
        raise KernelInputError("rope_cache: expected tensors") from None
    hit = _PLANS.get(key)
    if hit is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        hit = _PLANS[key] = _plan(key, xs, coss, sins, pairs, kc, k_order, v, vc, ids, dim, out_dtype, norm_ws, eps,
                                  int(rot), norm_dims)
    f, launcher = hit
    dev = xs[0].device
    dummy = _DUMMY.get(dev)
    if dummy is None:
        dummy = _DUMMY[dev] = torch.zeros(1, dtype=torch.int32, device=dev)
    outs, bufs = [], []
    for i, sec in enumerate(f.ropes):
        x, c, s = _expand("rope_cache", xs[i], coss[i], sins[i], pairs, sec.rot)
        if sec.region:
            o = _flat(kc)
        else:
            outs.append(torch.empty(sec.shape, dtype=NAMED_DTYPES[sec.dts[3]], device=dev))
            o = outs[-1].view(-1)
        bufs += [_flat(x), _flat(c), _flat(s), o, _flat(norm_ws[i]) if sec.norm else dummy]
    bufs += [dummy] * (10 - len(bufs))
    if f.copy is not None:
        itype = _INT[vc.element_size()]
        bufs += [_flat(v.expand(f.copy.read.out_shape), itype), _flat(vc, itype)]
    else:
        bufs += [dummy, dummy]
    if ids is None:
        kl.call(launcher, *bufs, dummy, dummy)
        return outs
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    kl.call(launcher, *bufs, ids.reshape(-1).contiguous().view(torch.int32), flag)
    if flag.device.type == "cpu":  # a host read: a per-call replay repeats it (replay_effect)
        size = (kc if kc is not None else vc).shape[dim]
        kr.replay_effect(_check_ids, flag, ids, size)
    return outs


# --- ISA of a decode step (bench.generate prices the launch from it) ------------------------------

DECODE_STEP = "translator_kernels.layout.rope_cache:compile_decode_step"  # (batch, heads, kv_heads, head_dim, max_seq)


def decode_step_args(batch, heads, kv_heads, head_dim, max_seq, dtype=torch.bfloat16):
    """The fused launch's arguments in a Llama decode step (one token per sequence, rotate-half as HF
    writes it): q, k, v views of the QKV GEMM's output, cos / sin of the step's position, the caches."""
    qkv = torch.zeros(batch, 1, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k, v = (t.view(batch, 1, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    cos = torch.zeros(batch, 1, 1, head_dim, dtype=dtype)
    kc, vc = (torch.zeros(batch, kv_heads, max_seq, head_dim, dtype=dtype) for _ in range(2))
    return [q, k], [cos, cos], [cos, cos], False, kc, [3, 1, 0], v, vc, torch.zeros(1, dtype=torch.int64), 2


def decode_step_launch(batch, heads, kv_heads, head_dim, max_seq) -> tuple:
    """(workgroups, HBM bytes) of that launch: q, k, v and cos / sin read, q out, k and v into the caches."""
    xs, coss, sins, pairs, kc, order, v, vc, ids, dim = decode_step_args(batch, heads, kv_heads, head_dim, max_seq)
    f, _ = _plan((current_arch(),), xs, coss, sins, pairs, kc, order, v, vc, ids, dim)
    e = 2
    nbytes = batch * (heads + 2 * kv_heads) * head_dim * e * 2 + 2 * batch * head_dim * e * 2
    return sum(_grids(f)), nbytes


def compile_decode_step(batch, heads, kv_heads, head_dim, max_seq, norm=False, dtype="bfloat16"):
    """Run in translator_kernels.isa's compile child (COMPILE_ONLY): compiles the decode step's launch; `norm`:
    with Qwen3's per-head q / k norms."""
    dt = getattr(torch, dtype)
    kw = dict(norm_ws=[torch.ones(head_dim, dtype=dt)] * 2, eps=1e-6) if norm else {}
    rope_cache(*decode_step_args(batch, heads, kv_heads, head_dim, max_seq, dt), **kw)
