"""A timing MODEL of one kernel launch, from its compiled ISA and its launch shape (not a measurement).

The roofline (max(bytes / peak bandwidth, FLOPs / peak matrix rate)) was 2-7x optimistic against
measured MI350X kernels (issue 29). This model keeps the roofline's two floors and adds what the
measurements showed was missing, each term read from the compiled ISA or the launch shape:

  t = T_LAUNCH + max(t_mem, t_issue, t_l2, t_maf)

* **t_mem, HBM with Little's law.** The GPU reaches at most HBM_EFFICIENCY x the vendor's peak, and
  at most (bytes in flight) / MEM_LATENCY. Bytes in flight = resident waves x what one wave has in
  flight: the bytes of the vector-memory loads the hot loop issues per iteration (one tile of a
  prefetch-1 pipeline; a ring of K tiles keeps more outstanding at its waits, and then that steady-state batch
  counts), or for a kernel without a loop, the largest batch of load bytes it has
  outstanding when it reaches a `s_waitcnt vmcnt` that must retire one of them (the vmcnt counter
  simulated through its code, `_Outstanding`; its later, smaller dependent trips are t_issue's
  L2_LATENCY). Resident waves come from the occupancy model (translator_kernels.isa) and
  the grid (a launch smaller than the machine keeps fewer waves in flight).
* **t_issue, the busiest CU's work.** Each workgroup runs `iterations` of the hot loop (from the
  launch: the workgroup's FLOPs over the MFMA FLOPs one loop iteration issues, or a trip count)
  plus the straight-line code once. One iteration of the w waves sharing a SIMD takes
      max(w x max(matrix, vector, LDS), matrix + vector + LDS) + EXPOSED x MEM_LATENCY x trips / prefetch,
      and at least MEM_LATENCY / prefetch
  cycles, where the first term is really w x (busiest pipe + (1 - OVERLAP) x the other pipes' work)
  (translator_kernels.hotloop prices matrix / vector / LDS cycles per wave): the pipes are shared
  by w waves, and the waves' matrix, vector and LDS work overlap only in part (OVERLAP: the
  measured attention and GEMM kernels stall on their own dependences); one wave alone cannot
  overlap its own dependent work; and each memory round trip of an iteration (`trips`, counted in
  the ISA: loads, then a `vmcnt` wait that needs them; flash attention's loop has 4, a GEMM's one
  per K tile) waits part of a memory latency (EXPOSED, fitted). `prefetch` (tiles in flight; 1 in
  every kernel measured) divides that wait.
  The straight-line code (prologue / epilogue) costs its vector work, one HBM latency, every later
  dependent round trip at L2_LATENCY (fitted; RMSNorm's scalar path re-reads its row a chunk at a
  time: 11 trips), and for a loop kernel its loads (the first operand tiles; stores are posted) at
  the CU's share of the bandwidth, since every resident workgroup issues them at once (the first round
  at the HBM share, later rounds mostly at the L2 share: t_l2 below).
  Workgroups are list-scheduled onto the CUs' slots (per-workgroup work may differ, as in causal
  attention), so wave quantization and tails are counted.
* **t_l2, the L2s.** Every byte the workgroups load through the vector-memory path passes an XCD's L2 (hits and
  misses alike): t_l2 = those bytes (`Launch.l2_bytes`, every lane's load as flysim counts it; from the features
  when not given, `loaded_bytes`) / (L2_EFFICIENCY x the L2s' data-sheet read peak, `l2_bytes_per_s`). It binds
  where small tiles re-read their operands many times (upstream's 16x64x512 fp8 GEMM at M >= 2048: 1-21 GB
  loaded at 21-25 TB/s measured). The same L2s serve a loop kernel's prologue after the first round: the first
  round's loads find the L2s cold and take the CU's share of the HBM bandwidth, a later round's loads come from
  beyond the L2 in the launch's share ((HBM + re-read bytes) / loaded bytes) and from the L2 for the rest.
* **t_maf, the measured matrix ceiling.** The GPU lowers its clock under dense MFMA load: AMD's published
  Max-Achievable FLOPs (arch.Arch.maf_flops; MI300X bf16 708 TFLOPS at a median 1207 MHz against a 1307 TFLOPS
  peak at the 2.1 GHz boost clock) bound what any kernel's matrix work reaches, so t_maf = FLOPs / that rate when
  the launch names its MFMA input type (`Launch.dtype`) and the arch has a figure for it. The other terms count
  cycles at the boost clock (`kernel_t_boost` leaves t_maf out: what a tile heuristic ranks, since fewer cycles
  win at any clock). MI355X has no published figure and no such floor.
* **T_LAUNCH** is the fixed cost of one launch as the measurements time it (CUDA-graph replay of one
  kernel; the floor of every small kernel in the study). A launch replayed back to back with others in one
  HIP graph (a decode step) pays GRAPH_LAUNCH instead: measured, not fitted (1.7 us on MI350X, the same
  study's first harness, which put n launches in one graph; an upper bound of the gap, since it includes
  the smallest kernel's own run). `launch_time` returns both (`t`, `t_graph`) and the kernel alone.
* **T_DEVICE** (`device_launch_s`, fitted) is what a device-timed launch (a profiler's kernel duration: no host
  launch, no harness floor) holds beyond kernel_t: dispatch, wave launch, the drain at the end, and any protocol the
  model does not price (AITER's split-K signal and spin-wait). `t_device` = kernel_t + T_DEVICE, what the published
  device-timed points (translator_kernels.measure.blog_gemm) are compared with. A graph-replayed step pays
  GRAPH_LAUNCH per launch, not both.

L2 reuse: the caller passes HBM bytes (translator_kernels.traffic's no-cache bytes, or compulsory
bytes where the operands fit the last-level cache); see `gemm_hbm_bytes`. Each XCD has its own L2, and
workgroups go to the XCDs round-robin: a GEMM block that workgroups on several XCDs read is read once per
XCD (`xcd_reread_bytes`), the extra reads served at REREAD_EFFICIENCY x the HBM peak and added to t_mem
(`Launch.reread_bytes`; the calibration passes them for upstream's orders, tiles.model_estimate for our
GEMM's XCD-grouped order, gemm/xcd.py).

The constants (T_LAUNCH, HBM_EFFICIENCY, MEM_LATENCY, EXPOSED, L2_LATENCY, REREAD_EFFICIENCY, L2_EFFICIENCY,
and OVERLAP held at 0) are per arch in translator_kernels.arch (`Arch.timing`), fitted by `python -m bench.calibration --fit` on at
most half of the measured MI350X points and checked on the other half; that command prints every point
and the calibration error, which every place that shows this model's time quotes (CALIBRATION below).
gfx942 has no measured points here: it takes gfx950's fitted fractions and latency (stated beside
every gfx942 number).
"""

