"""Gather kernels: `embedding(weight, ids)` — out[i, :] = weight[ids[i], :].

One thread per output vector of VEC elements (128-bit when the row length allows: 4 fp32 or 8
bf16/fp16), BLOCK threads per workgroup, the last workgroup masked. Each thread reads its row's
id (int64 ids are read as two 32-bit words through a free `view(torch.int32)`: the low word is
the id, a non-zero high word means negative or >= 2^31), then one vector of that weight row.

Out-of-range ids never read outside the table: a thread whose id is < 0 or >= V reads row 0,
stores zeros and raises the flag tensor's word to 1. The host raises `IndexError` naming the
first bad id when reading the flag costs no device synchronization — CPU tensors, which is where
flysim runs in CI; on a GPU the flag stays on the device (no sync on the per-call path) and the
rows come out zero. `padding_idx` only changes embedding's gradient: forward reads that row as
any other, so the kernel needs no special case.
"""

from __future__ import annotations

import torch

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr

from translator_kernels import launch as kl
from translator_kernels.arch import FLOAT_NAMES
from translator_kernels import replay as kr
from translator_kernels.errors import KernelInputError
from translator_kernels.rows import common as rc

BLOCK = 256
DTYPES = FLOAT_NAMES  # what the gather kernel takes (translator_kernels.arch)
_BITS = {"f32": 32, "bf16": 16, "f16": 16}
_ELEM = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}
_COPY = {16: fx.rocdl.BufferCopy16b, 32: fx.rocdl.BufferCopy32b, 64: fx.rocdl.BufferCopy64b,
         128: fx.rocdl.BufferCopy128b}


def pick_vec(d: int, dt: str) -> int:
    """Widest vector (<= 128 bits) that divides the row length."""
    vec = 128 // _BITS[dt]
    while d % vec:
        vec //= 2
    return vec


def _word(t, idx):
    """The 32-bit integer at element `idx` of a flat int32 buffer tensor."""
    atom = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), 32)
    view = fx.logical_divide(fx.rocdl.make_buffer_tensor(t), fx.make_layout(1, 1))
    r = fx.make_rmem_tensor(1, fx.Int32)
    fx.copy(atom, fx.slice(view, (None, idx)), r)
    return fx.memref_load_vec(r)[0]


@kl.builder
def build_embedding(d: int, vocab: int, dt: str, vec: int, words: int, arch: str, odt: str | None = None):
    """Launcher `launch(ids32, weight, out, flag, n_vecs)`: rows of length `d`, a table of `vocab`
    rows, ids given as `words` 32-bit words each (1: int32, 2: int64). arch keys the cache. odt: the
    output's dtype when it is not the table's (each loaded vector converted in registers, rounded to
    nearest even as torch's `.to()`)."""
    VPR = d // vec  # vectors per row
    ebits = _BITS[dt]
    edt = _ELEM[dt]
    odt = odt or dt
    obits, oedt = _BITS[odt], _ELEM[odt]

    @flyc.kernel
    def embedding_kernel(Ids: fx.Tensor, W: fx.Tensor, Out: fx.Tensor, Flag: fx.Tensor, NV: fx.Int32):
        v_raw = fx.Int32(fx.block_idx.x) * BLOCK + fx.thread_idx.x
        live = v_raw < NV
        v = live.select(v_raw, 0)
        row = v // VPR
        col = v % VPR
        lo = _word(Ids, row * words)
        ok = (lo >= 0) & (lo < vocab)
        if words == 2:
            ok = ok & (_word(Ids, row * 2 + 1) == 0)
        src = ok.select(lo, 0)
        atom = fx.make_copy_atom(_COPY[vec * ebits](), ebits)
        x = rc.load_vec(atom, vec, edt, rc.row_view(W, src, vec), col)
        x = fx.Vector.filled(vec, ok, fx.Boolean).select(x, fx.Vector.filled(vec, 0.0, edt))
        if const_expr(odt != dt):
            x = x.to(oedt)
        if live:
            oatom = fx.make_copy_atom(_COPY[vec * obits](), obits)
            rc.store_vec(oatom, vec, oedt, x, rc.row_view(Out, row, vec), col)
            if ~ok:
                one = fx.make_rmem_tensor(1, fx.Int32)
                fx.memref_store_vec(fx.Vector.filled(1, 1, fx.Int32), one)
                fview = fx.logical_divide(fx.rocdl.make_buffer_tensor(Flag), fx.make_layout(1, 1))
                fx.copy(fx.make_copy_atom(fx.rocdl.BufferCopy32b(), 32), one, fx.slice(fview, (None, 0)))

    @flyc.jit
    def launch(Ids: fx.Tensor, W: fx.Tensor, Out: fx.Tensor, Flag: fx.Tensor, NV: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        grid = (NV + BLOCK - 1) // BLOCK
        embedding_kernel(Ids, W, Out, Flag, NV).launch(grid=(grid, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return launch


def _check_ids(flag, flat, vocab):
    if int(flag[0]):
        bad = flat[(flat < 0) | (flat >= vocab)]
        raise IndexError(f"embedding: id {int(bad[0])} is out of range for a table of {vocab} rows "
                         f"({bad.numel()} ids out of range); ids must lie in [0, {vocab})")


@kr.replayed
def embedding(weight: torch.Tensor, ids: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """weight[V, D] float32/bfloat16/float16, ids int32/int64 of any shape -> [*ids.shape, D] in
    out_dtype (default: the table's; another float dtype: each row converted as torch's `.to()`)."""
    op = "embedding"
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise KernelInputError(f"{op}: weight must be a 2-D tensor [vocab, dim], got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.dtype not in DTYPES:
        raise KernelInputError(f"{op}: weight dtype {weight.dtype} is not supported; use float32, bfloat16 or float16")
    if ids.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(f"{op}: ids dtype {ids.dtype} is not supported; use int64 or int32 token ids")
    if ids.device != weight.device:
        raise KernelInputError(f"{op}: ids are on {ids.device} but the weight is on {weight.device}; move them together")
    vocab, d = weight.shape
    if vocab >= 2**31 or weight.numel() * weight.element_size() >= rc.MAX_BUFFER_BYTES:
        raise KernelInputError(f"{op}: a table of {tuple(weight.shape)} {weight.dtype} spans >= 2 GiB "
                         "(32-bit buffer offsets); split the vocabulary")
    if out_dtype is not None and out_dtype not in DTYPES:
        raise KernelInputError(f"{op}: out_dtype {out_dtype} is not supported; use float32, bfloat16 or float16")
    out = torch.empty((*ids.shape, d), dtype=out_dtype or weight.dtype, device=weight.device)
    n = ids.numel()
    if n == 0 or d == 0:
        return out
    dt = DTYPES[weight.dtype]
    vec = pick_vec(d, dt)
    flat = ids.reshape(-1).contiguous()
    words = 2 if flat.dtype == torch.int64 else 1
    ids32 = flat.view(torch.int32)  # int64: (low, high) word pairs, no copy
    flag = torch.zeros(1, dtype=torch.int32, device=weight.device)
    launcher = build_embedding(d, vocab, dt, vec, words, rc.current_arch(), DTYPES[out.dtype])
    kl.call(launcher, ids32, weight.contiguous(), out.view(n, d), flag, n * (d // vec))
    if flag.device.type == "cpu":  # a host read: a per-call replay repeats it (replay_effect)
        kr.replay_effect(_check_ids, flag, flat, vocab)
    return out
