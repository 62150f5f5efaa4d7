"""ISA statistics of compiled kernels, without a GPU: the one place that compiles and parses.

`compile_isa(entry, args, arch=...)` calls a kernel-library entry point ("module:function",
e.g. "translator_kernels.rows.softmax:softmax") in a child process with COMPILE_ONLY=1 and
FLYDSL_DUMP_IR=1 — FlyDSL reads those switches from the process environment, so they cannot
be flipped inside the caller — and parses every `22_final_isa.s` the call dumped. Tensor
arguments travel as `TensorSpec`s (shape, dtype, strides) and become zero tensors on CPU in
the child: under COMPILE_ONLY the launch compiles and returns without touching them.
`compile_many` runs several such calls in one child (one Python + torch + FlyDSL start-up);
the dump directory is per call since FlyDSL reads FLYDSL_DUMP_DIR at each compile.
The child's ROCM_PATH (FlyDSL links the code object with its llvm/bin/ld.lld) comes from
flysim.toolchain, the project's one ld.lld finder. It is imported only when a compile starts,
so the kernel library imports without flysim; without it a compile raises IsaCompileError
naming the fix.

Parsed per kernel (`parse_isa` -> `IsaStats`): the metadata (.vgpr_count, .agpr_count,
.sgpr_count, spills, .group_segment_fixed_size = LDS bytes, workgroup size), the static
instruction mix by class, vector-memory access widths, and every mnemonic's count. Static
counts: each instruction once, whatever the loop trip counts.

Occupancy (`occupancy`) is a MODEL of CDNA3/CDNA4 wave slots per SIMD (4 SIMDs per CU):
  (the numbers below are translator_kernels.arch.GPUS's)
  - at most 8 waves per SIMD;
  - VGPRs: a 512-entry unified VGPR+AGPR file per lane; a wave holds `.vgpr_count` (which on
    gfx90a+ already counts AGPRs) rounded up to 8;
  - SGPRs: 800 per SIMD, `.sgpr_count` rounded up to 16;
  - LDS: 64 KiB per CU on gfx942, 160 KiB on gfx950, `.group_segment_fixed_size` per workgroup;
  - a workgroup of W waves places ceil(W / 4) waves on each SIMD, so registers and LDS are
    granted a whole workgroup at a time.

Memo (tests): with FLYDSL_TRANSLATOR_ISA_MEMO naming a folder, a job's dumped ISA texts and return are
kept there, keyed by (arch, entry, args, kwargs, the child's environment but its dump folder and pytest's
per-test variables), and a later equal job reads them instead of starting a child. The child is a function
of those and of the source tree alone, so within one test session (tests/conftest.py makes a fresh folder
per session, shared by its pytest-xdist workers) a hit returns what a compile would. Off when unset.

    python -m translator_kernels.isa <jobs.pkl> <results.json>   (the child; not for people)
"""

from __future__ import annotations

import collections
import glob
import hashlib
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from translator_kernels.arch import ARCHS, GPUS, NAMED_DTYPES
from translator_kernels.errors import KernelInputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LDS_PER_CU = {a: g.lds_bytes for a, g in GPUS.items()}  # views of the one table (translator_kernels.arch)
MAX_WAVES = GPUS["gfx942"].max_waves
_META = {"vgpr": "vgpr_count", "agpr": "agpr_count", "sgpr": "sgpr_count", "vgpr_spill": "vgpr_spill_count",
         "sgpr_spill": "sgpr_spill_count", "lds": "group_segment_fixed_size", "block": "max_flat_workgroup_size"}
_WIDTH = {"ubyte": 8, "sbyte": 8, "byte": 8, "ushort": 16, "sshort": 16, "short": 16, "dword": 32, "dwordx2": 64,
          "dwordx3": 96, "dwordx4": 128, "b32": 32, "b64": 64, "b96": 96, "b128": 128, "b16": 16, "u8": 8,
          "u16": 16, "i8": 8, "i16": 16}


