"""ISA statistics of one compiled kernel: metadata, occupancy, static instruction mix.

Compiling needs no GPU: `compile_stats(impl, family, dtype, shape, arch)` runs `bench._isa_child`
in a subprocess with COMPILE_ONLY=1 and FLYDSL_DUMP_IR=1 (FlyDSL reads these switches from the
process environment) and parses every `22_final_isa.s` it dumped (`parse_isa`).

Occupancy (`occupancy`) is a MODEL of CDNA3/CDNA4 wave slots, per SIMD (4 SIMDs per CU):
  - at most 8 waves per SIMD;
  - VGPRs: a 512-entry unified VGPR+AGPR file per lane; a wave holds `.vgpr_count` (which on
    gfx90a+ already counts AGPRs) rounded up to 8;
  - SGPRs: 800 per SIMD, `.sgpr_count` rounded up to 16;
  - LDS: 64 KiB per CU on gfx942, 160 KiB on gfx950, `.group_segment_fixed_size` per workgroup;
  - a workgroup of W waves places ceil(W / 4) waves on each SIMD, so registers and LDS are
    granted a whole workgroup at a time.
The instruction mix counts mnemonics in the ISA text: static counts (each instruction once,
whatever the loop trip counts), not executed instructions.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

LDS_PER_CU = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
MAX_WAVES = 8
_META = {"vgpr": "vgpr_count", "agpr": "agpr_count", "sgpr": "sgpr_count", "vgpr_spill": "vgpr_spill_count",
         "sgpr_spill": "sgpr_spill_count", "lds": "group_segment_fixed_size", "block": "max_flat_workgroup_size"}
_WIDTH = {"ubyte": 8, "sbyte": 8, "byte": 8, "ushort": 16, "sshort": 16, "short": 16, "dword": 32, "dwordx2": 64,
          "dwordx3": 96, "dwordx4": 128, "b32": 32, "b64": 64, "b96": 96, "b128": 128, "b16": 16, "u8": 8,
          "u16": 16, "i8": 8, "i16": 16}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class IsaStats:
    kernel: str
    meta: dict
    mix: dict = field(default_factory=dict)  # class -> static count
    vmem_loads: dict = field(default_factory=dict)  # width in bits -> count
    vmem_stores: dict = field(default_factory=dict)
    arch: str = "gfx942"
    config: str = ""

    @property
    def spills(self) -> int:
        return self.meta.get("vgpr_spill", 0) + self.meta.get("sgpr_spill", 0)

    @property
    def occupancy(self) -> tuple[int, str]:
        return occupancy(self.meta["vgpr"], self.meta["sgpr"], self.meta["lds"], self.meta.get("block", 256), self.arch)


def occupancy(vgpr: int, sgpr: int, lds: int, block: int, arch: str) -> tuple[int, str]:
    """(waves per SIMD, the limiting resource) under the model in the module docstring."""
    per_simd = -(-max(1, -(-block // 64)) // 4)  # waves a workgroup puts on each SIMD
    limits = {"waves": MAX_WAVES,
              "VGPR": 512 // (-(-max(vgpr, 1) // 8) * 8),
              "SGPR": 800 // (-(-max(sgpr, 1) // 16) * 16)}
    if lds:
        limits["LDS"] = (LDS_PER_CU[arch] // lds) * per_simd
    # whole workgroups only
    limits = {k: (v // per_simd) * per_simd for k, v in limits.items()}
    name = min(limits, key=lambda k: (limits[k], k != "waves"))
    return limits[name], name


def _width(mnemonic: str) -> int:
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
        body = _body(text, name)
        mix, loads, stores = collections.Counter(), collections.Counter(), collections.Counter()
        for mn in re.findall(r"^\s+([a-z][a-z0-9_]*)\b", body, re.M):
            if mn.startswith("."):
                continue
            c = classify(mn)
            mix[c] += 1
            if c == "vmem_load":
                loads[_width(mn) if "lds" not in mn else "lds"] += 1
            elif c == "vmem_store":
                stores[_width(mn)] += 1
        out.append(IsaStats(name, meta, dict(mix), dict(loads), dict(stores), arch))
    return out


def _body(text: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:\s*$(.*?)^\s*s_endpgm", text, re.M | re.S)
    return m.group(1) + "\ts_endpgm\n" if m else text


def compile_env(arch: str, dump_dir: str) -> dict:
    env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DUMP_IR="1",
               FLYDSL_DUMP_DIR=dump_dir, FLYDSL_RUNTIME_ENABLE_CACHE="0", PYTHONPATH=ROOT)
    env.setdefault("ROCM_PATH", os.path.join(ROOT, ".toolchain", "rocm"))
    return env


def compile_stats(impl: str, family: str, dtype: str, shape, arch: str) -> IsaStats:
    """Compile one kernel in a subprocess and return the statistics of its (main) kernel."""
    spec = dict(impl=impl, family=family, dtype=dtype, shape=list(shape))
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([sys.executable, "-m", "bench._isa_child", json.dumps(spec)], env=compile_env(arch, d),
                           capture_output=True, text=True, cwd=ROOT)
        files = sorted(glob.glob(os.path.join(d, "*", "22_final_isa.s")))
        if "NOKERNEL:" in p.stderr + p.stdout:
            raise LookupError((p.stderr + p.stdout).split("NOKERNEL:")[1].strip().splitlines()[0])
        if p.returncode or not files:
            raise RuntimeError(f"{impl} {family} {dtype} {shape} {arch}: compile failed\n{p.stderr[-2000:]}")
        kernels = [s for f in files for s in parse_isa(open(f).read(), arch)]
    config = ""
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            config = json.loads(line).get("config", "")
    # a launcher may compile helpers; the main kernel is the one with the most instructions
    main = max(kernels, key=lambda s: sum(s.mix.values()))
    main.config = config or f"{main.meta['block']} threads"
    return main


def fmt_widths(c: dict) -> str:
    return " ".join(f"{n}x{w}" for w, n in sorted(c.items(), key=lambda kv: str(kv[0]))) or "0"
