"""MODEL (no GPU here, labelled as such): one decode step of Llama-3-8B on our kernels, against the HBM limit.

bench.generate prints it beside its host-time measurement (issue 23's evidence). Three limits, all printed:

* 'achievable' (the headline; issue 23's goal is judged on it): weight bytes + KV bytes over the bandwidth the
  validated timing MODEL fits as achievable, HBM_EFFICIENCY (0.63) x the vendor peak: the same reading as
  issue 29's "0.8 of HBM" ("of achievable", docs/timing-model.md). Against the vendor peak the goal is
  unreachable by construction of that MODEL: it lets no kernel stream above 0.63 of the peak, so a step of
  perfect kernels with no launch gap is 0.63 of the vendor limit.
* 'vendor': the same bytes over the vendor's peak bandwidth (translator_kernels/arch.py): the formula the
  issue names, kept so nothing is hidden.
* 'streaming': over the measured streaming bandwidth (arch.STREAM_MEASURED, 0.81 of the peak: the seed's
  vec_add on MI350X; MI300X assumed the same fraction).

Bytes: every weight but the embedding table read once per step (the table is read at batch rows only), plus
every sequence's K and V up to its context; bf16.

Our kernels' time (`decode_step_launches`, `model_rows`): per layer the launches of docs/llama-layer.md (RMSNorm,
QKV GEMM, RoPE q + k with the K / V cache writes in one launch, decode attention with its split-KV combine inside
the launch, O projection, RMSNorm, gate + up GEMM, down GEMM) x 32, then the embedding gather, the final norm and
the LM head, each timed by the calibrated MODEL (translator_kernels.timing; its CALIBRATION line is printed with
the table):
- GEMMs at the tile tiles.choose_config picks for M = batch, tiles.model_estimate (features estimated from
  the tile, no compile);
- RMSNorm on the cached features of upstream's kernel (translator_kernels/measure/calibration_isa.json);
- RoPE + cache writes, decode attention (its merge included) and the embedding gather on the features of OUR
  kernels compiled for the arch (translator_kernels.measure.decode_isa and rope_cache.DECODE_STEP, COMPILE_ONLY
  in a child, once per arch and compile-time variant, ~5-20 s each; the instruction mix does not depend on batch
  or context, the launch shape does). Where a compile fails (no toolchain) the launch falls back to a
  bandwidth floor (launch floor + bytes at the achievable bandwidth: optimistic), labelled in its row.
- decode attention, split KV: one launch (translator_kernels/attention/fwd.py): each slice writes fp32 partials
  and takes a ticket, the last arriver of a head merges. Bytes: K and V once per sequence, q in and O out,
  the partials written and read back (nsplit x (D + 2) fp32 per head), the tickets (an int32 atomic per slice,
  read and written, and the reset). Slices: split_geometry's, the count the MODEL prices fastest
  (attention/split_model.model_split). Time: attention/split_model.price, on split_model.decode_features (the
  unmasked key loop is the hot loop; the masked one runs no tile at position context - 1 and is left out):
  the compiled kernel's straight-line trips hold the ticket and one round of the merge (a batch of 8 or 16
  slices whose loads are issued together, fwd.merge_rows); the merger's other merge_trips - 1 rounds follow
  the last slice, once, each at L2_LATENCY plus the merge's vector work. The merge's loads leave the prologue
  bytes (the unsplit compile's straight-line bytes are charged): only the merger issues them, on partials just
  written, and their bytes are in the launch's.

Launch lists: `AS_BUILT` names the variants that are built (the default list); `VARIANTS` the ones that can be
priced (`--variant` in bench.generate; every list is printed as extra rows):
- `fused_norm`: RMSNorm folded into the GEMM that reads it (QKV, gate + up, and the final norm into the LM
  head: helper normfuse's translator_kernels/gemm/rownorm.py, its rule taking M <= NORM_FOLD_M_MAX = 4); at
  batch <= 4 the 2 x 32 + 1 RMSNorm launches go; each GEMM workgroup reads its valid A rows over the full K once
  more (the sum of squares) before its loop, from L2 (the norm's input was just written): those bytes at the
  L2s' read bandwidth (arch.py's data-sheet figure, 16 x 128 B per clock per XCD: not measured, not in the
  calibration), ceil(rows / 2) dependent rounds at L2_LATENCY (two rows per round, rownorm.py's groups) and
  ROWNORM_VECTOR_CYCLES of vector work per round, added to the GEMM's MODEL time (the prologue precedes the
  loop). Larger batches keep the norm launches (the rule does not fire there).
Each step is priced three ways: 'alone' (T_LAUNCH, 12 us, per launch: one kernel replayed alone, what the
calibration's measurements time), 'graph' (GRAPH_LAUNCH, 1.7 us: measured back to back in one HIP graph, an
upper bound of the gap; a decode step captured as one graph) and 'kernels' (no gap, a lower bound). The goal's
verdict is judged on 'graph' (the step as a GPU replays it), printed per batch-1 row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GOAL_FRACTION = 0.8  # issue 23: a decode step at >= 0.8 of the HBM limit at batch 1 (MODEL)
VARIANTS = ("fused_norm",)  # launch-list variants the MODEL can price (module docstring)
AS_BUILT = ("fused_norm",)  # the variants that are built: the default launch list (normfuse's fold landed)
NORM_FOLD_M_MAX = 4  # normfuse's rule (translator/lowerings/norm_gemm.M_MAX) folds the norm at M <= 4 only
ROWNORM_ROWS_PER_ROUND = 2  # rownorm.py: K = 4096 bf16 rows go two per dependent load round
ROWNORM_VECTOR_CYCLES = 400  # rownorm.py's prologue, per wave and row group (docs/llama-layer.md, compiled)


@dataclass(frozen=True)
class LlmShape:
    """A decoder's shapes: what its decode step reads."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    bytes_per_elem: int = 2  # bf16 weights and KV cache

    def weight_bytes(self) -> int:
        """Bytes a decode step reads of the weights: every layer's projections and MLP, the final norm and the
        LM head (the embedding table is read at batch rows only: not counted)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h
        return (self.layers * layer + h + self.vocab * h) * self.bytes_per_elem

    def kv_bytes(self, batch: int, context: int) -> int:
        """K and V of every layer, read up to `context` per sequence."""
        return batch * context * self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_elem


LLAMA3_8B = LlmShape("Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                     vocab=128256)


def hbm_limit_rows(shape: LlmShape = LLAMA3_8B, batches=(1, 16, 64), contexts=(2048, 8192)) -> list[dict]:
    """MODEL: per GPU, batch and context, the decode step's bytes and its time at the vendor peak, at the
    measured streaming bandwidth and at the MODEL's achievable bandwidth."""
    from translator_kernels.arch import GPUS, STREAM_MEASURED

    rows = []
    for arch, g in GPUS.items():
        for b in batches:
            for ctx in contexts:
                w, kv = shape.weight_bytes(), shape.kv_bytes(b, ctx)
                step = (w + kv) / g.hbm_bytes_per_s
                rows.append(dict(gpu=g.gpu, arch=arch, batch=b, context=ctx, weight_gb=w / 1e9, kv_gb=kv / 1e9,
                                 bandwidth_tb=g.hbm_bytes_per_s / 1e12, step_ms=step * 1e3, tokens_s=b / step,
                                 streaming_ms=step / STREAM_MEASURED * 1e3,
                                 achievable_ms=step / g.timing["hbm_efficiency"] * 1e3))
    return rows