class IsaCompileError(RuntimeError):
    """A compile in the child failed; `error_type` is the child's exception class name."""

    def __init__(self, message: str, error_type: str = "RuntimeError"):
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument by shape, dtype and strides (None: contiguous); zeros in the child."""
    shape: tuple
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    stride: tuple | None = None

    @classmethod
    def of(cls, t) -> "TensorSpec":
        st = tuple(int(s) for s in t.stride())
        contiguous = t.is_contiguous()
        return cls(tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""), None if contiguous else st)

    def materialize(self):
        import torch

        dt = getattr(torch, self.dtype)
        if self.stride is None:
            return torch.zeros(self.shape, dtype=dt)
        extent = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride) if s > 0)
        return torch.zeros(max(extent, 1), dtype=dt).as_strided(self.shape, self.stride)


@dataclass
class IsaStats:
    kernel: str
    meta: dict
    mix: dict = field(default_factory=dict)  # class -> static count
    vmem_loads: dict = field(default_factory=dict)  # width in bits ("lds" for loads to LDS) -> count
    vmem_stores: dict = field(default_factory=dict)
    arch: str = "gfx942"
    config: str = ""
    ops: dict = field(default_factory=dict)  # mnemonic -> static count

    @property
    def spills(self) -> int:
        return self.meta.get("vgpr_spill", 0) + self.meta.get("sgpr_spill", 0)

    @property
    def occupancy(self) -> tuple[int, str]:
        return occupancy(self.meta["vgpr"], self.meta["sgpr"], self.meta["lds"], self.meta.get("block") or 256,
                         self.arch)

    @property
    def instructions(self) -> int:
        return sum(self.mix.values())

    def mnemonics(self, prefix: str) -> list[str]:
        return sorted(m for m in self.ops if m.startswith(prefix))

    def summary(self) -> dict:
        """A flat, JSON-friendly row: what a report prints for this kernel."""
        w, lim = self.occupancy
        m = self.mix
        return {"kernel": self.kernel, "arch": self.arch, "VGPR": self.meta["vgpr"], "AGPR": self.meta["agpr"],
                "SGPR": self.meta["sgpr"], "spills (v/s)": f"{self.meta['vgpr_spill']}/{self.meta['sgpr_spill']}",
                "LDS B": self.meta["lds"], "threads": self.meta.get("block", 0), "waves/SIMD": w, "limit": lim,
                "instructions": self.instructions, "MFMA": m.get("MFMA", 0), "VALU": m.get("VALU", 0),
                "SALU": m.get("SALU", 0), "VMEM loads": fmt_widths(self.vmem_loads),
                "VMEM stores": fmt_widths(self.vmem_stores),
                "LDS r/w": f"{m.get('LDS_read', 0)}/{m.get('LDS_write', 0)}", "barriers": m.get("barrier", 0)}

    def to_dict(self) -> dict:
        return asdict(self)


# ---- occupancy model and instruction classes ----------------------------------------------------
def occupancy(vgpr: int, sgpr: int, lds: int, block: int, arch: str) -> tuple[int, str]:
    """(waves per SIMD, the limiting resource) under the model in the module docstring."""
    per_simd = -(-max(1, -(-block // 64)) // 4)  # waves a workgroup puts on each SIMD
    g = GPUS[arch]
    limits = {"waves": g.max_waves,
              "VGPR": g.vgpr_file // (-(-max(vgpr, 1) // 8) * 8),
              "SGPR": g.sgpr_file // (-(-max(sgpr, 1) // 16) * 16)}
    if lds:
        limits["LDS"] = (g.lds_bytes // lds) * per_simd
    limits = {k: (v // per_simd) * per_simd for k, v in limits.items()}  # whole workgroups only
    name = min(limits, key=lambda k: (limits[k], k != "waves"))
    return limits[name], name


def width(mnemonic: str) -> int:
    """Access width in bits from a memory mnemonic's suffix (buffer_load_dwordx4 -> 128); 0 if none."""
    for part in reversed(mnemonic.split("_")):
        if part in _WIDTH:
            return _WIDTH[part]
    return 0


def classify(mnemonic: str) -> str:
    m = mnemonic
    if m.startswith(("v_mfma", "v_smfmac")):
        return "MFMA"
    if m.startswith(("global_load", "buffer_load", "flat_load")):
        return "vmem_load"
    if m.startswith(("global_store", "buffer_store", "flat_store", "global_atomic", "buffer_atomic")):
        return "vmem_store"
    if m.startswith(("ds_read", "ds_load")):
        return "LDS_read"
    if m.startswith(("ds_write", "ds_store")):
        return "LDS_write"
    if m.startswith("ds_"):
        return "LDS_other"  # swizzle / bpermute / atomics: the LDS crossbar, no LDS storage for swizzle
    if m.startswith("s_waitcnt"):
        return "wait"
    if m == "s_barrier":
        return "barrier"
    if m.startswith(("s_load", "s_buffer_load")):
        return "SMEM"
    if m.startswith("v_"):
        return "VALU"
    if m.startswith("s_"):
        return "SALU"
    return "other"


def fmt_widths(c: dict) -> str:
    return " ".join(f"{n}x{w}" for w, n in sorted(c.items(), key=lambda kv: str(kv[0]))) or "0"


