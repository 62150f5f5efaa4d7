"""Flash attention forward: torch entry point, validation and launcher cache.

    out = attention(q, k, v, mask=None, causal=False, scale=None, softcap=None, head_scale=None,
                    out_order=None, q_pos=None, sinks=None, k_start=None)

q [B, H, Sq, D]; k, v [B, Hkv, Sk, D] with Hkv dividing H (GQA / MQA: query head h reads K/V
head h // (H / Hkv), as repeat_interleave would lay them out; nothing is repeated); any D from
8 to 256 (the kernel's tiles cover D rounded up to 16; the padding columns read as zero and are
never stored); fp32, bf16 or fp16 (output dtype = q dtype; fp32 runs fp32 MFMA unless
precision="bf16"/"fp16" asks for a cast). `mask` is an additive float mask or a boolean
keep-mask (True = attend, as SDPA) broadcastable to [B, H, Sq, Sk]; `causal` is SDPA's top-left
aligned is_causal. Any Sq, Sk >= 1.

Decode (flash-decoding): when the grid of (query blocks, heads, batch) would cover fewer than
twice the CUs (304 on MI300X, 256 on MI355X) and the query fits one wave (Sq <= 16), the keys
are split into slices of whole KV tiles, one workgroup each: as many slices as the timing MODEL
prices fastest (split_model.model_split, on our compiled kernel's features), else (no features
for that kernel) so that the grid reaches 2x the CUs where Sk allows; each slice writes fp32 partial results and the last slice of a (batch, head,
query block, wave) to finish merges them in slice order, inside the same launch (fwd.py; one
launch, deterministic, no host read: capturable). Its ticket counters come from gemm/splitk.py's
per-stream pool, owned by the launch until it returned (a launch that raised drops them).
`num_splits` forces a split count (tests, benchmarks). With GQA at Sq = 1 the H / Hkv query heads of
a KV head are packed as the rows of one block (gqa.py): K / V are read once per KV head, and the
split plan above is made for that virtual [B, Hkv, H / Hkv, D] problem.

`out_order` lays O out in memory in that dim order (outermost first; the head dim stays
innermost): (0, 2, 1, 3) writes [B, Sq, H, D] memory, the layout eager SDPA returns for a query
read from a [B, S, H, D] projection, so `o.transpose(1, 2).view(B, S, H*D)` needs no copy.

Score options, applied in this order before the mask: `scale` (default 1/sqrt(D)) times
`head_scale[h]` when given (a tensor of H per-head multipliers: Swin-V2's cosine attention
passes exp(logit_scale) with scale=1), then `softcap`: s -> softcap * tanh(s / softcap)
(Gemma-2's attention logit soft-capping).

`q_pos` (an int32 / int64 tensor of Sq positions, or one broadcast) is the causal mask of a
decode or prefill step on a static KV cache: key k is visible to query row i iff k <= q_pos[i]
(gpt-fast's `causal_mask[None, None, input_pos]`, HF's `arange(S_max) <= cache_position`). The
kernel reads the positions on the device and stops its key loop at the block's largest one: k and
v may be the whole [B, Hkv, S_max, D] cache, read in place up to the current length, with no
host read of a device value (capturable in a HIP graph). `sinks` (H float logits) join every
row's softmax denominator, gpt-oss's attention sinks: out = sum_k e^(s_k) v_k / (sum_k e^(s_k) +
e^(sink_h)).

`k_start` (an int32 / int64 tensor of B keys, one per batch row, or one broadcast) is a left-padded
batch's key padding: key k is visible to batch row b iff k >= k_start[b] (its pads are the keys before).
The kernel reads it on the device and starts its key loop there: the pads are never loaded and no
score is compared for them (with q_pos, the step of a static cache holding a left-padded batch). It
takes the mask argument's slot in the kernel, so it comes without a `mask`. A row whose every key is
masked (a pad's query row: its position before its row's first key) is written as 0, as SDPA does.

The kernel (attention_fwd.py) takes element strides, so q/k/v/o only need a unit stride on
the head dimension; a broadcast mask is passed as its own storage plus broadcast strides
(zero on broadcast dims), never expanded. Launchers are cached per
(arch, dtype, head_dim, causal, mask kind, mask dtype, waves); Sq, Sk, B, H, strides and the
scale are runtime arguments.
"""

