"""GEMM entry points: `gemm` (activation x preshuffled weight, fused epilogue), `bmm`
(activation x activation) and the tile heuristic `choose_config`.

The kernel itself lives in kernel.py (design notes there); the weight layout in
preshuffle.py. Epilogue order: ``out = act(scale * (a @ W.T) + bias) + residual``, computed in
fp32 and cast once to ``out_dtype``; ``act`` is a one-input per-element program
(translator_kernels.program: any op of the one op table; "gelu" or "mul(2.0);sigmoid" spell one).

The kernel (kernel.py) runs one launch; split-K configs (decode shapes) add up their partial sums
inside it, in a fixed order (splitk.py). The tile heuristic, its cost models and `register_config` live in
tiles.py; `autotune` here times candidate configs on a real GPU and registers the fastest (the
hook; it never runs under flysim).
"""

from __future__ import annotations

import torch

from translator_kernels import launch as kl
from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.gemm.kernel import build_gemm, canonical_epilogue, mfma_per_block
from translator_kernels.gemm.gated import gated_shape
from translator_kernels.gemm.splitk import give_back, splitk_workspace
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels.gemm.preshuffle import K_TILE, N_TILE, kpack_for, padded_shape, shuffle_weight_batched
from translator_kernels.gemm.tiles import (GemmConfig, choose_config, config_fits, four_wave, gated_config, large_estimate, m_bucket,
                                           register_config, stream_estimate, without_ring)

_DT = FLOAT_NAMES
_INT32_MAX = 2**31 - 64


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
        for _ in range(2):  # warm-up: first sight, then the per-call replay is built (host ms, untimed)
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
        kr.clear_replays()  # per-call replays keep the tile they chose: choose again
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


