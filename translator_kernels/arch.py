"""The GPUs the kernel library targets, as one table of hardware facts, and the one dtype-name map.

The translator, the kernels, the ISA tools, the timing and roofline models, the report and the
tests read these; a second copy of any of them fails tests/unit/test_architecture.py.

gfx942 is MI300X / MI325X (CDNA3), gfx950 is MI350X / MI355X (CDNA4). flysim, its own
distribution, keeps the list of the architectures it interprets (flysim.toolchain.ARCHS).

Sources: the vendors' data sheets (CUs, boost clock, HBM bandwidth, dense peaks), the CDNA3 / CDNA4
ISA guides and white papers (LDS size and port width, VGPR file, MFMA shapes and pass counts).
The dense matrix peak is cus x clock x flops per CU per clock (MI300X bf16: 304 x 2.1 GHz x 2048
= 1307 TFLOPS; MI355X: 256 x 2.4 GHz x 4096 = 2517 TFLOPS); gfx950 runs the CDNA3-shaped bf16 /
f16 MFMAs (16x16x16, 32x32x8: half the K) at the CDNA3 rate (translator_kernels/hotloop.py prices them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ARCHS = ("gfx942", "gfx950")


@dataclass(frozen=True)
class Arch:
    name: str  # "gfx942"
    gpu: str  # the product its numbers are for
    cus: int
    clock_hz: float  # boost clock
    lds_bytes: int  # LDS per CU (what one workgroup may allocate at most)
    lds_read_bytes_per_clk: int  # per CU
    hbm_bytes_per_s: float  # vendor peak
    matrix_flops_per_clk: dict  # dense MFMA flops per CU per clock, by input type
    mfma: dict = field(default_factory=dict)  # input type -> the (M, N, K) shapes at the full rate above
    lds_write_bytes_per_clk: int = 128  # per CU
    l2_bytes: int = 4 * 1024 * 1024  # per XCD
    # L2 read bandwidth per XCD: 16 channels x 128 bytes per clock (CDNA3 white paper; CDNA4 keeps the 4 MB,
    # 16-channel L2): MI300X 8 x 2 KiB x 2.1 GHz = 34.4 TB/s, MI355X 8 x 2 KiB x 2.4 GHz = 39.3 TB/s. A data-sheet
    # peak: the timing MODEL's t_l2 reaches L2_EFFICIENCY (fitted, `timing`) of it; bench.generate prices the A-row
    # re-reads of an RMSNorm folded into a GEMM with it
    l2_read_bytes_per_clk: int = 16 * 128
    xcds: int = 8  # accelerator complex dies, one L2 each (MI300X: 8 x 38 CUs, MI355X: 8 x 32)
    simds: int = 4  # per CU
    vgpr_file: int = 512  # unified VGPR + AGPR entries per lane of a SIMD
    sgpr_file: int = 800  # SGPRs per SIMD
    max_waves: int = 8  # waves per SIMD (the occupancy model's cap)
    wave: int = 64
    llc_bytes: int = 256 * 1024 * 1024  # Infinity Cache (last-level cache), both products
    # the timing MODEL's fitted constants (translator_kernels.timing; fitted by bench.calibration on
    # measured MI350X points; MI300X has no measured point here and takes MI350X's)
    timing: dict = field(default_factory=dict)
    # measured, not fitted: the vendor's Max-Achievable FLOPs (dense GEMM at its best shape, the clock the GPU holds
    # under that load) by input type, where published (`achievable_flops`); the timing MODEL's fourth floor
    maf_flops: dict = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix peak (flops per second) for MFMA input type `dtype` ("bf16", "f32", ...)."""
        return self.cus * self.clock_hz * self.matrix_flops_per_clk[dtype]

    def achievable_flops(self, dtype: str) -> float:
        """The vendor's measured Max-Achievable FLOPs for `dtype` where published, else the dense peak."""
        return self.maf_flops.get(dtype, self.peak_flops(dtype))


_CDNA3_RATES = {"f32": 256, "xf32": 512, "bf16": 2048, "f16": 2048, "i8": 4096, "fp8": 4096, "f64": 256}
_CDNA3_MFMA = {"f32": ((16, 16, 4), (32, 32, 2)), "bf16": ((16, 16, 16), (32, 32, 8)), "f16": ((16, 16, 16), (32, 32, 8))}