# ---- parsing -------------------------------------------------------------------------------------
def parse_isa(text: str, arch: str = "gfx942") -> list[IsaStats]:
    """One IsaStats per kernel in an ISA file (metadata from the amdhsa.kernels block)."""
    names = re.findall(r"^\s+\.name:\s+(\S+)", text, re.M)
    blocks = re.split(r"^\s+- \.agpr_count:", text, flags=re.M)[1:] or [text]
    out = []
    for i, name in enumerate(names or ["kernel"]):
        blk = ".agpr_count:" + blocks[i] if i < len(blocks) else text
        meta = {}
        for key, field_ in _META.items():
            m = re.search(rf"\.{field_}:\s+(\d+)", blk)
            meta[key] = int(m.group(1)) if m else 0
        ops, loads, stores = collections.Counter(), collections.Counter(), collections.Counter()
        for mn, rest in re.findall(r"^\s+([a-z][a-z0-9_]*)\b(.*)$", _body(text, name), re.M):
            ops[mn] += 1
            c = classify(mn)
            if c == "vmem_load":  # a load into LDS: "_lds" in the name or the "lds" modifier
                loads["lds" if "lds" in mn or re.search(r"\blds\b", rest) else width(mn)] += 1
            elif c == "vmem_store":
                stores[width(mn)] += 1
        mix = collections.Counter()
        for mn, n in ops.items():
            mix[classify(mn)] += n
        out.append(IsaStats(name, meta, dict(mix), dict(loads), dict(stores), arch, ops=dict(ops)))
    return out


def _body(text: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:\s*$(.*?)^\s*s_endpgm", text, re.M | re.S)
    return m.group(1) + "\ts_endpgm\n" if m else text


def main_kernel(kernels: list[IsaStats]) -> IsaStats:
    """A launcher may compile helpers; the main kernel is the one with the most instructions."""
    return max(kernels, key=lambda s: s.instructions)


# ---- compiling in a child process ----------------------------------------------------------------
def _toolchain_env(arch: str) -> dict:
    """ROCM_PATH (a folder whose llvm/bin holds an ld.lld) and the GPU-less compile switches.

    flysim.toolchain is the one ld.lld finder; it is imported here, when a compile needs it,
    so the kernel library imports without flysim."""
    try:
        from flysim import toolchain
    except ImportError as e:
        raise IsaCompileError(f"ISA statistics need flysim's ld.lld finder, and flysim is not importable ({e}). "
                              "Fix: pip install -e ./flysim (distribution flydsl-flysim)", "ToolchainMissing") from e
    try:
        return toolchain.compile_env(arch)
    except toolchain.ToolchainError as e:
        raise IsaCompileError(str(e), "ToolchainError") from e


def compile_env(arch: str, dump_dir: str) -> dict:
    """The environment of a GPU-less compile for `arch` that dumps its IR and ISA into `dump_dir`."""
    if arch not in ARCHS:
        raise KernelInputError(f"arch {arch!r} is not supported; choose one of {', '.join(ARCHS)}")
    env = dict(os.environ, **_toolchain_env(arch), FLYDSL_DUMP_IR="1", FLYDSL_DUMP_DIR=dump_dir,
               FLYDSL_RUNTIME_ENABLE_CACHE="0",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return env


MEMO_ENV = "FLYDSL_TRANSLATOR_ISA_MEMO"


def memo_key(job, arch: str, env: dict) -> str | None:
    """The memo file of a job compiled for `arch` in the child environment `env`; None when the memo is
    off or the job has no stable text (an argument whose repr is an address)."""
    folder = os.environ.get(MEMO_ENV)
    if not folder:
        return None
    stable = {k: v for k, v in env.items() if k != "FLYDSL_DUMP_DIR" and not k.startswith("PYTEST_")}
    text = repr((arch, job, sorted(stable.items())))
    if " at 0x" in text:
        return None
    return os.path.join(folder, hashlib.sha256(text.encode()).hexdigest() + ".json")


def memo_read(path: str | None):
    """(ISA texts, result) a memo file holds, or None."""
    if path is None or not os.path.exists(path):
        return None
    with open(path) as f:
        d = json.load(f)
    return d["texts"], d["result"]


def memo_write(path: str | None, texts: list, result) -> None:
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"texts": texts, "result": result}, f)
    os.replace(tmp, path)  # whole or absent: another worker may read it at once


@dataclass
class Compiled:
    """What one call compiled: its kernels (in dump order), the entry point's JSON-able return and the ISA text
    of each dumped code object (what kernels were parsed from; the hot-loop model reads it)."""
    kernels: list
    result: object = None
    texts: list = field(default_factory=list)

    @property
    def main(self) -> IsaStats:
        return main_kernel(self.kernels)