def print_limit_table(rows) -> None:
    from translator_kernels.arch import GPUS, STREAM_MEASURED

    eff = GPUS["gfx950"].timing["hbm_efficiency"]
    print(f"\nMODEL (not measured): {LLAMA3_8B.name} decode step at the HBM limit (weight bytes + KV bytes over "
          f"bandwidth, bf16): at the MODEL's achievable bandwidth ({eff:.2f} x the vendor peak: HBM_EFFICIENCY, "
          "fitted by bench.calibration; issue 23's goal is judged against it), at the vendor's peak "
          f"(translator_kernels/arch.py) and at the measured streaming bandwidth ({STREAM_MEASURED:.2f} of the peak: "
          "the seed's vec_add on MI350X, 6468 GB/s; MI300X assumed the same fraction)")
    print("| GPU | batch | context | weights GB | KV GB | HBM TB/s (vendor) | ms per step: achievable / vendor / "
          "streaming | tokens/s at vendor peak |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gpu']} ({r['arch']}) | {r['batch']} | {r['context']} | {r['weight_gb']:.2f} | {r['kv_gb']:.2f} | "
              f"{r['bandwidth_tb']:.1f} | {r['achievable_ms']:.2f} / {r['step_ms']:.2f} / {r['streaming_ms']:.2f} | "
              f"{r['tokens_s']:.0f} |")