def _launch(op, a3, ws, n, k, batch, m, *, bias, activation, residual, scale, out_dtype, cfg=None,
            w_layout="shuffled", gate=None, dt=None, scales=None, w_int8=False, w_int4=0, rms_eps=None):
    """a3: [batch, m, k_eff] contiguous; ws: [batch or 1, N_pad, K_pad] preshuffled, or [batch or 1, N, K]
    (w_layout "nk") or [batch or 1, K, N] (w_layout "kn") row-major, K a multiple of kpack.
    fp8.py: dt "fp8" / "bf8" / "fp8xbf8" with a3, ws (and k) in int32 units of 4 values, cfg given;
    scales = (a_scale mode, Sa, w_scale mode, Sw) applied in the epilogue (kernel.build_gemm).
    rms_eps: each row's result times rsqrt(mean(a_row²) + rms_eps) over the k elements (gemm/rownorm.py)."""
    arch = kl.arch()  # looked up once per target, not per call
    dt = dt or _DT[a3.dtype]
    n_pad, k_pad = gated_shape(n, k) if gate else padded_shape(n, k)
    k_eff = a3.shape[-1]
    if cfg is None:
        cfg = choose_config(m_bucket(m), n_pad if gate else n, k, a3.dtype, arch)
        if gate or w_layout == "kn" or rms_eps is not None:  # kernel.py's 4-wave layout only
            cfg = four_wave(cfg)
        if gate:  # column pairs live in one wave: 2 x 16 columns per wave at least, no split
            cfg = gated_config(cfg, a3.dtype, arch)
    out = torch.empty((batch, m, n), dtype=out_dtype, device=a3.device)
    has_bias, has_res = bias is not None, residual is not None
    bias_t = bias if has_bias else _no_bias(a3.device)
    res_t = residual if has_res else out
    for name, t in (("a", a3), ("w", ws), ("out", out)):
        _check_bytes(op, name, t)
    w_bs = (n_pad * k_pad if w_layout == "shuffled" else n * k) if ws.shape[0] > 1 else 0
    a_bytes, w_bytes = a3.numel() * a3.element_size(), ws.numel() * ws.element_size()
    p_ws = cnt = _no_bias(a3.device)  # placeholders unless split-K
    if cfg.split > 1:  # partial sums in P, tickets in Cnt; the last split of a tile adds them up (splitk.py)
        p_ws, cnt = splitk_workspace(a3.device, batch * -(-m // cfg.bm) * -(-n_pad // cfg.bn), cfg)
    sa_mode, sa, sw_mode, sw = scales or ("", None, "", None)
    plain = w_layout == "shuffled" and not (scales or w_int8 or w_int4 or gate or rms_eps is not None) \
        and dt in ("bf16", "f16", "f32") and cfg.kw == 1  # the calls kernel.py's `ring` / `quad` take
    if (cfg.ring or cfg.quad) and not plain:  # 4 x 1 waves, two W register sets: a BK whose registers fit them
        cfg = without_ring(cfg, "f32" if dt == "f32" else "bf16", arch)
    head = cfg.head if w_layout == "shuffled" and "block" not in (sa_mode, sw_mode) and not w_int4 else 0
    launcher = build_gemm(n, k_eff, n_pad, k_pad, dt, _DT[out_dtype], arch, cfg.bm, cfg.bn, cfg.bk,
                          activation, has_bias, has_res, cfg.split, w_layout, gate, cfg.kw, wm=cfg.wm,
                          **({"head": head} if head else {}), **({"ring": True} if cfg.ring else {}),
                          **({"quad": True} if cfg.quad else {}),
                          **({"rownorm": (float(rms_eps), k)} if rms_eps is not None else {}),
                          **({"a_scale": sa_mode, "w_scale": sw_mode} if scales else {}),
                          **({"w_int8": True} if w_int8 else {}), **({"w_int4": w_int4} if w_int4 else {}))
    extra = ((bias_t if sa is None else sa), (bias_t if sw is None else sw)) if scales else ()
    kl.call(launcher, out, a3, ws, bias_t, res_t, p_ws, cnt, m, batch, m * k_eff, w_bs, m * n, float(scale),
            a_bytes, w_bytes, out.numel() * out.element_size(), p_ws.numel() * 4, cnt.numel() * 4, *extra)
    if cfg.split > 1:  # the launch returned: its counters are zero again (a launch that raised drops them)
        kr.replay_effect(give_back, cnt)
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


def _check_operands(op, a, w, want, n, k, builder):
    if w.dtype not in _DT:
        raise KernelInputError(f"{op}: weight dtype {w.dtype} unsupported; use float32/bfloat16/float16")
    if tuple(w.shape) != want:
        raise KernelInputError(f"{op}: prepared weight has shape {tuple(w.shape)}, expected {want} for N={n}, K={k}; "
                         f"build it with translator_kernels.gemm.{builder}")
    if a.dim() < 1 or a.shape[-1] != k:
        raise KernelInputError(f"{op}: a has shape {tuple(a.shape)}, expected [..., {k}]")
    if a.device != w.device:
        raise KernelInputError(f"{op}: a on {a.device} but the weight on {w.device}")


def _rows(op, a, out_dtype):
    """(leading dims, M = their product, output dtype) of an [..., K] activation."""
    lead = tuple(a.shape[:-1])
    out_dtype = out_dtype or a.dtype
    if out_dtype not in _DT:
        raise KernelInputError(f"{op}: out_dtype {out_dtype} unsupported; use float32/bfloat16/float16")
    m = 1
    for d in lead:
        m *= d
    return lead, m, out_dtype


def _epilogue_args(op, bias, residual, lead, n, out_dtype):
    """bias [n] as fp32, residual [*lead, n] in out_dtype, both contiguous (None stays None)."""
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise KernelInputError(f"{op}: bias has shape {tuple(bias.shape)}, expected ({n},)")
        bias = bias.to(torch.float32).contiguous()
    if residual is not None:
        if tuple(residual.shape) != lead + (n,):
            raise KernelInputError(f"{op}: residual has shape {tuple(residual.shape)}, expected {lead + (n,)}")
        residual = residual.to(out_dtype).contiguous()
    return bias, residual


@kr.replayed
def gemm(a, w_shuffled, n, k, *, bias=None, activation=None, residual=None, scale=1.0, out_dtype=None,
         rms_eps=None, _config=None):
    """act(scale * (a @ W.T) + bias) + residual with W[n, k] given preshuffled (shuffle_weight).

    activation: None, or a one-input program (a Program, its JSON, or a chain spelling such as "gelu"
    or "mul(2.0);sigmoid", see translator_kernels.program.chain) applied in fp32 after the bias and
    before the residual.
    a: [..., k] float32/bfloat16/float16 (fp32 a with a bf16/fp16 weight is cast: precision mode).
    rms_eps (RMSNorm folded in, γ already in W: rownorm.py): row i of a @ W.T times rsqrt(mean(a[i]²) + rms_eps)
    before scale, bias and the rest; a's dtype must be the weight's.
    Returns [..., n] in out_dtype (default: a's dtype)."""
    op = "gemm"
    activation = canonical_epilogue(activation)  # KernelInputError names an unknown / malformed step
    _check_operands(op, a, w_shuffled, padded_shape(n, k), n, k, "preshuffle.shuffle_weight")
    lead, m, out_dtype = _rows(op, a, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a.device)
    a2 = _prep_a(op, a.reshape(m, k), k, w_shuffled.dtype)
    bias, residual = _epilogue_args(op, bias, residual, lead, n, out_dtype)
    out = _launch(op, a2.unsqueeze(0), w_shuffled.unsqueeze(0), n, k, 1, m, bias=bias,
                  activation=activation, residual=residual, scale=scale, out_dtype=out_dtype, cfg=_config,
                  rms_eps=_rms_eps(op, rms_eps, a, w_shuffled))
    return out.reshape(lead + (n,))


def _rms_eps(op, eps, a, w):
    """eps as given, after checking that the norm reads a as it is (no precision-mode cast first)."""
    if eps is not None and a.dtype != w.dtype:
        raise KernelInputError(f"{op}: rms_eps needs a in the weight's dtype ({a.dtype} vs {w.dtype}): the row norm "
                               f"reads a as it is given")
    return eps


def _batch_view(bt, batch_shape, n, k):
    """bt [..., N, K] with row-major matrices as [batch, N, K] with the batch stride N * K (no copy),
    or None when the batch dims are broadcast or strided otherwise."""
    w = bt.expand(batch_shape + (n, k))
    if w.dim() == 2:
        return w.unsqueeze(0)
    try:
        w3 = w.view(-1, n, k)
    except RuntimeError:
        return None
    return w3 if w3.shape[0] == 1 or w3.stride(0) == n * k else None


def _in_place(t, batch_shape, rows, cols):
    """t [..., rows, cols] as [batch or 1, rows, cols] row-major matrices without a copy, or None."""
    if (cols > 1 and t.stride(-1) != 1) or (rows > 1 and t.stride(-2) != cols):
        return None
    if t[..., :1, :1].numel() == 1:  # one matrix shared by every batch entry: batch stride 0
        return t.reshape(1, rows, cols)
    return _batch_view(t, batch_shape, rows, cols)


@kr.replayed
def gemm_gated(a, w_arranged, n, k, gate, *, bias=None, out_dtype=None, rms_eps=None, _config=None):
    """gate(a @ Wg.T + bg) * (a @ Wu.T + bu) in one GEMM; w_arranged = gated.gated_weight(Wg, Wu),
    bias (optional) = gated.gated_weight(bg, bu). gate: an epilogue program ("silu", "gelu_tanh").
    rms_eps: both products of row i times rsqrt(mean(a[i]²) + rms_eps) (an RMSNorm folded in: gemm)."""
    op = "gemm_gated"
    gate = canonical_epilogue(gate)
    if not gate:
        raise KernelInputError(f"{op}: a gate activation is required (e.g. 'silu'); use gemm for a plain linear")
    _check_operands(op, a, w_arranged, gated_shape(n, k), n, k, "gated.gated_weight")
    lead, m, out_dtype = _rows(op, a, out_dtype)
    if m == 0:
        return torch.empty(lead + (n,), dtype=out_dtype, device=a.device)
    a2 = _prep_a(op, a.reshape(m, k), k, w_arranged.dtype)
    if bias is not None:
        if tuple(bias.shape) != (gated_shape(n, k)[0],):
            raise KernelInputError(f"{op}: arranged bias has shape {tuple(bias.shape)}, expected ({gated_shape(n, k)[0]},)")
        bias = bias.to(torch.float32).contiguous()
    out = _launch(op, a2.unsqueeze(0), w_arranged.unsqueeze(0), n, k, 1, m, bias=bias, activation=None,
                  residual=None, scale=1.0, out_dtype=out_dtype, cfg=_config, gate=gate,
                  rms_eps=_rms_eps(op, rms_eps, a, w_arranged))
    return out.reshape(lead + (n,))


@kr.replayed
def bmm(a, b, *, out_dtype=None):
    """a[..., M, K] @ b[..., K, N] -> [..., M, N] (batch dims broadcast), both activations.

    The kernel reads b in place when its matrices are row-major either way (K a multiple of kpack):
    b.transpose(-2, -1) row-major [N, K] as in q @ k.transpose(-2, -1) (w_layout "nk"), or b itself
    row-major [K, N] as in att @ v (w_layout "kn", kernel.py). Any other b (strided rows, or K not a
    multiple of kpack) is preshuffled per call: one extra pass over b, a device copy."""
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
    if k % kpack_for(b.dtype) == 0:
        for t, layout, rows, cols in ((b.transpose(-2, -1), "nk", n, k), (b, "kn", k, n)):
            w3 = _in_place(t, batch_shape, rows, cols)
            if w3 is not None:
                out = _launch(op, a3, w3, n, k, batch, m, bias=None, activation=None, residual=None, scale=1.0,
                              out_dtype=out_dtype, w_layout=layout)
                return out.reshape(batch_shape + (m, n))
    if b[..., :1, :1].numel() == 1:  # one b shared by every batch: shuffle once, batch stride 0
        ws = shuffle_weight_batched(b.reshape(1, k, n).transpose(1, 2))
    else:
        ws = shuffle_weight_batched(b.expand(batch_shape + (k, n)).reshape(batch, k, n).transpose(1, 2))
    out = _launch(op, a3, ws, n, k, batch, m, bias=None, activation=None, residual=None, scale=1.0,
                  out_dtype=out_dtype)
    return out.reshape(batch_shape + (m, n))


__all__ = ["GemmConfig", "autotune", "bmm", "choose_config", "config_fits", "expected_mfma_count", "gemm", "gemm_gated",
           "large_estimate", "m_bucket", "register_config", "stream_estimate", "K_TILE", "N_TILE"]
