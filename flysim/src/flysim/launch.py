"""Programs (one per compiled artifact), the host function and kernel launches.

The host function of a launcher holds only arith ops, ``gpu.launch_func`` and a
return at this pipeline stage; it is interpreted with the same op table on
uniform (0-d) values. Each ``gpu.launch_func`` builds the lanes of the launch:
the block is padded to whole waves of 64, lane ``l`` is thread ``l % B`` of
workgroup ``l // B``.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

import torch

from .errors import SimulationError
from .memory import GlobalMemory, LDS
from .program import Decoder, Exec, loc_text, op, run_block
from .waves import PhaseSplit, WaveScheduler
from .types import tinfo

WAVE = 64


@dataclass
class LaunchRecord:
    """What one simulated kernel launch did."""

    kernel: str
    grid: tuple
    block: tuple
    arch: str
    counters: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    wall_s: float = 0.0
    lane_ops: int = 0

    def __repr__(self):
        c = self.counters
        return (
            f"LaunchRecord({self.kernel} grid={self.grid} block={self.block} {self.arch} "
            f"read={c.get('global_bytes_read')} written={c.get('global_bytes_written')} "
            f"mfma={dict(c.get('mfma_by_kind', {}))} warnings={len(self.warnings)} {self.wall_s:.3f}s)"
        )


class ModuleInfo:
    def __init__(self, device=None):
        self.device = device
        self.lds_globals = {}  # name -> (offset, size)
        self.lds_size = 0


class Kernel:
    def __init__(self, name, func_op, info):
        self.name = name
        d = Decoder(name, info)
        self.arg_slots, self.body = d.region(func_op.regions[0])
        self.nregs = len(d.slots)
        self.census = d.census
        self.nested_barrier = d.nested_barrier


class Program:
    def __init__(self, asm, entry, arch, device=None):
        from flydsl._mlir import ir
        from flydsl.compiler.jit_function import _create_mlir_context

        from . import ops_arith, ops_mem, ops_amd, ops_asm, ops_atomic, ops_lanes  # noqa: F401  (register ops)

        self.arch = arch
        self.info = ModuleInfo(device)
        self.kernels = {}
        with _create_mlir_context():
            module = ir.Module.parse(asm)
            host = None
            for top in module.body.operations:
                top = top.operation
                if top.name == "gpu.module":
                    mod_name = top.attributes["sym_name"].value
                    for o in top.regions[0].blocks[0].operations:
                        o = o.operation
                        if o.name == "llvm.mlir.global":
                            self._global(o)
                    for o in top.regions[0].blocks[0].operations:
                        o = o.operation
                        if o.name == "gpu.func":
                            name = o.attributes["sym_name"].value
                            self.kernels[(mod_name, name)] = Kernel(name, o, self.info)
                elif top.name == "func.func" and top.attributes["sym_name"].value == entry:
                    host = top
            if host is None:
                raise SimulationError(f"host function {entry} not found in the compiled module")
            d = Decoder(entry, self.info)
            d.program = self
            self.host_arg_types = [tinfo(str(a.type)) for a in host.regions[0].blocks[0].arguments]
            self.host_args, self.host_body = d.region(host.regions[0])
            self.host_nregs = len(d.slots)
        self.entry = entry

    def _global(self, o):
        from flydsl._mlir import ir

        gtype = ir.TypeAttr(o.attributes["global_type"]).value
        ti = tinfo(str(gtype))
        space = int(ir.IntegerAttr(o.attributes["addr_space"]).value) if "addr_space" in o.attributes else 0
        if space != 3:
            raise SimulationError(f"global {o.attributes['sym_name']} in address space {space} is not supported")
        align = int(ir.IntegerAttr(o.attributes["alignment"]).value) if "alignment" in o.attributes else 16
        off = (self.info.lds_size + align - 1) // align * align
        self.info.lds_globals[o.attributes["sym_name"].value] = (off, ti.nbytes)
        self.info.lds_size = off + ti.nbytes

    def run_host(self, raw, tensors, sim, n_args=None):
        device = sim.device or (tensors[0].device if tensors else torch.device("cpu"))
        ex = Exec(self.entry, self.host_nregs, device)
        ex.n_args = n_args  # tensors[:n_args] are the call's arguments, the rest registered memory
        ex.counting = False
        ex.sim, ex.program, ex.tensors, ex.records = sim, self, tensors, []
        for slot, ti, blob in zip(self.host_args, self.host_arg_types, raw):
            ex.R[slot] = _decode_arg(blob, ti, device)
        run_block(ex, self.host_body)
        return ex.records


def _decode_arg(blob, ti, device):
    def take(ti, pos):
        if ti.kind == "struct":
            vals = []
            for f in ti.fields:
                v, pos = take(f, pos)
                vals.append(v)
            return tuple(vals), pos
        if ti.kind == "token":
            return None, pos
        n = ti.nbytes
        fmt = {1: "<b", 2: "<h", 4: "<i", 8: "<q"}[n]
        v = struct.unpack_from(fmt, blob, pos)[0] if pos + n <= len(blob) else 0
        if ti.is_float:
            return torch.tensor(v, dtype={2: torch.int16, 4: torch.int32, 8: torch.int64}[n]).view(ti.dtype).to(device), pos + n
        return torch.tensor(v, dtype=ti.dtype, device=device), pos + n

    return take(ti, 0)[0]


DECODED = [0]  # programs decoded in this process (program_for's cache misses)


def program_for(artifact, arch, device=None):
    """The decoded program of an artifact, per arch and device (constants live on the device);
    decoded once, reused by every later launch of the same compiled kernel."""
    progs = getattr(artifact, "_flysim_programs", None)
    if progs is None:
        progs = artifact._flysim_programs = {}
    key = (arch, str(device))
    p = progs.get(key)
    if p is None:
        p = progs[key] = Program(artifact._flysim_asm, artifact._entry, arch, device)
        DECODED[0] += 1
    return p


@op("gpu.launch_func")
def _launch_func(d, o):
    from flydsl._mlir import ir

    text = str(o.attributes["kernel"])  # @kernels::@name
    mod_name, kname = [p.strip().lstrip("@") for p in text.split("::")]
    seg = list(ir.DenseI32ArrayAttr(o.attributes["operandSegmentSizes"]))
    names = ["asyncDependencies", "gridSizeX", "gridSizeY", "gridSizeZ", "blockSizeX", "blockSizeY", "blockSizeZ",
             "clusterSizeX", "clusterSizeY", "clusterSizeZ", "dynamicSharedMemorySize", "kernelOperands", "asyncObject"]
    groups, pos = {}, 0
    slots = d.ins(o)
    for n, c in zip(names, seg):
        groups[n] = slots[pos:pos + c]
        pos += c
    outs = d.outs(o)
    loc = loc_text(o.location)
    program = d.program

    def f(ex):
        R = ex.R
        grid = tuple(int(R[s[0]]) for s in (groups["gridSizeX"], groups["gridSizeY"], groups["gridSizeZ"]))
        block = tuple(int(R[s[0]]) for s in (groups["blockSizeX"], groups["blockSizeY"], groups["blockSizeZ"]))
        dyn = int(R[groups["dynamicSharedMemorySize"][0]]) if groups["dynamicSharedMemorySize"] else 0
        args = [R[s] for s in groups["kernelOperands"]]
        kernel = program.kernels[(mod_name, kname)]
        rec = launch(kernel, program, grid, block, dyn, args, ex, loc)
        ex.records.append(rec)
        for k in outs:
            R[k] = None

    return f


def launch(kernel, program, grid, block, dyn_lds, args, host, loc):
    sim = host.sim
    t0 = time.perf_counter()
    device = host.device
    bsz = block[0] * block[1] * block[2]
    bp = (bsz + WAVE - 1) // WAVE * WAVE
    nwg = grid[0] * grid[1] * grid[2]
    N = nwg * bp
    if N == 0:
        return LaunchRecord(kernel.name, grid, block, program.arch)
    shape = dict(grid=grid, block=block, nwg=nwg, bsz=bsz, bp=bp)
    # a kernel with a barrier under control flow may need the split run: keep what it may overwrite
    saved = _snapshot(host.tensors) if kernel.nested_barrier else None

    def fresh():
        return (GlobalMemory(host.tensors, device, strict=sim.strict_oob, n_args=getattr(host, "n_args", None)),
                LDS(nwg, program.info.lds_size + dyn_lds, device, check_races=sim.check_races, waves_per_wg=bp // WAVE,
                    check_waits=getattr(sim, "check_waits", False)))

    mem, lds = fresh()
    lane = torch.arange(N, device=device)
    ex = _exec(kernel, program, sim, device, lane, shape, mem, lds, args)
    exs = [ex]
    try:
        run_block(ex, kernel.body)
    except PhaseSplit:
        _restore(saved)
        mem, lds = fresh()
        nslots = bp // WAVE
        sched = WaveScheduler(nslots, nwg, lds, device)
        lanes = lane.view(nwg, nslots, WAVE)
        exs = [_exec(kernel, program, sim, device, lanes[:, j].reshape(-1), shape, mem, lds, args, ex.regions is not None)
               for j in range(nslots)]
        for j, e in enumerate(exs):
            e.sched, e.slot, e.bp = sched, j, WAVE
        sched.run([lambda e=e: run_block(e, kernel.body) for e in exs])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mfma, ops, regions = {}, {}, None
    for e in exs:
        for k, v in e.mfma.items():
            mfma[k] = mfma.get(k, 0) + v
        for k, v in e.ops.items():
            ops[k] = ops.get(k, 0) + v
        if e.regions is not None:
            regions = regions or {}
            for k, v in e.regions.items():
                regions[k] = [a + b for a, b in zip(regions.get(k, [0] * len(v)), v)]
    warnings = [w for e in exs for w in e.warnings]
    c = {
        "global_bytes_read": mem.bytes_read,
        "global_bytes_written": mem.bytes_written,
        "lds_bytes_read": lds.bytes_read,
        "lds_bytes_written": lds.bytes_written,
        "lds_bank_conflicts": lds.bank_conflicts,
        "mfma_by_kind": mfma,
        "ops_by_kind": ops,
        "oob_buffer_accesses": sum(e.oob_buffer for e in exs),
        "oob_lds_accesses": lds.oob,
        "wave_split": len(exs) > 1,
        "warnings": warnings + lds.warnings + mem.warnings,
    }
    if regions is not None:
        c["region_waves"] = {k: dict(zip(("then", "else") if k.endswith("scf.if") else ("iterations",), v))
                             for k, v in regions.items()}
    return LaunchRecord(kernel.name, grid, block, program.arch, c, c["warnings"], time.perf_counter() - t0,
                        sum(e.lane_ops for e in exs))


def _exec(kernel, program, sim, device, lane, shape, mem, lds, args, count_regions=None):
    """The state of the lanes ``lane`` (global lane ids) of one launch."""
    grid, block, bp, bsz = shape["grid"], shape["block"], shape["bp"], shape["bsz"]
    ex = Exec(kernel.name, kernel.nregs, device)
    ex.counting = True
    ex.arch = program.arch
    ex.N, ex.nwg, ex.bsz, ex.bp, ex.grid, ex.block = lane.numel(), shape["nwg"], bsz, bp, grid, block
    ex.sim = sim
    ex.sched = None
    t = lane % bp
    wg = lane // bp
    ex.wg = wg
    ex.t = t
    ex.lane_in_wave = lane % WAVE
    ex.wave = lane // WAVE  # global wave id
    ex.tid = (t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1]))
    ex.bid = (wg % grid[0], (wg // grid[0]) % grid[1], wg // (grid[0] * grid[1]))
    ex.base_mask = (t < bsz) if bp != bsz else None
    ex.mask = ex.base_mask
    ex.mem = mem
    ex.lds = lds
    ex.lds_globals = program.info.lds_globals
    ex.mfma = {}
    ex.warnings = []
    ex.oob_buffer = 0
    if count_regions is None:
        count_regions = getattr(sim, "count_regions", False)
    ex.regions = {} if count_regions else None
    for slot, v in zip(kernel.arg_slots, args):
        ex.R[slot] = v
    return ex


def _snapshot(tensors):
    """Copies of the argument storages' bytes (one per storage), to undo a lockstep attempt."""
    out, seen = [], set()
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            continue
        seen.add(st.data_ptr())
        u8 = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
        out.append((u8, u8.clone()))
    return out


def _restore(saved):
    if saved is None:
        raise SimulationError("internal: a barrier split a workgroup in a kernel that was not prepared for it")
    for u8, copy in saved:
        u8.copy_(copy)