# ---- compiled features of our kernels (COMPILE_ONLY child) ----------------------------------------
_FEATURES: dict = {}  # (what, arch) -> {kernel name: KernelFeatures}, or the compile error (a string)


def compiled_features(what: str, entry: str, args: tuple, arch: str, decode: bool = False):
    """timing.features of every kernel `entry(*args)` compiles for `arch`, by kernel name; once per (what, arch).
    decode: attention/split_model.decode_features (the decode kernel's unmasked key loop hot, its masked one
    left out). A string (the error) where it does not compile: the caller prices a labelled bandwidth floor."""
    key = (what, arch)
    if key not in _FEATURES:
        from translator_kernels.attention.split_model import decode_features
        from translator_kernels.hotloop import compile_isa_texts
        from translator_kernels.timing import features

        try:
            feats = [(decode_features if decode else features)(t, arch) for t in compile_isa_texts(entry, args, arch=arch)]
            _FEATURES[key] = {f.kernel: f for f in feats}
        except Exception as e:  # noqa: BLE001 - no toolchain: the floor, said so in the row
            _FEATURES[key] = f"{type(e).__name__}: {str(e)[:80]}"
    return _FEATURES[key]


def _kernel(feats, prefix: str):
    if isinstance(feats, str):
        return feats
    found = [f for name, f in feats.items() if name.startswith(prefix)]
    return found[0] if found else f"no {prefix} kernel in the compile"


# ---- one launch each ----------------------------------------------------------------------------
def _floor_launch(name: str, nbytes: float, arch: str, why: str = "") -> dict:
    """A launch the model has no features for: its launch floor plus its HBM bytes at the achievable
    bandwidth (the fitted efficiency x the vendor peak): a bandwidth floor, optimistic."""
    from translator_kernels.arch import GPUS

    g = GPUS[arch]
    t_mem = nbytes / (g.timing["hbm_efficiency"] * g.hbm_bytes_per_s)
    return dict(name=name, t=g.timing["launch_s"] + t_mem, kernel_t=t_mem,
                how="bandwidth floor" + (f" ({why})" if why else ""))


def _priced(name: str, feat, launch, arch: str, how: str, extra_s: float = 0.0) -> dict:
    from translator_kernels.arch import GPUS
    from translator_kernels.timing import launch_time

    r = launch_time(feat, launch, arch)
    kt = r["t"] - GPUS[arch].timing["launch_s"] + extra_s
    return dict(name=name, t=GPUS[arch].timing["launch_s"] + kt, kernel_t=kt, how=how)