from __future__ import annotations

import collections
import heapq
import math
import re
from dataclasses import asdict, dataclass

from translator_kernels.arch import GPUS
from translator_kernels.hotloop import find_loops, mfma_cycles, _MFMA_RE
from translator_kernels.isa import classify, parse_isa, width

# the calibration error, as `python -m bench.calibration` last printed it (validation points only)
CALIBRATION = ("fit on 17 MI350X points, validated on 33: max |error| 23%, median 8%; 33 of 33 within 25%; "
               "device-timed MI355X decode GEMMs (kernel + T_DEVICE), fit on 31, validated on 32: max |error| 25%, "
               "median 8%; 32 of 32 within 25% (bench.calibration)")


@dataclass(frozen=True)
class KernelFeatures:
    """What the model reads from one kernel's compiled ISA."""
    kernel: str
    waves_per_simd: int  # occupancy model
    waves_per_wg: int
    # per wave: the hot loop's loads per iteration, or its steady-state batch at a wait where larger (a ring of K tiles,
    # `_steady_batch`), at least the loads before the first vmcnt wait; a kernel without a loop: the most load bytes
    # outstanding at a vmcnt wait that retires a load (`_Outstanding`)
    inflight_bytes: int
    loop_matrix: int = 0  # cycles per iteration, per wave on its SIMD (0: no loop)
    loop_vector: int = 0
    loop_lds: int = 0
    loop_flops: int = 0  # MFMA FLOPs one wave issues per iteration
    has_loop: bool = False
    straight_vector: int = 0  # cycles of the code outside the hot loop, run once per workgroup
    straight_lds: int = 0
    prefetch: int = 1  # loop iterations of loads in flight (1: the next tile is loaded while this one computes)
    loop_trips: int = 1  # memory round trips one loop iteration waits on (loads, then a vmcnt wait that needs them)
    straight_trips: int = 1  # the same for the code outside the hot loop (dependent load phases, run once)
    straight_bytes: int = 0  # per wave: vector-memory bytes loaded outside the hot loop

    def to_dict(self) -> dict:
        return asdict(self)