from __future__ import annotations

import math

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.attention.fwd import make_attention_kernel
from translator_kernels.attention.tiles import MASK_ADD, MASK_BOOL, MASK_NONE, kernel_config, padded_head_dim
from translator_kernels.arch import FLOAT_NAMES, GPUS, NAMED_DTYPES
from translator_kernels.errors import KernelInputError
from translator_kernels.attention.gqa import pack_group, packed_strides
from translator_kernels.gemm.splitk import give_back, take_counters

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
_DTYPES = FLOAT_NAMES
_PRECISIONS = {"bf16": NAMED_DTYPES["bf16"], "f16": NAMED_DTYPES["f16"], "fp16": NAMED_DTYPES["f16"]}
_I32_LIMIT = 2**31
LOG2E = 1.4426950408889634
CUS = {a: g.cus for a, g in GPUS.items()}  # a view of translator_kernels.arch.GPUS


def _arch() -> str:
    from flydsl.runtime.device import get_rocm_arch

    return get_rocm_arch()


def tile_geometry(sq: int, dtype: str, head_dim: int) -> tuple[int, int]:
    """(waves per workgroup, 16-row groups per wave). A wave takes 32 query rows (two groups
    sharing each K / V operand read: half the LDS bytes and per-tile overhead per score) for
    16-bit inputs up to D=128 when Sq > 16; fp32 and D > 128 keep 16 rows (registers); decode
    (Sq <= 16) takes one 16-row wave. Fewer waves for short Sq."""
    rg = 2 if sq > 16 and dtype != "f32" and padded_head_dim(head_dim) <= 128 else 1
    rows = 16 * rg
    return (1 if sq <= rows else 2 if sq <= 2 * rows else 4), rg


def attention_config(dtype: str, head_dim: int, sq: int, arch: str = "gfx942", causal: bool = False) -> dict:
    """The static tile parameters attention() uses at this Sq (tiles.kernel_config of its plan)."""
    return kernel_config(dtype, head_dim, *tile_geometry(sq, dtype, head_dim), arch, causal)


@kl.builder
def build_attention(arch: str, dtype: str, head_dim: int, causal: bool, mask_kind: int,
                    mask_dtype: str, num_waves: int, softcap: bool = False, head_scale: bool = False,
                    split: bool = False, row_groups: int = 1, pos_causal: bool = False, sinks: bool = False,
                    sink_rows: bool = False, kv_dtype: str | None = None, key_start: bool = False):
    """Compiled-on-first-call @flyc.jit launcher for one specialization (arch keys the cache)."""
    if not head_dim_supported(head_dim):
        raise KernelInputError(f"attention: head_dim {head_dim} not supported; use {MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    return make_attention_kernel(dtype, head_dim, causal, mask_kind, mask_dtype, num_waves, arch, softcap,
                                 head_scale, split, row_groups, pos_causal, sinks, sink_rows, kv_dtype, key_start)


