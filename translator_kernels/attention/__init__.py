"""Flash attention forward: torch entry point, validation and launcher cache.

    out = attention(q, k, v, mask=None, causal=False, scale=None)

q [B, H, Sq, D]; k, v [B, Hkv, Sk, D] with Hkv dividing H (GQA / MQA read the shared K/V head,
nothing is repeated); D in {32, 64, 80, 96, 128, 256}; fp32, bf16 or fp16 (output dtype = q
dtype; fp32 runs fp32 MFMA unless precision="bf16"/"fp16" asks for a cast). `mask` is an
additive float mask or a boolean keep-mask (True = attend, as SDPA) broadcastable to
[B, H, Sq, Sk]; `causal` is SDPA's top-left aligned is_causal. Any Sq, Sk >= 1.

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
from translator_kernels.attention.fwd import MASK_ADD, MASK_BOOL, MASK_NONE, kernel_config, make_attention_kernel

HEAD_DIMS = (32, 64, 80, 96, 128, 256)
_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "f16": torch.float16}
_I32_LIMIT = 2**31


def _arch() -> str:
    from flydsl.runtime.device import get_rocm_arch

    return get_rocm_arch()


def num_waves_for(sq: int) -> int:
    """Waves per workgroup (16 query rows each): fewer for short Sq such as decode."""
    return 1 if sq <= 16 else 2 if sq <= 32 else 4


@kl.builder
def build_attention(arch: str, dtype: str, head_dim: int, causal: bool, mask_kind: int,
                    mask_dtype: str, num_waves: int):
    """Compiled-on-first-call @flyc.jit launcher for one specialization (arch keys the cache)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim {head_dim} not supported; use one of {HEAD_DIMS}")
    return make_attention_kernel(dtype, head_dim, causal, mask_kind, mask_dtype, num_waves, arch)


def _fail(msg: str):
    raise ValueError(f"attention: {msg}")


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _prepare_mask(mask, B, H, Sq, Sk, qdtype, device):
    """-> (kind, dtype name, storage tensor, 4 element strides)."""
    if mask is None:
        return MASK_NONE, "none", torch.zeros(1, dtype=torch.float32, device=device), (0, 0, 0, 0)
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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask=None, causal: bool = False,
              scale=None, precision=None) -> torch.Tensor:
    """Scaled dot-product attention forward on the FlyDSL flash-attention kernel."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(f"{name} must be a 4-D [B, heads, seq, head_dim] tensor, got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        _fail(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them to one dtype")
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
    if D not in HEAD_DIMS:
        _fail(f"head_dim {D} not supported; use one of {HEAD_DIMS} (pad the head dim otherwise)")
    if Sk == 0:
        _fail("Sk = 0 keys: nothing to attend to")
    out_dtype = q.dtype
    if precision is not None:
        if precision not in _PRECISIONS or q.dtype != torch.float32:
            _fail(f"precision={precision!r} applies to float32 inputs and must be 'bf16' or 'fp16'")
        cdt = _PRECISIONS[precision]
        q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    if B == 0 or H == 0 or Sq == 0:
        return torch.empty((B, H, Sq, D), dtype=out_dtype, device=q.device)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    dtype = _DTYPES[q.dtype]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    kind, mname, mflat, mstr = _prepare_mask(mask, B, H, Sq, Sk, q.dtype, q.device)
    out = torch.empty((B, H, Sq, D), dtype=q.dtype, device=q.device)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("mask", mflat)):
        span = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        if span * t.element_size() >= _I32_LIMIT:
            _fail(f"{name} spans {span * t.element_size()} bytes; the kernel addresses with "
                  f"32-bit offsets (< 2 GiB per tensor); split the batch")

    nw = num_waves_for(Sq)
    block_m = kernel_config(dtype, D, nw)["block_m"]
    launch = build_attention(_arch(), dtype, D, bool(causal), kind, mname, nw)
    kl.call(launch, q, k, v, out, mflat, Sq, Sk, H // Hkv, scale * 1.4426950408889634,
           *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *mstr,
           -(-Sq // block_m), H, B)
    return out if out.dtype == out_dtype else out.to(out_dtype)
