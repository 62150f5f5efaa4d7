"""llvm.inline_asm: a tiny interpreter for the AMDGPU instructions kernels inline.

Kernels (FlyDSL's own included) inline a handful of instructions that MLIR does
not express: packed bf16 conversion, gfx950 transpose reads with an immediate
offset, compare + select pairs, a barrier under a scalar branch, and empty
"anchor" statements that only pin values. The asm text is parsed once at decode
time into steps over operand slots ``$k`` (outputs first, then inputs, as in
LLVM's constraint string; a tied input such as ``0`` seeds output 0). A VCC /
SGPR-pair result is a per-lane bool (the wave's mask); handed back as i64 it
becomes the wave's ballot. Anything else raises UnsupportedOpError with the
instruction text.
"""

from __future__ import annotations

import re

import torch

from .errors import UnsupportedOpError
from .ops_mem import _first_active, transpose_read
from .program import op
from .types import tinfo
from .waves import arrive

_NOP = ("s_nop", "s_waitcnt", "s_setprio", "s_sleep", "buffer_wbl2", "buffer_inv")


def _bf16_bits(x):
    return x.to(torch.float32).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF


def _i32(x):
    """A 32-bit register value as int32 bits (floats reinterpreted)."""
    if x.dtype == torch.bool:
        return x.to(torch.int32)
    if x.dtype.is_floating_point:
        return x.to(torch.float32).view(torch.int32)
    return x.to(torch.int32)


def _ballot(ex, b):
    """Per-lane bool -> the wave's 64-bit mask, broadcast to every lane of the wave."""
    bw = b.expand(ex.N).reshape(-1, 64).to(torch.int64)
    if ex.mask is not None:
        bw = bw & ex.mask.reshape(-1, 64).to(torch.int64)
    w = (bw << torch.arange(64, device=bw.device)).sum(1)  # wraps to two's complement for bit 63
    return w.repeat_interleave(64)


def _coerce(ex, v, ti):
    """A register value -> the MLIR result type ``ti`` (bit-exact)."""
    if v.dtype == torch.bool:
        v = _ballot(ex, v) if ti.nbytes == 8 else v.to(torch.int32)
    if ti.kind == "scalar":
        if v.dtype == ti.dtype:
            return v
        return v.view(ti.dtype) if v.element_size() == ti.nbytes else v.to(ti.dtype)
    lane = v.shape[:1] if v.dim() and v.numel() * v.element_size() != ti.nbytes else ()
    flat = v.reshape(*lane, -1).contiguous()
    return flat.view(ti.dtype).reshape(*lane, *ti.vshape)


def _operand(tok):
    tok = tok.strip()
    if tok.startswith("$"):
        return ("reg", int(tok[1:]))
    return ("imm", int(tok, 0))


def _val(ex, env, opd):
    return env[opd[1]] if opd[0] == "reg" else torch.tensor(opd[1], dtype=torch.int32, device=ex.device)


def _step(ins, loc_name):
    """One instruction line -> f(ex, env) or ("label", name) / ("branch", cond, target)."""
    m = re.match(r"([a-z0-9_]+)\s*(.*)", ins)
    mn, rest = m.group(1), m.group(2)
    vm = re.search(r"vmcnt\((\d+)\)", rest)
    lgkm = re.search(r"lgkmcnt\((\d+)\)", rest)
    if mn == "s_waitcnt" and (vm or lgkm):
        def f(ex, env):
            if vm:
                ex.lds.vm_wait(ex, int(vm.group(1)))
            if lgkm:
                ex.lds.lgkm_wait(ex, int(lgkm.group(1)))
        return f
    if mn.startswith(_NOP):
        return None
    if mn in ("s_cbranch_scc0", "s_cbranch_scc1"):
        return ("branch", mn.endswith("1"), rest.strip())
    offset = 0
    mo = re.search(r"\boffset:(\d+)", rest)
    if mo:
        offset = int(mo.group(1))
        rest = rest[: mo.start()]
    args = [_operand(t) for t in rest.split(",") if t.strip()]
    if mn == "v_cvt_pk_bf16_f32":
        d, a, b = args

        def f(ex, env):
            packed = (_bf16_bits(_val(ex, env, a)) | (_bf16_bits(_val(ex, env, b)) << 16)).to(torch.int64)
            env[d[1]] = torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)
        return f
    if mn in ("ds_read_b64_tr_b16", "ds_read_b64_tr_b8", "ds_read_b64_tr_b4"):
        d, a = args
        w = int(mn.rsplit("_b", 1)[1])

        def f(ex, env):
            addr = _val(ex, env, a).to(torch.int64) + offset
            raw = ex.lds.load(ex, addr, 1, 8, f.loc).view(torch.uint8)
            env[d[1]] = transpose_read(raw, w).view(torch.int32)
        return f
    if mn in ("ds_read_b64", "ds_read_b128", "ds_read_b32"):
        d, a = args
        nb = int(mn.rsplit("_b", 1)[1]) // 8

        def f(ex, env):
            addr = _val(ex, env, a).to(torch.int64) + offset
            env[d[1]] = ex.lds.load(ex, addr, 4, nb // 4, f.loc).view(torch.int32)
        return f
    cmp = re.fullmatch(r"v_cmp_(lt|le|gt|ge|eq|ne)_([iu])32(?:_e64|_e32)?", mn)
    if cmp:
        d, a, b = args
        fn = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}[cmp.group(1)]
        uns = cmp.group(2) == "u"

        def f(ex, env):
            x, y = _i32(_val(ex, env, a)).to(torch.int64), _i32(_val(ex, env, b)).to(torch.int64)
            if uns:
                x, y = x & 0xFFFFFFFF, y & 0xFFFFFFFF
            env[d[1]] = fn(x, y)
        return f
    if mn in ("v_cndmask_b32_e64", "v_cndmask_b32"):
        d, a, b, c = args

        def f(ex, env):  # dst = cond ? src1 : src0
            env[d[1]] = torch.where(_val(ex, env, c), _i32(_val(ex, env, b)), _i32(_val(ex, env, a)))
        return f
    if mn == "s_cmp_eq_u32" or mn == "s_cmp_lg_u32":
        a, b = args
        eq = mn == "s_cmp_eq_u32"

        def f(ex, env):
            x = _i32(_val(ex, env, a)).to(torch.int64) & 0xFFFFFFFF
            y = _i32(_val(ex, env, b)).to(torch.int64) & 0xFFFFFFFF
            env["scc"] = (x == y) if eq else (x != y)
        return f
    if mn == "s_barrier":
        def f(ex, env):
            ex.lds.lgkm_fence(ex, False)
            arrive(ex, "s_barrier")
        f.barrier = True
        return f
    raise UnsupportedOpError(f"flysim does not implement instruction '{ins}' in inline asm")


