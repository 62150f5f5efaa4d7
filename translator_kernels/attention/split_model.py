"""The split count of a decode step's attention that the timing MODEL prices fastest (`model_split`, asked by
split_geometry in __init__.py), the MODEL price of one decode launch (`price`) and its bytes. Apart from
decode_plan.py (the launch geometry, which reads split_geometry) so that the package imports this module
and not the other way round.
Choosing the slice count (issue 23): one-wave decode workgroups pay a fixed head (the prologue's loads and
dependent trips, the peeled first tile, the ticket and the merge code) and then one loop iteration per 64-key
tile; the last arriver of a head merges the slices in merge_trips(...) dependent rounds. More slices shorten
every workgroup's loop and lengthen the merge; the grid's round count and the launch's bytes follow. The
split count is the candidate with the least MODEL time (translator_kernels.timing.launch_time on the features
of our compiled decode kernel, `price` below: the same price bench.generate prints), fewer slices on a tie,
cached per shape. The features come from decode_attention_isa.json (translator_kernels/measure/: the q_pos
decode kernel of each arch, dtype and head dim there, split and not, compiled COMPILE_ONLY; regenerate with
`python -m translator_kernels.measure.decode_isa`); a shape whose kernel is not in it keeps the grid rule
(2x the CUs). Deterministic: the features are a checked-in file, the price a pure function.

Which loops run (decode_features): the kernel's two key loops (fwd.py) hold the same MFMAs; the first in
program order is the unmasked one, the hot loop every tile after the peeled first runs; the masked loop runs
no tile when the context is a whole number of tiles (the step priced: position context - 1, every tile
below it unmasked), so its body is not straight-line code (before this the MODEL took the masked loop as
the hot one and charged the unmasked loop's body, and the masked loop's K / V loads, to every workgroup's
prologue).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

from translator_kernels.attention.tiles import ELEM_BYTES, kernel_config, merge_trips, padded_head_dim

FEATURES_JSON = Path(__file__).resolve().parents[1] / "measure" / "decode_attention_isa.json"


def launch_bytes(B: int, hp: int, rows: int, Sk: int, D: int, dtype: str, nsplit: int) -> int:
    """HBM bytes of one decode attention launch: K and V once per (sequence, head of the virtual problem), q in
    and O out, and under split KV the fp32 partials written and read back and the tickets (an int32 atomic per
    slice, 4 B read and 4 written, and the reset)."""
    eb = ELEM_BYTES[dtype]
    n = 2 * B * hp * Sk * D * eb + 2 * B * hp * rows * D * eb
    if nsplit > 1:
        n += 2 * nsplit * B * hp * rows * (padded_head_dim(D) + 2) * 4 + B * hp * (8 * nsplit + 4)
    return n


def decode_features(isa_text: str, arch: str):
    """timing.features of a compiled decode kernel with its unmasked key loop as the hot loop and its masked
    key loop left out (module docstring)."""
    from translator_kernels.hotloop import find_loops
    from translator_kernels.timing import features

    kernel = features(isa_text, arch).kernel
    loops = find_loops(isa_text, kernel)
    if not loops:
        return features(isa_text, arch)
    top = max(lp.cycles(arch)["matrix_cycles"] for lp in loops)
    kv = sorted((lp for lp in loops if lp.cycles(arch)["matrix_cycles"] == top), key=lambda lp: lp.start)
    return features(isa_text, arch, hot=kv[0].header, skip=tuple(lp.header for lp in kv[1:]))


def price(whole, split, B: int, hp: int, rows: int, Sk: int, D: int, dtype: str, arch: str, nsplit: int,
          chunk: int, nbytes: float | None = None) -> dict:
    """MODEL time of one decode attention launch (timing.launch_time; `whole` / `split`: decode_features of the
    unsplit and split kernels): one one-wave workgroup per (slice, head, sequence), each running its slice's
    tiles less the peeled first in the hot loop; under split KV the merge's loads are not prologue bytes (only
    the merger issues them, on partials just written: the unsplit kernel's straight-line bytes are charged),
    and the merger's merge_trips - 1 further rounds (the features hold one) follow the last slice, each an
    L2_LATENCY plus the split kernel's extra straight-line vector work."""
    from translator_kernels.arch import GPUS
    from translator_kernels.timing import Launch, launch_time

    g = GPUS[arch]
    block_n = kernel_config(dtype, D, 1, 1, arch)["block_n"]
    feat = whole if nsplit == 1 else split
    tiles = [max(1, math.ceil(min(chunk, Sk - i * chunk) / block_n)) for i in range(nsplit)]
    iters = tuple(t - 1 for _ in range(B * hp) for t in tiles)
    if nsplit > 1 and whole.straight_bytes < feat.straight_bytes:
        feat = replace(feat, straight_bytes=whole.straight_bytes)
    trips = merge_trips(D, rows, nsplit) if nsplit > 1 else 0
    tail = max(0, trips - 1) * (g.timing["l2_latency_s"]
                                + max(0, split.straight_vector - whole.straight_vector) / g.clock_hz)
    if nbytes is None:
        nbytes = launch_bytes(B, hp, rows, Sk, D, dtype, nsplit)
    r = launch_time(feat, Launch(B * hp * nsplit, iters, nbytes), arch)
    return dict(r, kernel_t=r["kernel_t"] + tail, tail_s=tail, merge_trips=trips, grid=B * hp * nsplit)


def feature_key(arch: str, dtype: str, head_dim: int) -> str:
    return f"{arch}:{dtype}:{head_dim}"


@functools.lru_cache(maxsize=None)
def cached_features(arch: str, dtype: str, head_dim: int):
    """(whole, split) KernelFeatures of the decode kernel from FEATURES_JSON, or None where it has none."""
    from translator_kernels.timing import KernelFeatures

    try:
        table = json.loads(FEATURES_JSON.read_text())
    except (OSError, ValueError):
        return None
    e = table.get(feature_key(arch, dtype, head_dim))
    return None if e is None else (KernelFeatures(**e["whole"]), KernelFeatures(**e["split"]))


def candidates(tiles: int, cap: int) -> list[int]:
    """Slice counts reachable with whole tiles per slice (ceil(tiles / per)), up to `cap`."""
    return sorted({-(-tiles // per) for per in range(1, tiles + 1)} & set(range(1, max(1, cap) + 1)))


@functools.lru_cache(maxsize=4096)
def model_split(B: int, hp: int, rows: int, Sk: int, D: int, dtype: str, arch: str):
    """(nsplit, keys per slice) with the least MODEL time (module docstring), or None where the decode kernel's
    features are not in FEATURES_JSON."""
    from translator_kernels.arch import GPUS

    feats = cached_features(arch, dtype, D)
    if feats is None or arch not in GPUS:
        return None
    block_n = kernel_config(dtype, D, 1, 1, arch)["block_n"]
    tiles = -(-Sk // block_n)
    best = None
    for n in candidates(tiles, 8 * GPUS[arch].cus // max(1, B * hp)):
        per = -(-tiles // n)
        t = price(*feats, B, hp, rows, Sk, D, dtype, arch, n, per * block_n)["kernel_t"]
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, n, per * block_n)
    return best[1], best[2]
