"""GQA packing for decode attention: the query heads of one KV group share one workgroup.

Decode (one query token per sequence) ran one workgroup per (batch, query head[, KV slice]),
so the `group` = H / Hkv query heads of a KV head each loaded the same K / V tiles: K / V were
read `group` times per step (through L2 at best), and each 16-row MFMA tile held 1 real row.
Packed, the `group` heads of KV head j are the rows of one block: row i of block (b, j) is
query head j * group + i. With Sq = 1 that is only a change of strides, so the kernel body is
the unchanged flash kernel run on a virtual problem:

    heads H  -> Hkv        query rows Sq = 1 -> group     group -> 1
    q / o strides (sb, sh, ss) -> (sb, group * sh, sh)    (the same for a user mask's)

Each K / V tile is then loaded once per KV head (flysim's bytes read: about 1 / group of
before for the K / V part), and the QKᵀ / PV MFMAs carry `group` real rows of 16 instead of 1.
The split-KV plan, its fp32 partials and ticket counters, the in-launch merge, q_pos (one
position shared by the packed rows: its element stride is 0) and the output strides (eager
SDPA's layout, written through o's own strides) all follow from the virtual problem. Sinks are
per query head: the kernel's `sink_rows` specialization reads SK[h * sq + row] (= the query
head) instead of SK[h].

Packing applies where it helps and is exact:
  * Sq == 1 (decode; prefill keeps one query head per block, its rows are tokens);
  * group > 1 (group 1 has nothing to share);
  * not `causal` (SDPA's top-left causal mask with Sq = 1 is "key 0 only": the packed rows would
    be read as rows 0..group-1) and no per-head score scale (head_scale[h] is read per block).
Those cases run today's path. Sq > 1 with small Sq x group (speculative decode) would need row
-> (head, token) division in the kernel's addressing: not done.
"""

from __future__ import annotations


def pack_group(H: int, Hkv: int, Sq: int, *, causal: bool, head_scale) -> int:
    """Query heads packed per block: H / Hkv at decode where exact (see above), else 1."""
    group = H // Hkv
    if group <= 1 or Sq != 1 or causal or head_scale is not None:
        return 1
    return group


def packed_strides(strides, group: int):
    """(sb, sh, ss[, ...]) of a [B, H, 1, ...] tensor -> the virtual [B, H / group, group, ...] one."""
    sb, sh = strides[0], strides[1]
    return (sb, group * sh, sh) + tuple(strides[3:])