def _vmem_bytes(mnemonic: str, rest: str) -> int:
    if classify(mnemonic) != "vmem_load":
        return 0
    return 64 * (width(mnemonic) or 32) // 8


_INSTR = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*)$")


def features(isa_text: str, arch: str, hot: str | None = None, skip: tuple = ()) -> KernelFeatures:
    """The model's view of the main kernel of `isa_text` compiled for `arch`. By default the hot loop is
    the one with the most matrix (then vector) cycles; `hot` names its header label instead, and the
    loops whose headers are in `skip` run no iteration at the launch priced (their bodies are left out of
    the straight-line code; decode attention's masked key loop, attention/split_model.py)."""
    stats = max(parse_isa(isa_text, arch), key=lambda s: s.instructions)
    waves, _ = stats.occupancy
    wpw = max(1, -(-(stats.meta.get("block") or 256) // 64))
    loops = find_loops(isa_text, stats.kernel)
    hot_loop = None
    priced = [(lp, lp.cycles(arch)) for lp in loops if lp.header not in skip or lp.header == hot]  # a skipped loop
    if priced:  # runs no iteration, so it is never the hot loop (a kernel whose only loops are skipped has none)
        hot_loop = (next(pc for pc in priced if pc[0].header == hot) if hot else
                    max(priced, key=lambda pc: (pc[1]["matrix_cycles"], pc[1]["vector_cycles"])))
    hot = hot_loop
    lines = _body_lines(isa_text, stats.kernel)
    in_loop = set(range(hot[0].start, hot[0].end + 1)) if hot else set()
    skipped = {i for lp in loops if lp.header in skip for i in range(lp.start, lp.end + 1)}
    s_vec = s_lds = s_bytes = 0
    first_wait_bytes, waited = 0, False
    loop_bytes = loop_flops = 0
    trips = {True: _Trips(), False: _Trips()}  # in the hot loop / outside it
    batch = _Outstanding()  # the straight-line code's largest batch a wait drains (a loop-free kernel's bytes in flight)
    for i, ln in enumerate(lines):
        m = _INSTR.match(ln.split(";")[0])
        if not m or (i in skipped and i not in in_loop):
            continue
        mn, rest = m.group(1), m.group(2)
        c = classify(mn)
        trips[i in in_loop].step(mn, rest, c)
        if i in in_loop:
            loop_bytes += _vmem_bytes(mn, rest)
            mm = _MFMA_RE.match(mn)
            if mm:
                loop_flops += 2 * int(mm.group(1)) * int(mm.group(2)) * int(mm.group(3)) * (
                    2 if mn.startswith("v_smfmac") else 1)
            continue
        batch.step(mn, rest, c)
        if mn.startswith("s_waitcnt") and "vmcnt" in rest:
            waited = True
        if not waited:
            first_wait_bytes += _vmem_bytes(mn, rest)
        s_bytes += _vmem_bytes(mn, rest)  # loads only: a wave does not wait for its stores
        if c == "VALU":
            s_vec += 16 if mn.startswith(("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_")) else 4
        elif c == "MFMA":
            s_vec += mfma_cycles(mn, arch)
        elif c.startswith("LDS"):
            s_lds += 16
    common = dict(straight_vector=s_vec, straight_lds=s_lds, straight_trips=max(1, trips[False].n),
                  straight_bytes=s_bytes)
    if hot:
        cyc = hot[1]
        ring = _steady_batch(lines, hot[0], skipped)
        return KernelFeatures(stats.kernel, waves, wpw, max(loop_bytes, first_wait_bytes, ring), cyc["matrix_cycles"],
                              cyc["vector_cycles"], cyc["lds_cycles"], loop_flops, True,
                              loop_trips=max(1, trips[True].n), **common)
    return KernelFeatures(stats.kernel, waves, wpw, batch.peak, **common)


class _Outstanding:
    """The vmcnt counter of one wave through code in program order: an in-order queue of its outstanding
    vector-memory operations (loads with their bytes; stores, which the gfx9 vmcnt counts too, with none).
    `s_waitcnt vmcnt(k)` retires all but the newest k. `peak` is the most load bytes outstanding at a wait that
    must retire a load: the batch the wave has in flight while it waits on memory (Little's law's bytes in flight).
    A wait that retires only stores, or nothing, does not count; nor do loads still outstanding at the end of the
    code (a load's data is waited on before it is used)."""

    def __init__(self):
        self.queue, self.peak = collections.deque(), 0

    def step(self, mn: str, rest: str, c: str) -> None:
        if c in ("vmem_load", "vmem_store"):
            self.queue.append(_vmem_bytes(mn, rest))
        elif mn.startswith("s_waitcnt") and "vmcnt" in rest:
            k = int(re.search(r"vmcnt\((\d+)\)", rest).group(1))
            if len(self.queue) > k:
                outstanding = sum(self.queue)
                retired = [self.queue.popleft() for _ in range(len(self.queue) - k)]
                if any(retired):
                    self.peak = max(self.peak, outstanding)


def _steady_batch(lines: list[str], loop, skipped: set) -> int:
    """The largest load batch a wave has outstanding at a wait of its hot loop, in the steady state: the vmcnt counter
    run through the code before the loop and then the loop body three times, the last pass's peak (`_Outstanding`).
    A ring of several K tiles (an LDS pipeline of STAGES buffers) keeps STAGES - 1 iterations' loads outstanding at
    each wait, more than one iteration issues; a prefetch-1 loop, or one that waits on part of its own batch, keeps
    at most one iteration's (features takes the larger of this and the loop's loads per iteration)."""
    order = [i for i in range(loop.start) if i not in skipped] + list(range(loop.start, loop.end + 1)) * 3
    last = len(order) - (loop.end + 1 - loop.start)
    o = _Outstanding()
    for n, i in enumerate(order):
        if n == last:
            o.peak = 0
        m = _INSTR.match(lines[i].split(";")[0])
        if m:
            o.step(m.group(1), m.group(2), classify(m.group(1)))
    return o.peak


class _Trips:
    """Counts memory round trips in program order: a trip ends at an `s_waitcnt vmcnt(k)` that needs a
    load issued since the previous trip ended (vmcnt retires in order, so the wait needs the oldest such
    load when k is below the operations issued since it). The compiler's staggered waits (vmcnt(9),
    vmcnt(8), ... on one batch) end one trip; a wait for loads of an earlier iteration (a prefetch
    pipeline) ends none; a load issued after a trip whose result a later wait needs starts the next."""

    def __init__(self):
        self.n, self.since = 0, 0  # trips; operations issued since the oldest load not yet waited on (0: none)

    def step(self, mn: str, rest: str, c: str) -> None:
        if c == "vmem_load" or (c == "vmem_store" and self.since):
            self.since += 1
        elif mn.startswith("s_waitcnt") and "vmcnt" in rest:
            k = int(re.search(r"vmcnt\((\d+)\)", rest).group(1))
            if self.since and k < self.since:
                self.n, self.since = self.n + 1, 0


def _body_lines(text: str, kernel: str) -> list[str]:
    m = re.search(rf"^{re.escape(kernel)}:.*?$(.*?)^\s*s_endpgm", text, re.M | re.S)
    return (m.group(1) if m else text).splitlines()


@dataclass(frozen=True)
class Launch:
    """The launch shape: workgroups, hot-loop iterations of each (one number: all equal), HBM bytes."""
    grid: int
    iterations: tuple | float  # per workgroup (a tuple when they differ, e.g. causal attention)
    hbm_bytes: float
    flops: float = 0.0
    # bytes other XCDs read again (a block one XCD's L2 already holds, needed by a workgroup on another XCD):
    # served by the last-level cache at REREAD_EFFICIENCY x the vendor's HBM peak (`xcd_reread_bytes`)
    reread_bytes: float = 0.0
    # bytes all workgroups load through the vector-memory path (every lane's load, L2 hits included: what flysim
    # counts); None: from the features (`loaded_bytes`). What t_l2 prices.
    l2_bytes: float | None = None
    # the MFMA input type of `flops` ("bf16", "f16", "fp8"): where the arch has a published Max-Achievable FLOPs for
    # it (arch.Arch.maf_flops), flops / that rate is a floor of the kernel time (t_maf). None: no such floor.
    dtype: str | None = None


def iterations_for(flops_per_wg: float, feat: KernelFeatures) -> int:
    """Hot-loop iterations of a workgroup that issues `flops_per_wg` MFMA FLOPs."""
    per_iter = feat.loop_flops * feat.waves_per_wg
    return max(1, math.ceil(flops_per_wg / per_iter)) if per_iter else 1


def loaded_bytes(feat: KernelFeatures, launch: Launch) -> float:
    """Bytes every workgroup of the launch loads through the vector-memory path, from the features: each wave's
    straight-line loads plus its hot loop's loads per iteration x the workgroup's iterations (a loop kernel's
    peeled K steps are counted in both when `iterations` counts them: an upper bound; GEMM callers pass the
    closed form, Launch.l2_bytes)."""
    if launch.l2_bytes is not None:
        return launch.l2_bytes
    iters = launch.iterations
    n_it = iters * launch.grid if isinstance(iters, (int, float)) else sum(iters)
    loop = feat.inflight_bytes * n_it if feat.has_loop else 0
    return feat.waves_per_wg * (feat.straight_bytes * launch.grid + loop)


def l2_bytes_per_s(arch: str) -> float:
    """The L2s' aggregate read peak (every XCD's L2 at its data-sheet width, arch.Arch.l2_read_bytes_per_clk)."""
    g = GPUS[arch]
    return g.xcds * g.l2_read_bytes_per_clk * g.clock_hz


def launch_time(feat: KernelFeatures, launch: Launch, arch: str, consts: dict | None = None) -> dict:
    """MODEL seconds of one launch and its terms (module docstring). `t` pays T_LAUNCH (one kernel replayed
    alone, what the measurements time); `kernel_t` leaves it out; `t_graph` pays GRAPH_LAUNCH instead (the
    measured cost of a launch replayed back to back with others in one HIP graph, an upper bound)."""
    g = GPUS[arch]
    c = dict(g.timing, **(consts or {}))
    clock, cus = g.clock_hz, g.cus
    wg_per_cu = max(1, feat.waves_per_simd * g.simds // feat.waves_per_wg)
    resident_wg = min(wg_per_cu, launch.grid / cus)  # per CU, averaged over the busy rounds
    w = max(1.0, resident_wg * feat.waves_per_wg / g.simds)  # waves sharing one SIMD
    lat_cyc = c["mem_latency_s"] * clock
    # memory: Little's law per CU, capped by the achievable HBM bandwidth
    in_flight = resident_wg * feat.waves_per_wg * feat.inflight_bytes * cus
    bw = min(c["hbm_efficiency"] * g.hbm_bytes_per_s, in_flight / c["mem_latency_s"]) if in_flight else \
        c["hbm_efficiency"] * g.hbm_bytes_per_s
    t_mem = launch.hbm_bytes / bw + launch.reread_bytes / (c.get("reread_efficiency", 1.0) * g.hbm_bytes_per_s)
    # issue: one iteration of the w waves of a SIMD; then list-schedule the workgroups on the CUs
    if feat.has_loop:
        m, v, l_ = feat.loop_matrix, feat.loop_vector, feat.loop_lds
        top = max(m, v, l_)
        # cycles for every resident wave to run one iteration: the busiest pipe for w waves, plus the
        # part of the other pipes' work that does not overlap it (1 - OVERLAP); one wave alone is serial
        busy = max(w * (top + (1 - c["overlap"]) * (m + v + l_ - top)), m + v + l_)
        # each memory round trip of an iteration waits part of a latency; a deeper prefetch waits a latency
        # every `prefetch` iterations
        lat_it = lat_cyc * feat.loop_trips / feat.prefetch
        round_ = max(busy + c.get("exposed", 0.0) * lat_it, lat_cyc / feat.prefetch)
    else:
        round_ = 0.0
    # code outside the loop, once per workgroup: its vector work, one HBM trip, and every later dependent
    # trip at the L2 latency (it re-reads what the workgroup or its neighbours just read: a row, a
    # shared vector)
    head = (max(feat.straight_vector, feat.straight_lds) * w + lat_cyc
            + (feat.straight_trips - 1) * c.get("l2_latency_s", 0.0) * clock)
    # L2: every byte the workgroups load passes the XCDs' L2s (hits and misses), at most L2_EFFICIENCY x their peak
    l2b = loaded_bytes(feat, launch)
    l2_bw = c.get("l2_efficiency", 1.0) * l2_bytes_per_s(arch)
    t_l2 = l2b / l2_bw
    slots = cus * wg_per_cu
    head_first = head
    if feat.has_loop:
        # a loop kernel's prologue / epilogue transfers (its first operand tiles, its output) happen in
        # the same phase on every resident workgroup, so they do not hide under other workgroups' loops.
        # The first round finds the L2s empty (cold): its loads take the CU's share of the achievable HBM
        # bandwidth (shared by the CUs that have a workgroup). A later round's loads hit the L2 as often as the
        # launch's loads do on average: the launch's share of bytes from beyond the L2 (HBM bytes and the XCD
        # re-reads over every loaded byte) at the HBM share, the rest at the CU's share of the L2 bandwidth.
        cu_busy = min(cus, launch.grid)
        bw_cu, l2_cu = c["hbm_efficiency"] * g.hbm_bytes_per_s / cu_busy, l2_bw / cu_busy
        pro = resident_wg * feat.waves_per_wg * feat.straight_bytes
        miss = min(1.0, (launch.hbm_bytes + launch.reread_bytes) / l2b) if l2b else 1.0
        head_first = head + pro / bw_cu * clock
        head += (pro * miss / bw_cu + pro * (1 - miss) / l2_cu) * clock
    iters = launch.iterations
    if not isinstance(iters, (int, float)) and len(set(iters)) == 1:
        iters = iters[0]
    if isinstance(iters, (int, float)):  # every workgroup alike: the first round, then ceil(rest / slots) later rounds
        later = math.ceil(max(0, launch.grid - slots) / slots)
        t_issue = (head_first + later * head + (1 + later) * iters * round_) / clock if launch.grid else 0.0
    else:
        t_issue = _list_schedule([(head_first if i < slots else head) + n * round_ for i, n in enumerate(iters)],
                                 slots) / clock
    kt_boost = max(t_mem, t_issue, t_l2)
    # the vendor's measured ceiling of dense matrix work (the clock drops under MFMA load): no kernel beats it
    t_maf = launch.flops / g.maf_flops[launch.dtype] if launch.flops and launch.dtype in g.maf_flops else 0.0
    kt = max(kt_boost, t_maf)
    t = c["launch_s"] + kt
    return dict(t=t, kernel_t=kt, kernel_t_boost=kt_boost, t_maf=t_maf, t_graph=c.get("graph_launch_s", 0.0) + kt,
                t_device=c.get("device_launch_s", 0.0) + kt,
                t_l2=t_l2, l2_bytes=l2b, t_mem=t_mem, t_issue=t_issue,
                bound="MAF" if t_maf > kt_boost else "L2" if t_l2 >= max(t_mem, t_issue) else
                "memory" if t_mem >= t_issue else "issue",
                bw=bw, in_flight_per_cu=in_flight / cus, waves_per_simd=w, wg_per_cu=wg_per_cu,
                grid_per_cu=launch.grid / cus)


def _list_schedule(durations: list, slots: int) -> float:
    """Finish time of workgroups of the given wall durations (cycles), in launch order, each taking
    the earliest free slot of the machine (wave quantization and tails)."""
    if not durations:
        return 0.0
    if len(set(durations)) == 1:  # uniform: closed form
        return math.ceil(len(durations) / slots) * durations[0]
    if len(durations) > slots and len(set(durations[slots:])) == 1 and len(set(durations[:slots])) == 1:
        # a first round of one duration, the rest of another: every slot runs one of each round in turn
        return durations[0] + math.ceil((len(durations) - slots) / slots) * durations[slots]
    free = [0.0] * min(slots, len(durations))
    end = 0.0
    for d in durations:
        e = heapq.heappop(free) + d
        end = max(end, e)
        heapq.heappush(free, e)
    return end


def xcd_reread_bytes(m: int, n: int, k: int, esize_a: float, esize_w: float, bm: int, bn: int, xcds: int,
                     split: int = 1, rows_first: bool = True, grouped: bool = False) -> float:
    """Bytes of A and W that a tiled GEMM reads once more per extra XCD (each XCD has its own L2). Workgroups
    go to the XCDs round-robin in launch order. When the launch order runs over the row tiles first (grid x =
    M tiles, y = split x N tiles: upstream's preshuffle GEMM and ours), the min(row tiles, XCDs) workgroups
    sharing a W column block sit on that many XCDs, and an A row block is shared by the XCDs its column tiles
    land on: min(column tiles, XCDs / gcd(row tiles, XCDs)) of them. `rows_first=False`: the column tiles come
    first (upstream's fp8_gemm_4w below its remap threshold), the roles swap. `grouped`: our GEMM's XCD-grouped
    order (gemm/xcd.py): XCD x computes the consecutive logical ids [s, e) (rows fastest), so it reads the W
    blocks (e - 1) // rows - s // rows + 1 and, per split its range covers, min(ids in that split, rows) A blocks."""
    rows, cols, ks = -(-m // bm), -(-n // bn), k / split
    if grouped:
        from translator_kernels.gemm.xcd import xcd_ranges

        plane, w_reads, a_reads = rows * cols, 0, 0  # plane: the ids of one split
        for s, e in xcd_ranges(rows * cols * split, xcds):
            w_reads += (e - 1) // rows - s // rows + 1
            a_reads += sum(min(min(e, (p + 1) * plane) - max(s, p * plane), rows)
                           for p in range(s // plane, (e - 1) // plane + 1))
        return (w_reads - cols * split) * bn * ks * esize_w + (a_reads - rows * split) * bm * ks * esize_a
    if rows_first:
        w_xcds, a_xcds = min(rows, xcds), min(cols, xcds // math.gcd(rows, xcds))
    else:
        w_xcds, a_xcds = min(rows, xcds // math.gcd(cols, xcds)), min(cols, xcds)
    return split * (cols * (w_xcds - 1) * bn * ks * esize_w + rows * (a_xcds - 1) * bm * ks * esize_a)


def gemm_hbm_bytes(m: int, n: int, k: int, esize_a: float, esize_w: float, esize_c: float, bm: int, bn: int,
                   slots: int, llc_bytes: float) -> float:
    """HBM bytes of a tiled GEMM with L2 / last-level-cache reuse: operands that fit `llc_bytes`
    are read once; otherwise each round of `slots` resident tiles (row-major over column tiles)
    reads its distinct A row blocks and W column blocks."""
    a, wt, out = m * k * esize_a, n * k * esize_w, m * n * esize_c
    if a + wt <= llc_bytes:
        return a + wt + out
    tm, tn = -(-m // bm), -(-n // bn)
    total, tiles = 0.0, tm * tn
    for start in range(0, tiles, slots):
        rows = {t // tn for t in range(start, min(tiles, start + slots))}
        cols = {t % tn for t in range(start, min(tiles, start + slots))}
        total += len(rows) * bm * k * esize_a + len(cols) * bn * k * esize_w
    return max(total, a + wt) + out
