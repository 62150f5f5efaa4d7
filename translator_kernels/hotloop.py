"""A hot-loop MODEL (not a measurement): matrix, vector and LDS cycles per loop iteration.

The model lives in the kernel library (the kernel tests and the GEMM / attention benchmarks read
it); bench/hotloop.py prints it:

    python -m bench.hotloop FILE.s [--arch gfx942] [--kernel NAME]      any dumped ISA
    python -m bench.hotloop --attention [--arch gfx950] [--dtype bf16] [--d 128]

The roofline (bench/roofline.py) has no vector or LDS term, so it predicts peak for a kernel
whose inner loop is bound by VALU work. This model reads the compiled ISA of a kernel, finds
its hot loop and prices one iteration of it, per wave, on the issuing SIMD:

Finding the loop. The kernel body is cut at its labels (`.LBB0_3:`) into basic blocks. A
branch (`s_branch`, `s_cbranch_*`) to a label at or before itself is a back edge; the
instructions from that label to its last back edge are the loop body (every block laid out in between,
so an `if` inside the loop counts both of its sides: a static count, an upper bound where a
branch is skipped at run time). Of all loops, the hot one has the most matrix cycles, then the
fewest instructions: nested loops are separate candidates, so the innermost MFMA loop wins.

Pricing an instruction (cycles one wave occupies its SIMD's unit; CDNA3 / CDNA4):
  * MFMA: flops / (peak matrix flops per CU per clock / 4 SIMDs). Peak per CU per clock from
    the vendor's dense peaks at boost clock: MI300X (gfx942, 304 CUs, 2.1 GHz) 1307 TFLOPS
    bf16/f16 -> 2048, 163.4 TFLOPS fp32 matrix -> 256, 2615 TFLOPS fp8 -> 4096; MI355X
    (gfx950, 256 CUs, 2.4 GHz) 2517 TFLOPS bf16/f16 -> 4096, 157.3 fp32 -> 256, fp8 -> 8192.
    On gfx950 the CDNA3-shaped bf16/f16 MFMAs (16x16x16, 32x32x8: half the K of the CDNA4
    ones) run at half that rate (AMD's CDNA4 ISA guide lists them at the CDNA3 pass count).
    So v_mfma_f32_16x16x16_bf16 = 16 cycles on both archs, v_mfma_f32_32x32x8_bf16 = 32, and
    gfx950's v_mfma_f32_16x16x32_bf16 = 16, v_mfma_f32_32x32x16_bf16 = 32.
  * VALU: a wave64 instruction takes 4 cycles (16 lanes per clock); transcendentals
    (v_exp, v_log, v_rcp, v_rsq, v_sqrt, v_sin, v_cos) are quarter rate: 16 cycles (CDNA3 ISA
    guide, "Transcendental instructions"). Packed v_pk_* fp32 ops are one instruction: 4 cycles
    for two values. Checked for gfx950 as well (nothing found that differs from gfx942):
    LLVM's scheduling model (llvm/lib/Target/AMDGPU/SISchedule.td) gives WriteTrans32 4 passes
    ("these are quarter rate") in SICommonWriteRes, which both SIDPGFX940FullSpeedModel and
    SIDPGFX950FullSpeedModel take unchanged, and WriteFloatFMA 1 in both; packed fp32 at full
    rate is what the vendors' vector fp32 peaks need (MI300X 163.4, MI355X 157.3 TFLOPS = 256
    flops per CU per clock = 4 SIMDs x 16 lanes x 2 (fma) x 2 (packed)); gfx950's instruction
    list (llvm/docs/AMDGPU/AMDGPUAsmGFX950.rst) has v_exp_f32, v_exp_f16 and v_exp_legacy_f32,
    no packed exp. The same model makes the CDNA3-shaped 16x16x16 bf16 MFMA half rate on gfx950
    (4 passes, as 16x16x32), which the MFMA line above states.
  * LDS: bytes moved / (bytes per clock per CU / 4 SIMDs), i.e. the SIMD's share of the
    CU's LDS port when all four SIMDs run the same loop: 128 B/clk/CU (CDNA3 white paper);
    gfx950 reads at 256 B/clk (CDNA4 doubled the LDS read bandwidth along with its capacity,
    64 -> 160 KB), its writes and cross-lane ops taken at 128. ds_read_b128 of 64 lanes = 1 KiB =
    32 cycles (16 on gfx950); ds_bpermute / ds_swizzle / DPP-free cross-lane ops count their 4 bytes a lane.
  * global / buffer memory, SALU, waits and branches are counted, not priced: latency hiding
    across waves is what the occupancy model speaks to.
Matrix and vector work issue from different waves concurrently, so an iteration costs at least
max(matrix, vector, LDS) cycles; `bound` names the largest.

Every block counts (a static upper bound), and beside it the steady path: the body up to the
earliest back edge that has already issued every MFMA of the body. It is shorter where a
conditional back edge skips a tail without matrix work, such as an online-softmax rescale that
runs only when a row max grows; `skipped` lists what the steady path leaves out, so a reader
can check that it is the rare part.

This ignores dependency stalls, issue limits (one instruction per wave per clock) and the
MFMA->VALU read-after-write latency.

The GEMM K loop and the attention KV loop both go through `hot_loop(isa_text, arch)`.
`compile_isa_texts(entry, args, arch)` compiles any kernel-library call without a GPU (through
translator_kernels.isa's child) and returns the raw ISA, which this model needs and the
metadata parser does not keep.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from translator_kernels.arch import GPUS
from translator_kernels.isa import ROOT, classify, compile_env, compile_many, memo_key, memo_read, memo_write

# dense matrix flops per CU per clock, by arch and MFMA input type
MATRIX_RATE = {a: g.matrix_flops_per_clk for a, g in GPUS.items()}  # views of translator_kernels.arch.GPUS
SIMDS = GPUS["gfx942"].simds
VALU_CYCLES, TRANS_CYCLES = 4, 16
LDS_BYTES_PER_CLK = GPUS["gfx942"].lds_write_bytes_per_clk  # both archs
LDS_READ_BYTES_PER_CLK = {a: g.lds_read_bytes_per_clk for a, g in GPUS.items()}
_TRANS = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")
_MFMA_RE = re.compile(r"v_(?:mfma|smfmac)_(?:scale_)?[a-z0-9]+_(\d+)x(\d+)x(\d+)_?([a-z0-9_]*)")
_LABEL_RE = re.compile(r"^(\.?L[A-Za-z0-9_$.]+):")
_BRANCH_RE = re.compile(r"^\s+(s_branch|s_cbranch_\w+)\s+(\S+)")
_INSTR_RE = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*)$")


def _mfma_type(suffix: str) -> str:
    s = suffix.replace("_1k", "")
    for key, name in (("bf16", "bf16"), ("f16", "f16"), ("xf32", "xf32"), ("f32", "f32"), ("f64", "f64"),
                      ("i8", "i8"), ("fp8", "fp8"), ("bf8", "fp8"), ("f8f6f4", "fp8")):
        if key in s:
            return name
    return "bf16"


def mfma_cycles(mnemonic: str, arch: str) -> int:
    """Cycles one MFMA occupies its SIMD's matrix core (see the module docstring)."""
    m = _MFMA_RE.match(mnemonic)
    if not m:
        return 16
    M, N, K, suffix = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    typ = _mfma_type(suffix)
    rate = MATRIX_RATE[arch][typ] / SIMDS
    if arch == "gfx950" and (typ in ("bf16", "f16") and (M, K) in ((16, 16), (32, 8))
                             or typ == "fp8" and (M, K) in ((16, 32), (32, 16))):
        rate /= 2  # CDNA3-shaped bf16/f16/fp8 MFMA on CDNA4: half the CDNA4 rate
    # f8f6f4 (gfx950) with fp8 / bf8 operands runs at the fp8 rate; its fp6 / fp4 forms (cbsz / blgp,
    # not in the mnemonic) run faster: priced as fp8, an upper bound for them
    if mnemonic.startswith("v_smfmac"):
        K *= 2  # sparse: the instruction's K is the dense equivalent over half the operand
    return max(4, round(2 * M * N * K / rate))