# fitted by `python -m bench.calibration --fit` (the launch floor of the measuring harness, the
# achievable share of the vendor's HBM peak, the loaded memory latency, the share of matrix / vector /
# LDS work that waves sharing a SIMD overlap (held at 0), the share of a memory latency each round trip of a loop
# iteration waits, the loaded latency of a later dependent round trip outside the loop: set by RMSNorm's scalar-path
# rows, 11-29 such trips per workgroup; the rate of the GEMM blocks other XCDs read again)
_TIMING_FIT = {"launch_s": 12.0e-6, "hbm_efficiency": 0.60, "mem_latency_s": 0.7e-6, "overlap": 0.0, "exposed": 0.35,
               "l2_latency_s": 0.4e-6,
               # the share of the L2s' data-sheet read peak (l2_read_bytes_per_clk x XCDs x clock) that the bytes all
               # workgroups load reach (timing's t_l2): set by the fp8 GEMM 16x64x512 rows whose tiles every
               # workgroup re-reads through L2 (M = 2048, N = K = 7168 fits it; M = 4096, N = K = 8192 validates)
               "l2_efficiency": 0.65,
               # the rate (x the vendor's HBM peak) at which a GEMM's A / W blocks reach the extra XCDs that read them
               # again (timing.xcd_reread_bytes; from the Infinity Cache): set by the fp8 GEMM M = 256, N = 7168,
               # K = 2048 fit point (W read by 8 XCDs), validated by M = 128 at K = 2048 and 2560
               "reread_efficiency": 0.9,
               # measured, not fitted: the cost of one launch replayed back to back with others in ONE HIP graph. The
               # profiling study's first harness (jhinpan/flydsl-kernel-profiling-lib @ 9e45f99, benchmarks/common.py
               # benchmark_cudagraph: n launches of a kernel captured in one graph, n ~ 15 ms of work, the replay timed
               # by events and divided by n; runs 20260602-105539 / -140001, MI350X) timed its smallest kernels at
               # 1.70 us per launch (aiter RMSNorm M=1 N=128; FlyDSL's 1.86-1.93 us): the gap between graph-replayed
               # kernels plus a one-workgroup kernel's own run, so an upper bound of the gap. MI300X takes it too.
               "graph_launch_s": 1.7e-6,
               # fitted (bench.calibration --fit, blog_gemm.fit_device): T_DEVICE, the per-launch device-side time a
               # device-timed kernel (a profiler's kernel duration: no host launch, no harness floor) holds beyond the
               # MODEL's kernel_t: dispatch, wave launch, the drain at the end, and in AITER's split-K GEMM its protocol
               # (partition 0 zeroes C or writes the bias and signals, the others spin on it, then atomics into C). Set
               # by 31 of the ROCm blog's 63 MI355X decode GEMM points (every other one), validated on the other 32.
               # The graph-replayed decode step pays GRAPH_LAUNCH instead, not both (docs/timing-model.md)
               "device_launch_s": 2.5e-6}
# the measured streaming bandwidth, a fraction of the vendor peak: the seed's vec_add (the profiling study's README,
# shared/reference/seeds: 6468 GB/s on MI350X, 81% of 8 TB/s; a 128-bit streaming triad). Not a model constant: the
# second "HBM limit" bench.generate prints beside the vendor peak's. MI300X has no measured figure here: it takes 0.81.
STREAM_MEASURED = 0.81

# AMD's Max-Achievable FLOPs of MI300X (ROCm blog "Measuring Max-Achievable FLOPs - Part 2", 28 Feb 2025, Table 1:
# hipBLASLt at 4096 x 4864 x 32896 (bf16 / f16) and 4096 x 3648 x 32896 (fp8), 750 W, trig_float inputs): bf16 708
# TFLOPS at a median 1207 MHz, f16 654 at 1115 MHz, fp8 1273 at 1230 MHz (the blog's footnote gives fp8 1223.6 at
# 1273 MHz; the table's figure is kept), against dense peaks of 1307 / 1307 / 2615 at the 2.1 GHz boost clock: the GPU
# lowers its clock under dense MFMA load, so no kernel reaches the peak. MI355X has no published figure: its MODEL
# keeps the peak (its fitted constants come from MI350X kernels measured at the clock they ran at).
_MI300X_MAF = {"bf16": 708e12, "f16": 654e12, "fp8": 1273e12}

MI300X = Arch("gfx942", "MI300X", cus=304, clock_hz=2.1e9, lds_bytes=64 * 1024, lds_read_bytes_per_clk=128,
              hbm_bytes_per_s=5.3e12, matrix_flops_per_clk=_CDNA3_RATES, mfma=_CDNA3_MFMA, timing=_TIMING_FIT,
              maf_flops=_MI300X_MAF)
# CDNA4: twice the low-precision matrix rate (K doubled in its bf16 / f16 shapes), half the f64,
# 2.5x the LDS with twice its read port
MI355X = Arch("gfx950", "MI355X", cus=256, clock_hz=2.4e9, lds_bytes=160 * 1024, lds_read_bytes_per_clk=256,
              hbm_bytes_per_s=8.0e12,
              matrix_flops_per_clk={**_CDNA3_RATES, "bf16": 4096, "f16": 4096, "i8": 8192, "fp8": 8192, "f64": 128},
              mfma={**_CDNA3_MFMA, "bf16": ((16, 16, 32), (32, 32, 16)), "f16": ((16, 16, 32), (32, 32, 16))},
              timing=_TIMING_FIT)
GPUS = {g.name: g for g in (MI300X, MI355X)}
assert tuple(GPUS) == ARCHS


def gpu(arch: str) -> Arch:
    """The facts of `arch` (a KeyError names an arch outside ARCHS)."""
    return GPUS[arch]


# --- dtype names: the one map between torch dtypes and the short names kernels and programs use ---

DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.bool: "bool",
               torch.int32: "i32", torch.int64: "i64"}
NAMED_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
FLOAT_NAMES = {dt: DTYPE_NAMES[dt] for dt in (torch.float32, torch.bfloat16, torch.float16)}  # what MFMA kernels take


def device_arch() -> str | None:
    """The arch of the AMD GPU torch sees ("gfx942" from "gfx942:sramecc+:xnack-"), else None."""
    if not (getattr(torch.version, "hip", None) and torch.cuda.is_available()):
        return None
    return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
