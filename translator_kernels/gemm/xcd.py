"""XCD-aware launch order of the GEMM grid (kernel.py, wide.py).

MI300X and MI355X have 8 XCDs, each with its own L2, and the dispatcher hands the workgroups of a
launch to the XCDs round-robin by linear workgroup id (x fastest, then y): XCD = id % 8. The GEMM
grid is (row tiles gx, split x column tiles gy, batch), so in hardware order the min(gx, 8)
workgroups that share one W column block sit on different XCDs and each reads that block from
HBM / the last-level cache again (timing.xcd_reread_bytes).

The remap: within one batch plane of G = gx * gy workgroups, XCD x holds the ids x, x + 8, x + 16,
...: c_x = G // 8 + (x < G % 8) of them. Those take the consecutive logical ids
[s_x, s_x + c_x) with s_x = x * (G // 8) + min(x, G % 8), in the order of their hardware ids:

    logical = (id % 8) * (G // 8) + min(id % 8, G % 8) + id // 8

The starts s_x are the prefix sums of the counts c_x, so the map is a bijection on [0, G) for
every G (G < 8 and G % 8 != 0 included). The logical id decodes rows first, (row tile,
split x column tile) = (logical % gx, logical // gx): one XCD's consecutive logical ids walk the
row tiles of one W column block (same split, same column tile) before moving to the next, so a
W block is read by the 1-2 XCDs whose ranges cover its gx ids instead of min(gx, 8), and an XCD
reads min(c_x, gx) A row blocks per split it covers. Split-K's tickets and counters are indexed
by the output tile (splitk.py): the last arriver of a tile reduces whatever order the splits
come in, so the remap leaves split-K's result unchanged.

Batch planes are remapped each on their own (the plane's first XCD is (z * G) % 8, not 0, when
G % 8 != 0: still a bijection, the grouping only approximate there). The same function runs on
Python ints (the tests' and the timing model's enumeration) and on the kernel's fx.Int32 scalars.
"""

XCDS = 8  # arch.GPU.xcds of gfx942 and gfx950


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return (a < b).select(a, b)


def xcd_logical(pid, g, xcds: int = XCDS):
    """Hardware linear id `pid` in a plane of `g` workgroups -> the logical id it computes."""
    if xcds == 1:
        return pid
    q, r = g // xcds, g % xcds
    x = pid % xcds
    return x * q + _min(x, r) + pid // xcds


def xcd_tile(bx, by, gx, gy, xcds: int = XCDS):
    """(block_idx.x, block_idx.y) of a (gx, gy) plane -> the (row tile, split x column tile) it computes."""
    lg = xcd_logical(by * gx + bx, gx * gy, xcds)
    return lg % gx, lg // gx


def xcd_ranges(g: int, xcds: int = XCDS):
    """[start, end) of the logical ids each XCD computes, for g workgroups (empty ranges left out)."""
    q, r = divmod(g, xcds)
    out = []
    for x in range(min(xcds, g)):
        s = x * q + min(x, r)
        out.append((s, s + q + (x < r)))
    return out