def _lds_bytes(mnemonic: str, rest: str) -> int:
    if mnemonic.startswith(("ds_bpermute", "ds_permute", "ds_swizzle")):
        return 64 * 4
    from translator_kernels.isa import width

    if mnemonic.startswith("ds_read2") or mnemonic.startswith("ds_write2") or mnemonic.startswith(("ds_load_2", "ds_store_2")):
        return 64 * 2 * width(mnemonic) // 8
    w = width(mnemonic) or 32
    if "_tr" in mnemonic:  # transpose reads: ds_read_tr16_b64 / ds_read_b64_tr_b16 move 64 bits a lane
        w = max(int(b) for b in re.findall(r"b(\d+)", mnemonic))
    return 64 * w // 8


@dataclass
class Loop:
    """One loop of a kernel: where it is and what one iteration issues."""
    header: str
    start: int  # line index of the header label
    end: int  # line index of the back-edge branch
    ops: dict = field(default_factory=dict)  # mnemonic -> count in the body
    blocks: int = 1
    early: list = field(default_factory=list)  # the body up to each earlier back edge (Loop each)

    def cycles(self, arch: str) -> dict:
        mat = vec = lds = 0
        n = {"MFMA": 0, "VALU": 0, "trans": 0, "LDS": 0, "vmem": 0, "SALU": 0, "other": 0}
        lds_bytes = 0
        for mn, (cnt, rest_bytes) in self.ops.items():
            c = classify(mn)
            if c == "MFMA":
                mat += cnt * mfma_cycles(mn, arch)
                n["MFMA"] += cnt
            elif c == "VALU":
                if mn.startswith(_TRANS):
                    vec += cnt * TRANS_CYCLES
                    n["trans"] += cnt
                else:
                    vec += cnt * VALU_CYCLES
                n["VALU"] += cnt
            elif c in ("LDS_read", "LDS_write", "LDS_other"):
                lds_bytes += rest_bytes
                lds += rest_bytes / (LDS_READ_BYTES_PER_CLK[arch] if c == "LDS_read" else LDS_BYTES_PER_CLK)
                n["LDS"] += cnt
            elif c in ("vmem_load", "vmem_store"):
                n["vmem"] += cnt
            elif c in ("SALU", "wait", "barrier", "SMEM"):
                n["SALU"] += cnt
            else:
                n["other"] += cnt
        lds = round(lds * SIMDS)
        bound = max((("matrix", mat), ("vector", vec), ("LDS", lds)), key=lambda kv: kv[1])[0]
        return dict(matrix_cycles=mat, vector_cycles=vec, lds_cycles=lds, lds_bytes=lds_bytes, bound=bound,
                    matrix_over_vector=(mat / vec) if vec else float("inf"), counts=n, blocks=self.blocks)


