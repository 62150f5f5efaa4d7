"""The launch geometry and global bytes of a decode step's attention as attention() plans it (packed GQA:
gqa.py; the slice count: split_geometry in __init__.py, which asks split_model.model_split). For the timing
MODEL (bench/ wires it); the split choice and the price live in split_model.py.
"""
from __future__ import annotations

from translator_kernels.attention import split_geometry
from translator_kernels.attention.gqa import pack_group
from translator_kernels.attention.tiles import ELEM_BYTES


def decode_plan(B: int, H: int, Hkv: int, Sk: int, D: int, dtype: str = "bf16", arch: str = "gfx950",
                packed: bool = True) -> dict:
    """Launch geometry and global bytes of one decode step (Sq = 1, keys 0..Sk-1, no mask) as
    attention() plans it: grid (x = KV slices, y = heads of the virtual problem, z = batch),
    slices, keys per slice, and the bytes read / written (K / V, Q once per slice, the fp32
    partials written and read back by the merge, O). For the timing MODEL (bench/ wires it)."""
    pk = pack_group(H, Hkv, 1, causal=False, head_scale=None) if packed else 1
    hp, rows = H // pk, pk
    nsplit, chunk = split_geometry(B, hp, rows, Sk, D, dtype, arch)
    eb = ELEM_BYTES[dtype]
    blocks = B * hp * nsplit
    kv = B * hp * Sk * D * eb * 2                      # each block reads its slice of its KV head
    q = blocks * rows * D * eb
    part = B * hp * nsplit * rows * (-(-D // 16) * 16 * 4 + 8) if nsplit > 1 else 0
    return dict(grid=(nsplit, hp, B), rows_per_block=rows, nsplit=nsplit, keys_per_slice=chunk,
                kv_bytes=kv, bytes_read=kv + q + part, bytes_written=part + B * H * D * eb)