def _gemm_launch(name: str, m: int, n: int, k: int, arch: str, fused_norm: bool = False) -> dict:
    """Our GEMM at the tile the heuristic picks for M = batch (tiles.choose_config), timed by the MODEL on
    features estimated from that tile (tiles.model_estimate: no compile). fused_norm: RMSNorm folded in (module
    docstring): each workgroup reads its valid A rows over the full K once more, in dependent rounds of
    ROWNORM_ROWS_PER_ROUND rows at L2_LATENCY, with their vector work, before its loop."""
    from translator_kernels.arch import GPUS
    from translator_kernels.gemm.tiles import choose_config, m_bucket, model_estimate

    g = GPUS[arch]
    c = choose_config(m_bucket(m), n, k, "bf16", arch)
    e = model_estimate(m, n, k, "bf16", arch, c)
    how = f"GEMM {c.bm}x{c.bn}x{c.bk} kw{c.kw} s{c.split}, MODEL (estimated features)"
    kt = e["kernel_t"]
    if fused_norm:
        rows = min(m, c.bm)
        extra = e["units"] * rows * k * 2  # every workgroup: its valid A rows over the full K, bf16
        rounds = math.ceil(rows / ROWNORM_ROWS_PER_ROUND)
        kt += extra / l2_bandwidth(arch) + rounds * (g.timing["l2_latency_s"] + ROWNORM_VECTOR_CYCLES / g.clock_hz)
        how += (f" + RMSNorm folded in ({extra / 1e6:.1f} MB of A rows re-read from L2, {rounds} dependent L2 "
                f"round{'s' if rounds > 1 else ''})")
    return dict(name=name + (" + RMSNorm" if fused_norm else ""), t=g.timing["launch_s"] + kt, kernel_t=kt, how=how)


def l2_bandwidth(arch: str) -> float:
    """Bytes per second the L2s serve (arch.py's data-sheet figure, every XCD's L2 together), capped by what the
    CUs can take in (64 bytes per clock each)."""
    from translator_kernels.arch import GPUS

    g = GPUS[arch]
    return min(g.xcds * g.l2_read_bytes_per_clk, g.cus * 64) * g.clock_hz


def _norm_launch(name: str, rows: int, hidden: int, arch: str) -> dict:
    """RMSNorm over `rows` rows: the MODEL on the cached features of upstream's RMSNorm at n = hidden
    (translator_kernels/measure/calibration_isa.json, compiled for gfx950: gfx942 takes them too)."""
    from translator_kernels.measure.calibration import load_features
    from translator_kernels.timing import KernelFeatures, Launch

    feat = KernelFeatures(**load_features()[f"rms_norm:n={hidden}"])
    return _priced(name, feat, Launch(rows, 1, 2 * rows * hidden * 2 + hidden * 2), arch,
                   "MODEL (cached RMSNorm features, upstream's kernel)")


def _rope_cache_launch(batch: int, shape: LlmShape, context: int, arch: str) -> dict:
    """RoPE q + k and the K / V cache writes, one launch (translator_kernels/layout/rope_cache.py): the MODEL on
    the features of the kernel compiled for `arch` (at batch 1: the instruction mix does not depend on the batch;
    grid and bytes do), else a bandwidth floor, labelled."""
    from translator_kernels.layout.rope_cache import DECODE_STEP, decode_step_launch
    from translator_kernels.timing import Launch

    args = (batch, shape.heads, shape.kv_heads, shape.head_dim, context)
    name = "RoPE q + k, K / V cache writes (one kernel)"
    feat = _kernel(compiled_features("rope_cache", DECODE_STEP, (1, *args[1:]), arch), "")
    grid, nbytes = decode_step_launch(*args)
    if isinstance(feat, str):
        return _floor_launch(name, nbytes, arch, f"no compile: {feat}")
    return _priced(name, feat, Launch(grid, 1, nbytes), arch, "MODEL (features of our compiled kernel)")