def _program(text):
    lines = [ln.strip() for ln in text.replace("\\0A", "\n").replace("\\09", " ").replace(";", "\n").split("\n")]
    prog = []
    for ln in lines:
        if not ln or ln.startswith("//"):
            continue
        lab = re.fullmatch(r"(\w+):", ln)
        if lab:
            prog.append(("label", lab.group(1)))
            continue
        s = _step(ln, "")
        if s is not None:
            prog.append(s)
    return prog


@op("llvm.inline_asm")
def _inline_asm(d, o):
    from flydsl._mlir import ir

    text = ir.StringAttr(o.attributes["asm_string"]).value
    cons = [c.strip() for c in ir.StringAttr(o.attributes["constraints"]).value.split(",") if c.strip()]
    cons = [c for c in cons if not c.startswith("~")]
    outs_c = [c for c in cons if c.startswith("=")]
    ins_c = [c for c in cons if not c.startswith("=")]
    nout = len(outs_c)
    ins = d.ins(o)
    outs = d.outs(o)
    prog = _program(text)
    if any(getattr(s, "barrier", False) for s in prog) and (d.depth > 1 or any(isinstance(s, tuple) and s[0] == "branch" for s in prog)):
        d.nested_barrier = True
    rt = tinfo(str(o.results[0].type)) if len(o.results) else None
    out_types = (rt.fields if rt.kind == "struct" else (rt,)) if rt is not None else ()
    is_struct = rt is not None and rt.kind == "struct"
    loc = None

    def f(ex):
        env = {}
        for k, (c, slot) in enumerate(zip(ins_c, ins)):
            env[nout + k] = ex.R[slot]
            if c.isdigit():
                env[int(c)] = ex.R[slot]
        pc = 0
        while pc < len(prog):
            s = prog[pc]
            pc += 1
            if isinstance(s, tuple):
                if s[0] == "branch":
                    scc = env["scc"]
                    take = scc if s[1] else ~scc
                    take = _first_active(ex, take.expand(ex.N)) if take.dim() else take.expand(ex.N)
                    if bool(take.all()) or not bool(take.any()):
                        if bool(take.any()):
                            pc = _find_label(prog, s[2], pc)
                    else:  # per-wave divergent scalar branch: run the fall-through under a mask
                        m = ex.mask
                        ex.mask = ~take if m is None else (m & ~take)
                        end = _find_label(prog, s[2], pc)
                        for t in prog[pc:end]:
                            if not isinstance(t, tuple):
                                t.loc = f.loc
                                t(ex, env)
                        ex.mask = m
                        pc = end
                continue
            s.loc = f.loc
            s(ex, env)
        vals = [env.get(k) for k in range(nout)]
        conv = [_coerce(ex, v, t) for v, t in zip(vals, out_types)]
        if outs and conv:
            ex.R[outs[0]] = tuple(conv) if is_struct else conv[0]

    return f


def _find_label(prog, target, pc):
    name = target.rstrip("fb")
    for k in range(pc, len(prog)):
        if prog[k] == ("label", name):
            return k + 1
    raise UnsupportedOpError(f"inline asm branch target {target} not found")