def _kernel_lines(text: str, kernel: str | None) -> list[str]:
    names = re.findall(r"^([A-Za-z_][\w.$]*):\s*(?:;.*)?$", text, re.M)
    names = [n for n in names if not n.startswith(".")]
    if kernel is None:
        kernel = names[0] if names else None
    if kernel is None:
        return text.splitlines()
    m = re.search(rf"^{re.escape(kernel)}:.*?$(.*?)^\s*s_endpgm", text, re.M | re.S)
    if not m:
        raise ValueError(f"kernel {kernel!r} not found in the ISA (kernels: {', '.join(names) or 'none'})")
    return m.group(1).splitlines()


def _count(lines: list[str]) -> tuple[dict, int]:
    """mnemonic -> (count, LDS bytes) over `lines`, and the number of basic blocks they span."""
    ops, blocks = {}, 1
    for body in lines:
        if _LABEL_RE.match(body):
            blocks += 1
            continue
        im = _INSTR_RE.match(body.split(";")[0])
        if not im:
            continue
        mn, rest = im.group(1), im.group(2)
        cnt, nbytes = ops.get(mn, (0, 0))
        lb = _lds_bytes(mn, rest) if classify(mn).startswith("LDS") else 0
        ops[mn] = (cnt + 1, nbytes + lb)
    return ops, blocks


def find_loops(text: str, kernel: str | None = None) -> list[Loop]:
    """Every loop (back edge) of one kernel's ISA, body instructions counted per mnemonic."""
    lines = _kernel_lines(text, kernel)
    labels = {}
    for i, ln in enumerate(lines):
        m = _LABEL_RE.match(ln)
        if m:
            labels[m.group(1)] = i
    # a header with several back edges (a `continue`-like branch that skips part of the body,
    # e.g. a prefetch guarded by "is there a next tile") is one loop up to its last back edge
    edges = {}
    for i, ln in enumerate(lines):
        m = _BRANCH_RE.match(ln)
        if m and m.group(2) in labels and labels[m.group(2)] <= i:
            edges.setdefault(m.group(2), []).append(i)
    loops = []
    for header, ends in edges.items():
        start = labels[header]
        ops, blocks = _count(lines[start + 1:ends[-1] + 1])
        early = [Loop(header, start, e, *_count(lines[start + 1:e + 1])) for e in ends[:-1]]
        loops.append(Loop(header, start, ends[-1], ops, blocks, early))
    return loops