def split_geometry(B: int, H: int, Sq: int, Sk: int, head_dim: int, dtype: str, arch: str, num_splits=None):
    """-> (nsplit, keys per slice): 1 slice unless a short query leaves the CUs idle (see above); the count
    the timing MODEL prices fastest where the decode kernel's features are known (split_model.model_split),
    else the grid rule (2x the CUs)."""
    nw, _ = tile_geometry(Sq, dtype, head_dim)
    cfg = attention_config(dtype, head_dim, Sq, arch)
    tiles = -(-Sk // cfg["block_n"])
    grid = -(-Sq // cfg["block_m"]) * H * B
    if num_splits is None:
        want = -(-2 * CUS.get(arch, CUS["gfx942"]) // grid)
        if nw > 1 or want <= 1 or tiles < 2:
            return 1, Sk
        from translator_kernels.attention.split_model import model_split

        chosen = model_split(B, H, Sq, Sk, head_dim, dtype, arch)
        if chosen is not None:
            return (1, Sk) if chosen[0] == 1 else chosen
        num_splits = want
    per = max(1, tiles // max(1, int(num_splits)))
    return -(-tiles // per), per * cfg["block_n"]

def kv_in_registers(H: int, Hkv: int, Sq: int, causal: bool = False, head_scale=None) -> bool:
    """True where attention() takes fp32 K / V with a 16-bit q, rounding them as it loads them: the
    one-wave kernel (decode: Sq x packed heads <= 16), K / V read from global memory, not LDS."""
    pk = pack_group(H, Hkv, Sq, causal=causal, head_scale=head_scale)
    return tile_geometry(Sq * pk, "bf16", 64)[0] == 1


def head_dim_supported(d) -> bool:
    return isinstance(d, int) and MIN_HEAD_DIM <= d <= MAX_HEAD_DIM


def _fail(msg: str):
    raise KernelInputError(f"attention: {msg}")


_PLACEHOLDERS: dict = {}  # device -> the fp32 [1] tensor passed for an absent mask / head scale / split workspace


def _out_order(order):
    """The output's dim order, outermost first (None: [B, H, Sq, D] contiguous). The kernel
    writes O through its strides, so any order with the head dim innermost costs nothing:
    (0, 2, 1, 3) writes O as [B, Sq, H, D], which `.transpose(1, 2)` reads as [B, Sq, H*D]."""
    if order is None:
        return (0, 1, 2, 3)
    order = tuple(int(d) for d in order)
    if sorted(order) != [0, 1, 2, 3] or order[-1] != 3:
        _fail(f"out_order={order!r} must be a permutation of (0, 1, 2, 3) that keeps the head dim (3) innermost")
    return order


def empty_in_order(shape, order, *, dtype, device) -> torch.Tensor:
    """An uninitialized tensor of `shape` whose memory holds its dims in `order` (outermost first)."""
    t = torch.empty([shape[d] for d in order], dtype=dtype, device=device)
    return t.permute([order.index(d) for d in range(len(order))])


def _placeholder(device):
    """A tensor the kernel's specialization never reads or writes (made once per device, not per call)."""
    t = _PLACEHOLDERS.get(device)
    if t is None:
        t = _PLACEHOLDERS[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _prepare_mask(mask, B, H, Sq, Sk, qdtype, device):
    """-> (kind, dtype name, storage tensor, 4 element strides)."""
    if mask is None:
        return MASK_NONE, "none", _placeholder(device), (0, 0, 0, 0)
    if not isinstance(mask, torch.Tensor):
        _fail(f"mask must be a tensor or None, got {type(mask).__name__}")
    if mask.device != device:
        _fail(f"mask is on {mask.device} but q is on {device}; move it to the same device")
    if mask.dim() > 4:
        _fail(f"mask of shape {tuple(mask.shape)} has more than 4 dims; it must broadcast to "
              f"[B, H, Sq, Sk] = {[B, H, Sq, Sk]}")
    if mask.dtype == torch.bool:
        kind, mname = MASK_BOOL, "u8"
    elif mask.dtype in _DTYPES:
        kind, mname = MASK_ADD, _DTYPES[mask.dtype]
    else:
        _fail(f"mask dtype {mask.dtype} not supported; pass a bool keep-mask or an additive "
              f"float32/bfloat16/float16 mask")
    base = mask.contiguous()
    try:
        strides = torch.broadcast_to(base, (B, H, Sq, Sk)).stride()
    except RuntimeError:
        _fail(f"mask of shape {tuple(mask.shape)} does not broadcast to [B, H, Sq, Sk] = "
              f"{[B, H, Sq, Sk]}")
    flat = base.reshape(-1)
    if kind == MASK_BOOL:
        flat = flat.view(torch.uint8)
    return kind, mname, flat, tuple(int(s) for s in strides)


def _prepare_head_scale(head_scale, H, device):
    """-> (flag, f32 [H] tensor): one multiplier per query head."""
    if head_scale is None:
        return False, _placeholder(device)
    if not isinstance(head_scale, torch.Tensor) or not head_scale.is_floating_point():
        _fail(f"head_scale must be a float tensor of {H} per-head multipliers, got "
              f"{type(head_scale).__name__ if not isinstance(head_scale, torch.Tensor) else head_scale.dtype}")
    if head_scale.device != device:
        _fail(f"head_scale is on {head_scale.device} but q is on {device}; move it to the same device")
    if head_scale.numel() not in (1, H) or (head_scale.numel() == H and H > 1 and
                                            [s for s in head_scale.shape if s != 1] != [H]):
        _fail(f"head_scale of shape {tuple(head_scale.shape)} is not one multiplier per head "
              f"(H = {H}: pass shape [{H}] or [1, {H}, 1, 1])")
    return True, head_scale.detach().float().reshape(-1).expand(H).contiguous()


def _ints_in_place(t, n: int, name: str, plural: str, each: str, device):
    """-> (int32 view, element stride) of `t`, an int32 / int64 tensor of n values (or one broadcast), read in
    place by the kernel (an int64 tensor through its int32 view, low word: the values are < 2^31); never
    copied unless strided, never read on the host."""
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        _fail(f"{name} must be an int32 / int64 tensor of {n} {plural}, got "
              f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if t.device != device:
        _fail(f"{name} is on {t.device} but q is on {device}; move it to the same device")
    if t.numel() not in (1, n) or [s for s in t.shape if s != 1] not in ([], [n]):
        _fail(f"{name} of shape {tuple(t.shape)} is not {each}")
    flat = t.reshape(-1)
    if flat.numel() > 1 and flat.stride(0) != 1:
        flat = flat.contiguous()
    words = 2 if flat.dtype == torch.int64 else 1
    return flat.view(torch.int32), (words if flat.numel() > 1 else 0)


def _prepare_q_pos(q_pos, Sq, device):
    """-> (flag, int32 view, element stride): the positions, read in place."""
    if q_pos is None:
        return False, _placeholder(device), 0
    return True, *_ints_in_place(q_pos, Sq, "q_pos", "query positions", f"one position per query row (Sq = {Sq})",
                                 device)


def _prepare_k_start(k_start, B, mask, device):
    """-> (flag, int32 view, element stride): each batch row's first key, read in place, in the mask's slot."""
    if k_start is None:
        return False, None, 0
    if mask is not None:
        _fail("mask and k_start both given: k_start is a left-padded batch's key padding; fold it into the mask "
              "(mask & (arange(Sk) >= k_start[:, None, None, None])) or pass k_start alone")
    return True, *_ints_in_place(k_start, B, "k_start", "first keys", f"one first key per batch row (B = {B})", device)


def _prepare_sinks(sinks, H, device):
    """-> (flag, f32 [H]): one sink logit per query head."""
    if sinks is None:
        return False, _placeholder(device)
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or sinks.numel() != H:
        _fail(f"sinks must be a float tensor of {H} per-head logits, got "
              f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")
    if sinks.device != device:
        _fail(f"sinks is on {sinks.device} but q is on {device}; move it to the same device")
    return True, sinks.detach().reshape(-1).float().contiguous()


@kr.replayed
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask=None, causal: bool = False,
              scale=None, softcap=None, head_scale=None, precision=None, num_splits=None,
              out_order=None, q_pos=None, sinks=None, k_start=None) -> torch.Tensor:
    """Scaled dot-product attention forward on the FlyDSL flash-attention kernel."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(f"{name} must be a 4-D [B, heads, seq, head_dim] tensor, got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    kv32 = k.dtype == v.dtype == torch.float32 and q.dtype in (torch.bfloat16, torch.float16)
    if not (q.dtype == k.dtype == v.dtype or kv32):
        _fail(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them to one dtype "
              f"(or pass fp32 K / V with a 16-bit q at decode: kv_in_registers)")
    if q.dtype not in _DTYPES:
        _fail(f"dtype {q.dtype} not supported; use float32, bfloat16 or float16")
    if not (q.device == k.device == v.device):
        _fail(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    B, H, Sq, D = q.shape
    Bk, Hkv, Sk, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape "
              f"(a different value head_dim is not supported)")
    if Bk != B or Dk != D:
        _fail(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim")
    if Hkv == 0 or H % Hkv:
        _fail(f"q has {H} heads and k/v have {Hkv}; the kv head count must divide the q head count")
    if not head_dim_supported(D):
        _fail(f"head_dim {D} not supported; use {MIN_HEAD_DIM} to {MAX_HEAD_DIM} (split or pad the head dim)")
    if softcap is not None and not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        _fail(f"softcap={softcap!r} must be a positive finite number (or None for no capping)")
    if Sk == 0:
        _fail("Sk = 0 keys: nothing to attend to")
    if q_pos is not None and causal:
        _fail("causal=True and q_pos both given: q_pos is the causal mask of a cache step; pass one")
    out_dtype = q.dtype
    if precision is not None:
        if precision not in _PRECISIONS or q.dtype != torch.float32:
            _fail(f"precision={precision!r} applies to float32 inputs and must be 'bf16' or 'fp16'")
        cdt = _PRECISIONS[precision]
        q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
        kv32 = False
    out_order = _out_order(out_order)
    if B == 0 or H == 0 or Sq == 0:
        return empty_in_order((B, H, Sq, D), out_order, dtype=out_dtype, device=q.device)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    dtype = _DTYPES[q.dtype]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    kind, mname, mflat, mstr = _prepare_mask(mask, B, H, Sq, Sk, q.dtype, q.device)
    has_start, starts, st_s = _prepare_k_start(k_start, B, mask, q.device)
    if has_start:  # the key starts ride in the mask's slot: M[b * m_sb]
        mflat, mstr = starts, (st_s, 0, 0, 0)
    has_hs, hs = _prepare_head_scale(head_scale, H, q.device)
    has_pos, pos, p_s = _prepare_q_pos(q_pos, Sq, q.device)
    has_sinks, sink_t = _prepare_sinks(sinks, H, q.device)
    out = empty_in_order((B, H, Sq, D), out_order, dtype=q.dtype, device=q.device)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("mask", mflat)):
        span = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        if span * t.element_size() >= _I32_LIMIT:
            _fail(f"{name} spans {span * t.element_size()} bytes; the kernel addresses with "
                  f"32-bit offsets (< 2 GiB per tensor); split the batch")

    arch = _arch()
    # decode GQA: the query heads of a KV group are the rows of one block (gqa.py), else pk = 1
    pk = pack_group(H, Hkv, Sq, causal=bool(causal), head_scale=head_scale)
    Hp, Sqp = H // pk, Sq * pk
    nw, rg = tile_geometry(Sqp, dtype, D)
    if kv32 and nw > 1:
        _fail(f"fp32 K / V with a {q.dtype} q are read in registers by the one-wave decode kernel only "
              f"(Sq = {Sq} takes {nw} waves); cast K / V to {q.dtype}")
    nq = -(-Sqp // kernel_config(dtype, D, nw, rg)["block_m"])
    nsplit, chunk = split_geometry(B, Hp, Sqp, Sk, D, dtype, arch, num_splits)
    if nsplit > 1:
        w = torch.empty((B, Hp, nsplit, Sqp, padded_head_dim(D)), dtype=torch.float32, device=q.device)
        wml = torch.empty((B, Hp, nsplit, Sqp, 2), dtype=torch.float32, device=q.device)
        # one ticket counter per (batch, head, query block, wave), this launch's own (fwd.py)
        cnt = kr.replay_value(take_counters, q.device, B * Hp * nq * nw)
    else:
        w = wml = cnt = _placeholder(q.device)
    launch = build_attention(arch, dtype, D, bool(causal), kind, mname, nw, softcap is not None, has_hs, nsplit > 1,
                             rg, has_pos, has_sinks, has_sinks and pk > 1, "f32" if kv32 else None,
                             **({"key_start": True} if has_start else {}))
    cap = 1.0 if softcap is None else float(softcap) * LOG2E
    qs, os_, ms = q.stride()[:3], out.stride()[:3], mstr
    if pk > 1:
        qs, os_, ms = packed_strides(qs, pk), packed_strides(os_, pk), packed_strides(mstr, pk)
    args = (q, k, v, out, mflat, hs, w, wml, pos, sink_t, cnt, Sqp, Sk, H // Hkv // pk, scale * LOG2E, cap, nq, chunk,
            Hp, nsplit, *qs, *k.stride()[:3], *v.stride()[:3], *os_, *ms, p_s, nq * nsplit, Hp, B)
    kl.call(launch, *args)
    if nsplit > 1:  # the launch returned: its counters are zero again (a launch that raised drops them)
        kr.replay_effect(give_back, cnt)
    return out if out.dtype == out_dtype else out.to(out_dtype)
