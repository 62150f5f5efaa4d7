"""GEMM entry points: `gemm` (activation x preshuffled weight, fused epilogue), `bmm`
(activation x activation) and the tile heuristic `choose_config`.

The kernel itself lives in gemm_kernel.py (design notes there); the weight layout in
preshuffle.py. Epilogue order: ``out = act(scale * (a @ W.T) + bias) + residual``, computed in
fp32 and cast once to ``out_dtype``; ``act`` is a one-input per-element program
(translator_kernels.program: any op of the one op table; "gelu" or "mul(2.0);sigmoid" spell one).

Tile heuristic (`choose_config`), per (M bucket, N, K, dtype, arch), 256 lanes = 4 waves split
along N, each wave BM x BN/4:
  - BM follows the M bucket (16, 32, 64, 128): small M is bandwidth-bound on the weight, so
    the tile does not waste MFMAs on padded rows; M > 64 takes 128 rows for A reuse.
  - BN = 128 when M > 64 and N_pad has >= 2 such tiles, else 64 (more workgroups for skinny M).
  - BK = the largest of 128/64/32 that divides K_pad and is <= the cap: 256 bytes of K per row
    (bf16/fp16 128, fp32 64) when BM <= 32, where more bytes in flight per step hide load
    latency of the weight stream; 128 bytes (64 / 32) otherwise, to bound registers and LDS.
  - Checked: 2 LDS stages of BM x BK fit the arch's LDS (64 KiB gfx942, 160 KiB gfx950) and
    the register estimate (accumulators + 2 W stages + A staging) stays under 224 VGPRs.
`register_config` overrides the choice for one key; `autotune` times candidates on a real GPU
and registers the fastest (the hook; it never runs under flysim).
"""

from __future__ import annotations

import dataclasses

import torch

from translator_kernels import launch as kl
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.kernel import THREADS, build_gemm, canonical_epilogue, mfma_per_block
from translator_kernels.gemm.preshuffle import K_TILE, N_TILE, kpack_for, padded_shape, shuffle_weight_batched

_DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
MAX_VGPR_EST = 224
_INT32_MAX = 2**31 - 64


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    bm: int
    bn: int
    bk: int


_OVERRIDES: dict[tuple, GemmConfig] = {}


def m_bucket(m: int) -> int:
    for b in (16, 32, 64):
        if m <= b:
            return b
    return 128


def _arch_key(arch: str) -> str:
    return "gfx950" if arch.startswith("gfx950") else "gfx942"