def hot_loop(text: str, arch: str = "gfx942", kernel: str | None = None) -> dict:
    """The hot loop's MODEL cycles per iteration (see the module docstring); raises if no loop.

    The result prices every block of the body (a static upper bound). Its "steady" entry prices
    the shortest way around the loop that still issues all of the body's MFMAs: the body up to
    the earliest back edge whose stretch holds every MFMA (the whole body when there is none).
    It differs where a conditional back edge skips a tail with no matrix work, such as a rescale
    that only runs when a row max grows; which of the two the kernel runs is the kernel's to say."""
    loops = find_loops(text, kernel)
    if not loops:
        raise ValueError("no loop (no backward branch) in the kernel's ISA")
    priced = [(lp, lp.cycles(arch)) for lp in loops]
    lp, c = max(priced, key=lambda pc: (pc[1]["matrix_cycles"], -sum(v[0] for v in pc[0].ops.values())))
    c["header"] = lp.header
    c["ops"] = {mn: v[0] for mn, v in sorted(lp.ops.items())}
    steady, st = lp, c
    for e in lp.early:
        ec = e.cycles(arch)
        if ec["counts"]["MFMA"] == c["counts"]["MFMA"]:
            steady, st = e, dict(ec, header=lp.header, ops={mn: v[0] for mn, v in sorted(e.ops.items())})
            break
    c["steady"] = st
    c["skipped"] = {mn: n - st["ops"].get(mn, 0) for mn, n in c["ops"].items() if n > st["ops"].get(mn, 0)}
    return c


# ---- compiling without a GPU, keeping the ISA text -----------------------------------------------
def compile_isa_texts(entry: str, args=(), kwargs=None, *, arch: str = "gfx942", timeout: float = 600) -> list[str]:
    """ISA text of every kernel `entry(*args, **kwargs)` compiles for `arch` (child process, or the
    test session's memo: translator_kernels.isa.memo_key)."""
    job = (entry, tuple(args), dict(kwargs or {}))
    memo = memo_key(job, arch, compile_env(arch, ""))
    hit = memo_read(memo)
    if hit is not None:
        return hit[0]
    with tempfile.TemporaryDirectory(prefix="flydsl-hotloop-") as d:
        spec, out = os.path.join(d, "jobs.pkl"), os.path.join(d, "results.json")
        with open(spec, "wb") as f:
            pickle.dump({"jobs": [job], "root": d}, f)
        p = subprocess.run([sys.executable, "-m", "translator_kernels.isa", spec, out], env=compile_env(arch, d),
                           capture_output=True, text=True, cwd=ROOT, timeout=timeout)
        done = json.load(open(out)) if os.path.exists(out) else []
        if not done or done[0].get("error"):
            msg = done[0]["error"] if done else (p.stderr + p.stdout)[-3000:]
            raise RuntimeError(f"compile of {entry} for {arch} failed: {msg}")
        files = sorted(glob.glob(os.path.join(done[0]["dir"], "*", "22_final_isa.s")))
        texts = [open(fn).read() for fn in files]
        memo_write(memo, texts, done[0].get("result"))
        return texts


def compile_isa_texts_many(jobs: list, arch: str = "gfx942", *, timeout: float = 600) -> list[list[str]]:
    """compile_isa_texts of each job (entry, args, kwargs), all in one child (isa.compile_many: one Python +
    torch + FlyDSL start for the lot); the first failed job raises as compile_isa_texts does."""
    out = []
    for (entry, *_), c in zip(jobs, compile_many(jobs, arch, timeout=timeout)):
        if isinstance(c, Exception):
            raise RuntimeError(f"compile of {entry} for {arch} failed: {c}") from c
        out.append(c.texts)
    return out


def main_text(texts: list[str]) -> str:
    """The largest kernel of a compile (a launcher may also compile small helpers)."""
    return max(texts, key=lambda t: t.count("\n"))
