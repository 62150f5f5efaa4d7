"""MLIR type strings -> how flysim stores a value of that type.

Every SSA value is a torch tensor whose leading dimension (when present) is
the lane: a uniform value has shape ``vshape``, a per-lane one ``(N, *vshape)``.
Integers keep their width (i32 -> int32, index -> int64, i1 -> bool) and are
signless: ops that need unsigned semantics widen explicitly. Floats keep their
format (bf16 -> torch.bfloat16, f8E4M3FNUZ -> torch.float8_e4m3fnuz), so bits
survive bitcasts unchanged. Pointers are int64 addresses; an llvm.struct is a
Python tuple of its fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import torch

SCALARS = {
    "i1": torch.bool,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "index": torch.int64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "f8E4M3FNUZ": torch.float8_e4m3fnuz,
    "f8E4M3FN": torch.float8_e4m3fn,
    "f8E5M2FNUZ": torch.float8_e5m2fnuz,
    "f8E5M2": torch.float8_e5m2,
}
BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "index": 64}
# Same-width integer dtype used to move float bits around exactly.
INT_OF = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class TInfo:
    kind: str  # scalar | vector | ptr | struct | array | token
    dtype: torch.dtype | None = None
    vshape: tuple = ()
    bits: int = 0  # integer width, 0 for floats
    addrspace: int = 0
    fields: tuple = ()
    nbytes: int = 0
    packed: bool = False
    text: str = ""

    @property
    def is_float(self):
        return self.dtype is not None and self.dtype.is_floating_point


def _split_top(s: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@lru_cache(maxsize=None)
def tinfo(text: str) -> TInfo:
    t = text.strip()
    if t in SCALARS:
        dt = SCALARS[t]
        return TInfo("scalar", dt, (), BITS.get(t, 0), nbytes=max(1, torch.empty(0, dtype=dt).element_size()), text=t)
    m = re.fullmatch(r"i(\d+)", t)
    if m and int(m.group(1)) > 64 and int(m.group(1)) % 32 == 0:
        # wide integers only move bits around (buffer loads of 16 bytes): store as int32 words
        n = int(m.group(1)) // 32
        return TInfo("vector", torch.int32, (n,), 32, nbytes=4 * n, text=t)
    m = re.fullmatch(r"vector<([0-9x]+)x([A-Za-z0-9]+)>", t)
    if m:
        shape = tuple(int(d) for d in m.group(1).split("x"))
        e = tinfo(m.group(2))
        n = 1
        for d in shape:
            n *= d
        return TInfo("vector", e.dtype, shape, e.bits, nbytes=n * e.nbytes, text=t)
    m = re.fullmatch(r"!llvm\.ptr(?:<(\d+)>)?", t)
    if m:
        return TInfo("ptr", torch.int64, (), 64, addrspace=int(m.group(1) or 0), nbytes=8, text=t)
    m = re.fullmatch(r"!llvm\.struct<(packed )?\((.*)\)>", t) or re.fullmatch(r"struct<(packed )?\((.*)\)>", t)
    if m:
        fields = tuple(tinfo(_norm(f)) for f in _split_top(m.group(2)))
        return TInfo("struct", fields=fields, packed=bool(m.group(1)), nbytes=sum(f.nbytes for f in fields), text=t)
    m = re.fullmatch(r"!llvm\.array<(\d+) x (.*)>", t) or re.fullmatch(r"array<(\d+) x (.*)>", t)
    if m:
        e = tinfo(_norm(m.group(2)))
        return TInfo("array", e.dtype, (int(m.group(1)),), e.bits, fields=(e,), nbytes=int(m.group(1)) * e.nbytes, text=t)
    if t in ("!gpu.async.token", "none", "!llvm.void"):
        return TInfo("token", text=t)
    raise KeyError(t)


def _norm(f: str) -> str:
    f = f.strip()
    if f.startswith(("ptr", "struct<", "array<")):
        return "!llvm." + f
    return f


def zeros_of(ti: TInfo, device):
    """A uniform zero of type ``ti`` (used for poison/undef: any value is allowed)."""
    if ti.kind == "struct":
        return tuple(zeros_of(f, device) for f in ti.fields)
    if ti.kind == "token":
        return None
    return torch.zeros(ti.vshape, dtype=ti.dtype, device=device)


def to_bits(x: torch.Tensor) -> torch.Tensor:
    """Reinterpret a tensor as the same-width integer dtype (bool -> uint8)."""
    if x.dtype == torch.bool:
        return x.to(torch.uint8)
    return x.view(INT_OF[x.element_size()]) if x.dtype.is_floating_point else x


def bitcast(x: torch.Tensor, src: TInfo, dst: TInfo) -> torch.Tensor:
    """Bit-exact reinterpretation between same-size scalar/vector types."""
    lane = x.shape[: x.dim() - len(src.vshape)]
    flat = x.reshape(*lane, -1) if src.vshape else x.reshape(*lane, 1)
    if flat.dtype == torch.bool:
        raise TypeError("bitcast of i1 vectors is not supported")
    y = flat.contiguous().view(dst.dtype)
    return y.reshape(*lane, *dst.vshape) if dst.vshape else y.reshape(lane)