def _vgpr_estimate(cfg: GemmConfig, dtype: str) -> int:
    esz = 4 if dtype == "f32" else 2
    m_rep, n_rep, k_blk = cfg.bm // 16, cfg.bn // 64, cfg.bk // 32
    lph = 2 if dtype == "f32" else 1
    a_loads = -(-(cfg.bm * cfg.bk * esz // 16) // THREADS)
    return m_rep * n_rep * 4 + 2 * n_rep * k_blk * lph * 4 + a_loads * 4 + m_rep * lph * 4 + 16


def config_fits(cfg: GemmConfig, dtype: str, arch: str) -> str | None:
    """None if the config is legal on `arch`, else the reason."""
    esz = 4 if dtype == "f32" else 2
    lds = 2 * cfg.bm * cfg.bk * esz
    if lds > LDS_BYTES[_arch_key(arch)]:
        return f"LDS {lds} B exceeds {LDS_BYTES[_arch_key(arch)]} B on {arch}"
    if _vgpr_estimate(cfg, dtype) > MAX_VGPR_EST:
        return f"~{_vgpr_estimate(cfg, dtype)} VGPRs exceeds {MAX_VGPR_EST}"
    if cfg.bm % 16 or cfg.bn % 64 or cfg.bk % 32:
        return "BM must be a multiple of 16, BN of 64, BK of 32"
    return None


def choose_config(m_bucket: int, n: int, k: int, dtype, arch: str) -> GemmConfig:
    """The documented tile heuristic (module docstring); `dtype` is a torch dtype or 'f32'/'bf16'/'f16'."""
    dt = _DT.get(dtype, dtype)
    n_pad, k_pad = padded_shape(n, k)
    key = (m_bucket, n, k, dt, _arch_key(arch))
    if key in _OVERRIDES:
        return _OVERRIDES[key]
    bm = min(m_bucket, 128)
    bn = 128 if (m_bucket > 64 and n_pad >= 256) else 64
    cap = {("f32", True): 64, ("f32", False): 32, ("bf16", True): 128, ("bf16", False): 64}
    bk_cap = cap[("f32" if dt == "f32" else "bf16", bm <= 32)]
    bk = next(b for b in (128, 64, 32) if b <= bk_cap and k_pad % b == 0)
    cfg = GemmConfig(bm, bn, bk)
    while config_fits(cfg, dt, arch) and cfg.bk > 32:
        cfg = GemmConfig(cfg.bm, cfg.bn, cfg.bk // 2)
    reason = config_fits(cfg, dt, arch)
    if reason:
        raise KernelInputError(f"gemm: no legal tile for M<={m_bucket} N={n} K={k} {dt} {arch}: {reason}")
    return cfg


def register_config(m_bucket: int, n: int, k: int, dtype, arch: str, cfg: GemmConfig) -> None:
    reason = config_fits(cfg, _DT.get(dtype, dtype), arch)
    if reason:
        raise KernelInputError(f"gemm: config {cfg} rejected: {reason}")
    _OVERRIDES[(m_bucket, n, k, _DT.get(dtype, dtype), _arch_key(arch))] = cfg


def autotune(a, w_shuffled, n, k, candidates, *, iters=20):
    """Real-GPU hook: time each candidate GemmConfig on (a, w) and register the fastest."""
    if not (a.is_cuda and torch.version.hip):
        raise RuntimeError("gemm.autotune needs tensors on a ROCm GPU")
    from flydsl.runtime.device import get_rocm_arch

    arch, mb, best = get_rocm_arch(), m_bucket(a.shape[0]), None
    for cfg in candidates:
        if config_fits(cfg, _DT[a.dtype], arch):
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gemm(a, w_shuffled, n, k, _config=cfg)
        start.record()
        for _ in range(iters):
            gemm(a, w_shuffled, n, k, _config=cfg)
        end.record()
        torch.cuda.synchronize()
        t = start.elapsed_time(end) / iters
        if best is None or t < best[0]:
            best = (t, cfg)
    if best:
        register_config(mb, n, k, a.dtype, arch, best[1])
    return best


def expected_mfma_count(m: int, n: int, k: int, dtype, arch: str, cfg: GemmConfig, batch: int = 1) -> int:
    """Wave-level MFMA instructions the tile grid implies (what flysim's counter must show)."""
    n_pad, k_pad = padded_shape(n, k)
    tiles = -(-m // cfg.bm) * -(-n_pad // cfg.bn) * batch
    blocks = (cfg.bm // 16) * (cfg.bn // 16) * (k_pad // 32)
    return tiles * blocks * mfma_per_block(_DT.get(dtype, dtype), arch)


def _check_bytes(op, name, t):
    if t.numel() * t.element_size() > _INT32_MAX:
        raise KernelInputError(f"{op}: {name} {tuple(t.shape)} {t.dtype} exceeds 2 GiB (32-bit buffer offsets); "
                               f"split the call")


def _launch(op, a3, ws, n, k, batch, m, *, bias, activation, residual, scale, out_dtype, cfg=None):
    """a3: [batch, m, k_eff] contiguous; ws: [batch or 1, N_pad, K_pad] preshuffled."""
    arch = kl.arch()  # looked up once per target, not per call
    dt = _DT[a3.dtype]
    n_pad, k_pad = padded_shape(n, k)
    k_eff = a3.shape[-1]
    if cfg is None:
        cfg = choose_config(m_bucket(m), n, k, a3.dtype, arch)
    out = torch.empty((batch, m, n), dtype=out_dtype, device=a3.device)
    has_bias, has_res = bias is not None, residual is not None
    bias_t = bias if has_bias else _no_bias(a3.device)
    res_t = residual if has_res else out
    for name, t in (("a", a3), ("w", ws), ("out", out)):
        _check_bytes(op, name, t)
    launcher = build_gemm(n, k_eff, n_pad, k_pad, dt, _DT[out_dtype], arch, cfg.bm, cfg.bn, cfg.bk,
                          activation, has_bias, has_res)
    w_bs = n_pad * k_pad if ws.shape[0] > 1 else 0
    kl.call(launcher, out, a3, ws, bias_t, res_t, m, batch, m * k_eff, w_bs, m * n, float(scale),
             a3.numel() * a3.element_size(), ws.numel() * ws.element_size(),
             out.numel() * out.element_size())
    return out


_NO_BIAS: dict = {}  # device -> the fp32 placeholder passed where there is no bias (never read)


def _no_bias(device):
    t = _NO_BIAS.get(device)
    if t is None:
        t = _NO_BIAS[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def _prep_a(op, a, k, w_dtype):
    """Cast A to the weight's dtype (precision mode) and pad K to a multiple of kpack."""
    if a.dtype not in _DT:
        raise KernelInputError(f"{op}: a has dtype {a.dtype}; supported float32, bfloat16, float16 "
                               f"(keep other dtypes in PyTorch)")
    if a.dtype != w_dtype:
        if a.dtype != torch.float32:
            raise KernelInputError(f"{op}: a is {a.dtype} but the weight is {w_dtype}; only an fp32 activation "
                                   f"may be cast to a bf16/fp16 weight (precision mode)")
        a = a.to(w_dtype)
    kp = kpack_for(w_dtype)
    if k % kp:
        a = torch.nn.functional.pad(a, (0, kp - k % kp))  # 16-byte rows for the 128-bit loads
    return a.contiguous()


def gemm(a, w_shuffled, n, k, *, bias=None, activation=None, residual=None, scale=1.0, out_dtype=None,
         _config=None):
    """act(scale * (a @ W.T) + bias) + residual with W[n, k] given preshuffled (shuffle_weight).

    activation: None, or a one-input program (a Program, its JSON, or a chain spelling such as "gelu"
    or "mul(2.0);sigmoid", see translator_kernels.program.chain) applied in fp32 after the bias and
    before the residual.
    a: [..., k] float32/bfloat16/float16 (fp32 a with a bf16/fp16 weight is cast: precision mode).
    Returns [..., n] in out_dtype (default: a's dtype)."""
    op = "gemm"
    activation = canonical_epilogue(activation)  # KernelInputError names an unknown / malformed step
    if w_shuffled.dtype not in _DT:
        raise KernelInputError(f"{op}: weight dtype {w_shuffled.dtype} unsupported; use float32/bfloat16/float16")
    if tuple(w_shuffled.shape) != padded_shape(n, k):
        raise KernelInputError(f"{op}: preshuffled weight has shape {tuple(w_shuffled.shape)}, expected "
                               f"{padded_shape(n, k)} for N={n}, K={k}; build it with preshuffle.shuffle_weight")
    if a.dim() < 1 or a.shape[-1] != k:
        raise KernelInputError(f"{op}: a has shape {tuple(a.shape)}, expected [..., {k}]")
    if a.device != w_shuffled.device:
        raise KernelInputError(f"{op}: a on {a.device} but the weight on {w_shuffled.device}")
    lead = tuple(a.shape[:-1])
    out_dtype = out_dtype or a.dtype
    if out_dtype not in _DT:
        raise KernelInputError(f"{op}: out_dtype {out_dtype} unsupported; use float32/bfloat16/float16")
    m = 1
    for d in lead:
        m *= d
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a.device)
    a2 = _prep_a(op, a.reshape(m, k), k, w_shuffled.dtype)
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise KernelInputError(f"{op}: bias has shape {tuple(bias.shape)}, expected ({n},)")
        bias = bias.to(torch.float32).contiguous()
    if residual is not None:
        if tuple(residual.shape) != lead + (n,):
            raise KernelInputError(f"{op}: residual has shape {tuple(residual.shape)}, expected {lead + (n,)}")
        residual = residual.to(out_dtype).contiguous()
    out = _launch(op, a2.unsqueeze(0), w_shuffled.unsqueeze(0), n, k, 1, m, bias=bias,
                  activation=activation, residual=residual, scale=scale, out_dtype=out_dtype, cfg=_config)
    return out.reshape(lead + (n,))


def bmm(a, b, *, out_dtype=None):
    """a[..., M, K] @ b[..., K, N] -> [..., M, N] (batch dims broadcast), both activations.

    b is preshuffled per call (one extra pass over b, a device copy) so the same kernel serves."""
    op = "bmm"
    if a.dim() < 3 or b.dim() < 3 or a.shape[-1] != b.shape[-2]:
        raise KernelInputError(f"{op}: shapes {tuple(a.shape)} @ {tuple(b.shape)} are not [..., M, K] @ [..., K, N]")
    if a.dtype != b.dtype or a.dtype not in _DT:
        raise KernelInputError(f"{op}: dtypes {a.dtype}/{b.dtype}; need equal float32/bfloat16/float16 operands")
    batch_shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out_dtype = out_dtype or a.dtype
    batch = 1
    for d in batch_shape:
        batch *= d
    if batch == 0 or m == 0 or n == 0:
        return torch.empty(batch_shape + (m, n), dtype=out_dtype, device=a.device)
    a3 = a.expand(batch_shape + (m, k)).reshape(batch, m, k)
    a3 = _prep_a(op, a3, k, a.dtype)
    if b[..., :1, :1].numel() == 1:  # one b shared by every batch: shuffle once, batch stride 0
        ws = shuffle_weight_batched(b.reshape(1, k, n).transpose(1, 2))
    else:
        ws = shuffle_weight_batched(b.expand(batch_shape + (k, n)).reshape(batch, k, n).transpose(1, 2))
    out = _launch(op, a3, ws, n, k, batch, m, bias=None, activation=None, residual=None, scale=1.0,
                  out_dtype=out_dtype)
    return out.reshape(batch_shape + (m, n))


__all__ = ["GemmConfig", "autotune", "bmm", "choose_config", "config_fits", "expected_mfma_count", "gemm",
           "m_bucket", "register_config", "K_TILE", "N_TILE"]