def attention_launch_bytes(batch: int, shape: LlmShape, context: int, nsplit: int, group: int = 1) -> int:
    """HBM bytes of one layer's decode attention launch: K and V once per sequence and KV head (the query heads of
    a group share them through L2), q in and O out, and under split KV the fp32 partials (O over the padded head
    dim, m and l) written and read back by the merger, and the tickets (per head an int32 atomic per slice, 4 B
    read and 4 written, and the reset)."""
    from translator_kernels.attention import padded_head_dim

    b, h, d, e = batch, shape.heads, shape.head_dim, shape.bytes_per_elem
    nbytes = shape.kv_bytes(b, context) // shape.layers + 2 * b * h * d * e
    if nsplit > 1:  # partials per query head (a packed block holds its KV group's heads as rows); a ticket per block
        nbytes += 2 * nsplit * b * h * (padded_head_dim(d) + 2) * 4 + b * (h // group) * (8 * nsplit + 4)
    return nbytes


def _attention_launch(batch: int, shape: LlmShape, context: int, arch: str) -> dict:
    """Decode attention on the cache (one query token per sequence, keys up to `context`), its split-KV merge
    inside the launch, at the slice count split_geometry chooses (the MODEL's fastest: split_model.model_split):
    split_model.price on the features of our kernel compiled for `arch` (translator_kernels.measure.decode_isa;
    split_model.decode_features: the unmasked key loop hot, the masked one left out), the merger's further
    rounds as a tail. A labelled bandwidth floor where the compile fails."""
    from translator_kernels.arch import GPUS
    from translator_kernels.attention.decode_plan import decode_plan
    from translator_kernels.attention.split_model import price
    from translator_kernels.measure.decode_isa import DECODE_ATTENTION

    g = GPUS[arch]
    b, h, d = batch, shape.heads, shape.head_dim
    # decode GQA packing (translator_kernels/attention/gqa.py): one block per (sequence, KV head, slice), the
    # group's query heads its rows, K / V loaded once per KV head; the compile below takes the same path
    plan = decode_plan(b, h, shape.kv_heads, context, d, "bf16", arch)
    nsplit, chunk, hp = plan["nsplit"], plan["keys_per_slice"], plan["grid"][1]
    nbytes = attention_launch_bytes(b, shape, context, nsplit, h // hp)
    whole, split = (_kernel(compiled_features(f"attention split={n > 1}", DECODE_ATTENTION,
                                              (1, h, shape.kv_heads, d, context, n), arch, decode=True), "attention_fwd")
                    for n in (1, 16))
    name = f"decode attention (split {nsplit}, merge in the launch)" if nsplit > 1 else "decode attention"
    if isinstance(whole, str) or isinstance(split, str):
        return _floor_launch(name, nbytes, arch, f"no compile: {whole if isinstance(whole, str) else split}")
    r = price(whole, split, b, hp, plan["rows_per_block"], context, d, "bf16", arch, nsplit, chunk, nbytes)
    tail = r["merge_trips"] - 1
    how = "MODEL (features of our compiled kernel)" + (f" + the merge's other {tail} round trip{'s' * (tail > 1)}"
                                                        if tail > 0 else "")
    return dict(name=name, t=g.timing["launch_s"] + r["kernel_t"], kernel_t=r["kernel_t"], how=how)


def _gather_launch(batch: int, shape: LlmShape, arch: str) -> dict:
    """The embedding gather (translator_kernels.gather): the MODEL on our compiled kernel, else a floor."""
    from translator_kernels.gather import BLOCK, pick_vec
    from translator_kernels.measure.decode_isa import DECODE_GATHER
    from translator_kernels.timing import Launch

    h, e = shape.hidden, shape.bytes_per_elem
    nbytes = batch * h * e * 2 + batch * 8
    feat = _kernel(compiled_features("embedding", DECODE_GATHER, (1, h, shape.vocab), arch), "embedding")
    if isinstance(feat, str):
        return _floor_launch("embedding gather", nbytes, arch, f"no compile: {feat}")
    grid = math.ceil(batch * h // pick_vec(h, "bf16") / BLOCK)
    return _priced("embedding gather", feat, Launch(grid, 1, nbytes), arch, "MODEL (features of our compiled kernel)")


def decode_step_launches(arch: str, batch: int, context: int, shape: LlmShape = LLAMA3_8B, fused_rope: bool = True,
                         variants: tuple = AS_BUILT) -> list[dict]:
    """The launches of one decode step (one token per sequence) of `shape` on our kernels, each with its MODEL
    time and a count: per layer (x layers), then the embedding gather, the final norm and the LM head.
    fused_rope=False: the launch list before the fused RoPE + cache-write launch (RoPE q, RoPE k, two cache
    writes: bandwidth floors). `variants`: names from VARIANTS (module docstring); fused_norm folds the norms at
    batch <= NORM_FOLD_M_MAX only, as normfuse's rule does."""
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown decode-step variant(s) {sorted(unknown)}; choose from {VARIANTS}")
    fuse = "fused_norm" in variants and batch <= NORM_FOLD_M_MAX
    e = shape.bytes_per_elem
    h, d, q, kv = shape.hidden, shape.head_dim, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    rope_table = 2 * d * e  # cos and sin rows of this position
    rope = [_rope_cache_launch(batch, shape, context, arch)] if fused_rope else [
        _floor_launch("RoPE q", 2 * batch * q * e + rope_table, arch),
        _floor_launch("RoPE k", 2 * batch * kv * e + rope_table, arch),
        _floor_launch("cache write K", 2 * batch * kv * e, arch),
        _floor_launch("cache write V", 2 * batch * kv * e, arch)]
    layer = [] if fuse else [_norm_launch("RMSNorm (attention)", batch, h, arch)]
    layer += [_gemm_launch("QKV GEMM", batch, q + 2 * kv, h, arch, fuse), *rope,
              _attention_launch(batch, shape, context, arch),
              _gemm_launch("O projection (+ residual)", batch, h, q, arch)]
    layer += [] if fuse else [_norm_launch("RMSNorm (MLP)", batch, h, arch)]
    layer += [_gemm_launch("gated MLP GEMM (gate + up)", batch, 2 * shape.intermediate, h, arch, fuse),
              _gemm_launch("down projection (+ residual)", batch, h, shape.intermediate, arch)]
    step = [dict(r, count=shape.layers) for r in layer]
    step += [dict(_gather_launch(batch, shape, arch), count=1),
             *([] if fuse else [dict(_norm_launch("RMSNorm (final)", batch, h, arch), count=1)]),
             dict(_gemm_launch("LM head", batch, shape.vocab, h, arch, fuse), count=1)]
    return step


def goal_verdict(r: dict) -> str:
    """Issue 23's goal for one row, read from its numbers: judged at batch 1 on the graph-replayed step
    against the achievable limit."""
    if r["batch"] != 1:
        return "-"
    return "met" if r["achievable_graph_fraction"] >= GOAL_FRACTION else "not met"


def model_rows(shape: LlmShape = LLAMA3_8B, batches=(1, 16, 64), contexts=(2048, 8192), fused_rope: bool = True,
               variants: tuple = AS_BUILT) -> list[dict]:
    """hbm_limit_rows with our kernels' MODEL time per decode step beside the limits: alone (T_LAUNCH per
    launch), graph-replayed (GRAPH_LAUNCH per launch) and kernels only, and the fractions limit / MODEL."""
    from translator_kernels.arch import GPUS

    rows = []
    for r in hbm_limit_rows(shape, batches, contexts):
        launches = decode_step_launches(r["arch"], r["batch"], r["context"], shape, fused_rope, variants)
        t = sum(x["t"] * x["count"] for x in launches)
        kt = sum(x["kernel_t"] * x["count"] for x in launches)
        floors = sum(x["count"] for x in launches if x["how"].startswith("bandwidth floor"))
        n = sum(x["count"] for x in launches)
        tg = kt + n * GPUS[r["arch"]].timing["graph_launch_s"]  # graph-replayed: the measured per-launch upper bound
        row = dict(r, variant=list_label(variants), model_us=t * 1e6, graph_us=tg * 1e6,
                   kernels_us=kt * 1e6, launches=n, floors=floors)
        for lim, key in (("", "step_ms"), ("streaming_", "streaming_ms"), ("achievable_", "achievable_ms")):
            limit = r[key] * 1e-3
            row.update({f"{lim or 'limit_'}us": limit * 1e6, f"{lim}fraction": limit / t,
                        f"{lim}graph_fraction": limit / tg, f"{lim}kernels_fraction": limit / kt})
        row["of_model_cap"] = row["achievable_kernels_fraction"]  # the vendor limit at the fitted cap / kernels
        row["verdict"] = goal_verdict(row)
        rows.append(row)
    return rows


def _abc(r, prefix: str) -> str:
    return f"{r[prefix + 'fraction']:.2f} / {r[prefix + 'graph_fraction']:.2f} / {r[prefix + 'kernels_fraction']:.2f}"


def print_ours_table(rows, before=None, variant_rows=(), breakdown=("gfx942", 1, 8192),
                     variants: tuple = AS_BUILT) -> None:
    """The MODEL table: the launch list `rows` were priced with (as built, or `variants`), the fractions of each
    limit, the goal's verdict per batch-1 row; `variant_rows`: the other launch lists, one row each; then the
    launches of one step (`breakdown`)."""
    from translator_kernels.arch import GPUS, STREAM_MEASURED
    from translator_kernels.timing import CALIBRATION

    t0 = GPUS["gfx950"].timing
    eff = t0["hbm_efficiency"]
    print(f"\nMODEL (not measured): our kernels' time per decode step of {LLAMA3_8B.name} (bf16; one token per "
          "sequence), translator_kernels.timing; calibration: " + CALIBRATION)
    print("gfx942 has no measured point: it takes gfx950's fitted constants (an extrapolation). Launch list: "
          f"{list_label(variants)}. Three prices per step: 'alone' = T_LAUNCH "
          f"({t0['launch_s'] * 1e6:.0f} us, one kernel replayed alone, what the calibration's measurements time) per "
          f"launch + the kernels; 'graph' = GRAPH_LAUNCH ({t0['graph_launch_s'] * 1e6:.1f} us, measured back to back "
          "in one HIP graph on MI350X, an upper bound of the gap) per launch + the kernels: the step replayed as one "
          "graph; 'kernels' = no gap (a lower "
          "bound). Three limits (weights + KV bytes over a bandwidth): 'achievable' = the MODEL's fitted achievable "
          f"bandwidth ({eff:.2f} x the vendor peak, HBM_EFFICIENCY: no kernel streams above it in the validated "
          "MODEL; the reading of issue 29's '0.8 of HBM'), the headline; 'vendor' = the vendor's peak (the goal is "
          f"out of reach of this MODEL there: perfect kernels give {eff:.2f}); 'streaming' = {STREAM_MEASURED:.2f} "
          "of the peak (the seed's vec_add). fraction = limit / MODEL. Issue 23's goal: >= "
          f"{GOAL_FRACTION} of the achievable limit at batch 1, judged on 'graph' (goal column). RMSNorm runs on "
          "upstream's cached features, GEMMs on features estimated from their tile; RoPE + cache writes, decode "
          "attention (its split-KV merge inside the launch) and the embedding gather on the features of our kernels "
          "compiled for the arch; a row's 'floors' counts launches priced as bandwidth floors (no compile: optimistic). 'before' = "
          "the launch list with RoPE q, RoPE k and the K / V scatters apart (bandwidth floors).")
    print("| GPU | batch | context | limit us: achievable / vendor / streaming | MODEL us: alone / graph / kernels | "
          "**of achievable: alone / graph / kernels** | goal (batch 1, graph) | of vendor: alone / graph / kernels | "
          "of streaming: alone / graph / kernels | launches | before: launches, of achievable (graph) | floors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        b = before[i] if before else None
        print(f"| {r['gpu']} ({r['arch']}) | {r['batch']} | {r['context']} | {r['achievable_us']:.0f} / "
              f"{r['limit_us']:.0f} / {r['streaming_us']:.0f} | {r['model_us']:.0f} / {r['graph_us']:.0f} / "
              f"{r['kernels_us']:.0f} | **{_abc(r, 'achievable_')}** | {r['verdict']} | {_abc(r, '')} | "
              f"{_abc(r, 'streaming_')} | {r['launches']} | "
              f"{(str(b['launches']) + ', ' + format(b['achievable_graph_fraction'], '.2f')) if b else '-'} | "
              f"{r['floors']} |")
    if variant_rows:
        print("\nMODEL, launch lists (as built = AS_BUILT; the others: kernels being built this session, priced "
              "before they land; `python -m bench.generate --variant NAME` makes one the headline): fused_norm = "
              f"RMSNorm folded into the QKV and gate + up GEMMs and the final norm into the LM head at batch <= "
              f"{NORM_FOLD_M_MAX} (normfuse's rule; 2 launches a layer + 1 fewer; each workgroup re-reads its valid "
              "A rows over the full K from L2: those bytes at the L2s' data-sheet read bandwidth + one dependent L2 "
              f"round per {ROWNORM_ROWS_PER_ROUND} rows); larger batches keep the norm launches.")
        print("| GPU | batch | context | launch list | launches | MODEL us: alone / graph / kernels | "
              "of achievable: alone / graph / kernels | goal (batch 1, graph) | of vendor (graph) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in variant_rows:
            print(f"| {r['gpu']} ({r['arch']}) | {r['batch']} | {r['context']} | {r['variant']} | {r['launches']} | "
                  f"{r['model_us']:.0f} / {r['graph_us']:.0f} / {r['kernels_us']:.0f} | {_abc(r, 'achievable_')} | "
                  f"{r['verdict']} | {r['graph_fraction']:.2f} |")
    arch, b, ctx = breakdown
    print(f"\nMODEL per launch, {GPUS[arch].gpu} ({arch}), batch {b}, context {ctx}, launch list "
          f"{list_label(variants)}:")
    print("| launch | how | x | MODEL us each | kernel us each | MODEL us per step |")
    print("|---|---|---|---|---|---|")
    for x in decode_step_launches(arch, b, ctx, variants=variants):
        print(f"| {x['name']} | {x['how']} | {x['count']} | {x['t'] * 1e6:.1f} | {x['kernel_t'] * 1e6:.1f} | "
              f"{x['t'] * x['count'] * 1e6:.0f} |")


def list_label(variants: tuple) -> str:
    """A launch list's name in the tables: 'as built' (AS_BUILT), else the variants it adds or leaves out."""
    vs = tuple(v for v in VARIANTS if v in variants)
    if set(vs) == set(AS_BUILT):
        return "as built" + (f" ({'+'.join(vs)})" if vs else "")
    added = [v for v in vs if v not in AS_BUILT]
    dropped = [v for v in AS_BUILT if v not in vs]
    return " ".join(["+".join(added)] * bool(added) + ["without " + "+".join(dropped)] * bool(dropped))


def variant_lists() -> list[tuple]:
    """Every launch list the variants table prints: as built first, then every other subset of VARIANTS."""
    subsets = [tuple(v for i, v in enumerate(VARIANTS) if n >> i & 1) for n in range(2 ** len(VARIANTS))]
    built = tuple(v for v in VARIANTS if v in AS_BUILT)
    return [built, *(vs for vs in subsets if vs != built)]


def print_model(variants: tuple = AS_BUILT, batches=(1, 16, 64), contexts=(2048, 8192)) -> list[dict]:
    """Everything bench.generate prints of the MODEL; returns the headline rows."""
    print_limit_table(hbm_limit_rows(batches=batches, contexts=contexts))
    rows = model_rows(batches=batches, contexts=contexts, variants=variants)
    before = model_rows(batches=batches, contexts=contexts, fused_rope=False, variants=variants)
    others = [r for vs in variant_lists() for r in model_rows(batches=batches, contexts=contexts, variants=vs)]
    others.sort(key=lambda r: (r["arch"], r["batch"], r["context"]))
    print_ours_table(rows, before, others, variants=variants)
    return rows