def compile_many(jobs: list, arch: str, *, timeout: float = 600) -> list:
    """Run each job (entry, args, kwargs) in one child; per job a Compiled or an IsaCompileError.

    A job whose launcher the child already built (a cached, equal specialization) dumps nothing;
    it is run again in a fresh child, so every job gets its own ISA."""
    results: list = [None] * len(jobs)
    env = compile_env(arch, "")
    memo = [memo_key(job, arch, env) for job in jobs]
    todo = []
    for i in range(len(jobs)):
        hit = memo_read(memo[i])
        if hit is None:
            todo.append(i)
        else:
            results[i] = Compiled([s for t in hit[0] for s in parse_isa(t, arch)], hit[1], hit[0])
    while todo:
        retry = []
        with tempfile.TemporaryDirectory(prefix="flydsl-isa-") as d:
            spec, out = os.path.join(d, "jobs.pkl"), os.path.join(d, "results.json")
            with open(spec, "wb") as f:
                pickle.dump({"jobs": [jobs[i] for i in todo], "root": d}, f)
            try:
                p = subprocess.run([sys.executable, "-m", "translator_kernels.isa", spec, out],
                                   env=compile_env(arch, d), capture_output=True, text=True, cwd=ROOT,
                                   timeout=timeout)
                log = (p.stderr + p.stdout)[-3000:]
            except subprocess.TimeoutExpired:
                p, log = None, f"timed out after {timeout:.0f} s"
            done = json.load(open(out)) if os.path.exists(out) else []
            for pos, i in enumerate(todo):
                r = done[pos] if pos < len(done) else None
                if r is None:
                    results[i] = IsaCompileError(f"the ISA compile child died ({arch}): {log}", "ChildError")
                elif r.get("error"):
                    results[i] = IsaCompileError(r["error"], r["error_type"])
                else:
                    files = sorted(glob.glob(os.path.join(r["dir"], "*", "22_final_isa.s")))
                    if not files:
                        if pos == 0:  # the first job of a fresh child cannot hit a cache
                            results[i] = IsaCompileError(f"{jobs[i][0]} compiled no kernel ({arch})", "NoKernel")
                        else:
                            retry.append(i)
                        continue
                    texts = [open(fn).read() for fn in files]
                    memo_write(memo[i], texts, r.get("result"))
                    results[i] = Compiled([s for t in texts for s in parse_isa(t, arch)], r.get("result"), texts)
        todo = retry
    return results


def compile_isa(entry: str, args=(), kwargs=None, *, arch: str = "gfx942", timeout: float = 600) -> Compiled:
    """Compile what `entry(*args, **kwargs)` launches, for `arch`; raise IsaCompileError on failure."""
    (r,) = compile_many([(entry, tuple(args), dict(kwargs or {}))], arch, timeout=timeout)
    if isinstance(r, Exception):
        raise r
    return r


# ---- reading a compile: what the ISA tests and benchmarks read ------------------------------------
def tensor_specs(shapes, dtypes) -> list[TensorSpec]:
    """Zero-input specs for kernel-program dtype names (f32 / bf16 / f16, or torch names)."""
    return [TensorSpec(tuple(s), str(NAMED_DTYPES[dt]).removeprefix("torch.") if dt in NAMED_DTYPES else dt)
            for s, dt in zip(shapes, dtypes)]


def summary_row(compiled: Compiled) -> dict:
    """The main kernel's metadata (vgpr, agpr, sgpr, vgpr_spill, sgpr_spill, lds, block), its buffer
    load / store mnemonics and occupancy."""
    s = compiled.main
    return dict(s.meta, loads=s.mnemonics("buffer_load"), stores=s.mnemonics("buffer_store"),
                waves_per_simd=s.occupancy[0])


def _load(entry: str):
    mod, _, attr = entry.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _materialize(v):
    if isinstance(v, TensorSpec):
        return v.materialize()
    if isinstance(v, (list, tuple)):
        return type(v)(_materialize(x) for x in v)
    if isinstance(v, dict):
        return {k: _materialize(x) for k, x in v.items()}
    return v


def _child(spec_path: str, out_path: str) -> None:
    spec = pickle.load(open(spec_path, "rb"))
    results = []
    for i, (entry, args, kwargs) in enumerate(spec["jobs"]):
        d = os.path.join(spec["root"], f"job{i}")
        os.environ["FLYDSL_DUMP_DIR"] = d  # read by FlyDSL at each compile
        r = {"dir": d}
        try:
            ret = _load(entry)(*_materialize(args), **_materialize(kwargs))
            try:
                r["result"] = json.loads(json.dumps(ret)) if isinstance(ret, dict) else None
            except TypeError:
                r["result"] = None
        except BaseException as e:  # noqa: BLE001 - a failed job is reported, the others still run
            if isinstance(e, KeyboardInterrupt):
                raise
            r.update(error=f"{entry}: {type(e).__name__}: {e}", error_type=type(e).__name__)
        results.append(r)
        with open(out_path, "w") as f:  # written after each job: a crash later keeps what finished
            json.dump(results, f)


if __name__ == "__main__":
    from translator_kernels.isa import _child as child  # the module the pickled TensorSpecs name

    child(sys.argv[1], sys.argv[2])
