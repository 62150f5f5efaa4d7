"""Generated fused reduction kernels (translator_kernels.codegen.reduce) against eager, on the
session's executor (flysim, or rocm on an AMD GPU: tests/executors.py).

References are eager torch on fp32 copies; each case asserts the FlyDSL kernel launched once.
fp32 tolerance: atol 1e-5, rtol 1e-5 instead of 1.3e-6: the kernel sums in a tree (per lane,
then butterfly, then across waves), torch sums in its own order; N-term sums differ by a few
ulp of the magnitudes summed, and exp / log / sqrt are 1-ulp sequences.
"""

import math

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.program import DTYPES, Program
from translator_kernels.codegen.reduce import build_reduce, fused_reduce

TOL = {dt: op_tol(dt, "fused_reduce") for dt in (torch.float32, torch.bfloat16, torch.float16)}


def ident(dtype):
    return Program(1, (), ((0, DTYPES[dtype]),)).text()


def run(inputs, program, kind, dims, keepdim=False, params=(), arch="gfx942"):
    with executors.current().run(arch) as ex:
        outs = fused_reduce([ex.put(t) for t in inputs], program, kind, dims, keepdim, params)
    assert len(ex.launches) == 1, "the FlyDSL kernel did not run"
    return type(outs)(o.cpu() for o in outs)


def close(got, ref, dtype, what):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if ref.dtype == torch.int64:
        assert got.dtype == torch.int64 and torch.equal(got, ref), f"{what}: {got} vs {ref}"
        return
    assert got.dtype == dtype, (what, got.dtype)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype], msg=lambda m: f"{what}: {m}")


REF = {
    "sum": lambda x, d, k, p: x.sum(d, keepdim=k), "mean": lambda x, d, k, p: x.mean(d, keepdim=k),
    "amax": lambda x, d, k, p: x.amax(d, keepdim=k), "amin": lambda x, d, k, p: x.amin(d, keepdim=k),
    "var": lambda x, d, k, p: x.var(d, correction=p[0], keepdim=k),
    "std": lambda x, d, k, p: x.std(d, correction=p[0], keepdim=k),
    "logsumexp": lambda x, d, k, p: torch.logsumexp(x, d, keepdim=k),
    "argmax": lambda x, d, k, p: x.argmax(d[0], keepdim=k), "argmin": lambda x, d, k, p: x.argmin(d[0], keepdim=k),
    "max": lambda x, d, k, p: x.max(d[0], keepdim=k), "min": lambda x, d, k, p: x.min(d[0], keepdim=k),
    "norm": lambda x, d, k, p: torch.linalg.vector_norm(x, p[0], d, keepdim=k),
}
CASES = [("sum", ()), ("mean", ()), ("amax", ()), ("amin", ()), ("var", (1,)), ("std", (0,)), ("logsumexp", ()),
         ("argmax", ()), ("argmin", ()), ("max", ()), ("min", ()), ("norm", (2.0,)), ("norm", (1.0,)),
         ("norm", (math.inf,)), ("norm", (3.0,)), ("norm", (0.0,))]


def check_kind(kind, params, x, dims, keepdim, dtype, arch="gfx942"):
    outs = run([x], ident(dtype), kind, dims, keepdim, params, arch)
    ref = REF[kind](x.float(), dims, keepdim, params)
    if kind in ("max", "min"):
        refs = [ref.values.to(dtype), ref.indices]
    else:
        refs = [ref if ref.dtype == torch.int64 else ref.to(dtype)]
    for o, r in zip(outs, refs):
        close(o, r, dtype, f"{kind}{params} {tuple(x.shape)} dims={dims} {dtype}")


@pytest.mark.parametrize("kind,params", CASES)
def test_last_dim_kinds_short_rows(kind, params):
    """Short rows (several rows per wave), an odd N (VEC 1, masked tile), fp32."""
    x = torch.randn(7, 37, generator=torch.Generator().manual_seed(0))
    check_kind(kind, params, x, [-1], False, torch.float32)


@pytest.mark.parametrize("kind,params,dtype,shape", [
    ("sum", (), torch.bfloat16, (3, 2048)), ("var", (1,), torch.float32, (2, 3000)),
    ("logsumexp", (), torch.float16, (2, 1544)), ("argmax", (), torch.float32, (2, 5000)),
    ("max", (), torch.bfloat16, (3, 1032)), ("norm", (2.0,), torch.float16, (2, 4096)),
])
def test_long_rows_cross_wave(kind, params, dtype, shape):
    """Rows over several waves: butterfly inside waves, LDS across them; 128-bit loads."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    check_kind(kind, params, x, [-1], True, dtype, arch="gfx950")


@pytest.mark.parametrize("kind,dims", [("sum", [0]), ("mean", [0, 2]), ("amax", [1]), ("var", [0, 1, 2]),
                                       ("argmin", [1]), ("logsumexp", [0, 2]), ("max", [0])])
def test_other_and_several_dims(kind, dims):
    """Dims moved last on the host: any dim or set of dims, keepdim on and off."""
    x = torch.randn(4, 6, 10, generator=torch.Generator().manual_seed(2))
    params = (1,) if kind == "var" else ()
    for keepdim in (False, True):
        check_kind(kind, params, x, dims, keepdim, torch.float32)


def test_nan_and_inf_semantics():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    x[0, 5] = float("nan")
    x[1, :] = float("-inf")
    x[2, 3] = x[2, 9] = 7.0  # tie: first index wins
    x[3, 2] = float("inf")
    for kind in ("argmax", "argmin", "amax", "logsumexp", "max"):
        outs = run([x], ident(torch.float32), kind, [-1])
        ref = REF[kind](x, [-1], False, ())
        refs = [ref.values, ref.indices] if kind == "max" else [ref]
        for o, r in zip(outs, refs):
            if r.dtype == torch.int64:
                assert torch.equal(o, r), (kind, o, r)
            else:
                torch.testing.assert_close(o, r, equal_nan=True, **TOL[torch.float32])


def test_fused_prologue_with_col_and_row_operands():
    """sum(exp(x - m) * w) over the last dim: m is per row ("col"), w per column ("row")."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(6, 40, generator=g), torch.rand(40, generator=g)
    m = x.amax(-1, keepdim=True)
    prog = Program(3, (("sub", (0, 1), ()), ("exp", (3,), ()), ("mul", (4, 2), ())), ((5, "f32"),))
    (out,) = run([x, m, w], prog.text(), "sum", [-1])
    close(out, (torch.exp(x - m) * w).sum(-1), torch.float32, "sum(exp(x - m) * w)")
    # the same over dim 0 of a [40, 6] problem: roles swap, the answer must not change
    (out0,) = run([x.t().contiguous(), m.t(), w[:, None]], prog.text(), "sum", [0])
    close(out0, (torch.exp(x - m) * w).sum(-1), torch.float32, "over dim 0")


def test_bf16_prologue_mean_of_squares():
    """mean(x * x) of bf16 x stored as bf16: fp32 math inside, one rounding at the end."""
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    prog = Program(1, (("mul", (0, 0), ()),), ((1, "bf16"),))
    (out,) = run([x], prog.text(), "mean", [-1], True)
    close(out, (x.float() * x.float()).mean(-1, keepdim=True).to(torch.bfloat16), torch.bfloat16, "mean(x*x)")


def test_cache_and_errors():
    x = torch.randn(3, 8)
    before = build_reduce.cache_info()
    run([x], ident(torch.float32), "sum", [-1])
    run([torch.randn(3, 8)], ident(torch.float32), "sum", [-1])
    after = build_reduce.cache_info()
    # built at most once, asked at most twice: the call on first sight and the one that records the
    # per-call replay (translator_kernels.replay); a replayed plan asks nothing
    assert after.misses - before.misses <= 1 and (after.hits + after.misses) - (before.hits + before.misses) <= 2
    with pytest.raises(ValueError, match="unknown reduction kind"):
        fused_reduce([x], ident(torch.float32), "median", [-1], False)
    with pytest.raises(ValueError, match="int64.*not supported"):
        fused_reduce([x.long()], ident(torch.float32), "sum", [-1], False)
    with pytest.raises(ValueError, match="longer than a workgroup"):
        fused_reduce([torch.zeros(1, 70000)], ident(torch.float32), "var", [-1], False, (1,))
    with pytest.raises(ValueError, match="cannot be cut"):
        fused_reduce([torch.zeros(1, 65537)], ident(torch.float32), "sum", [-1], False)  # a prime


@pytest.mark.parametrize("kind,params", [("sum", ()), ("mean", ()), ("amax", ()), ("logsumexp", ()),
                                         ("norm", (2.0,)), ("norm", (0.0,))])
def test_two_stage_long_rows(kind, params):
    """Rows over 65536 elements: K chunks per row to fp32 partials, then one pass over the partials
    (two launches); here mean((x - c)^2)-style prologues over 2 x 72000 bf16 with a per-row c."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 72000, generator=g).to(torch.bfloat16)
    c = torch.randn(2, 1, generator=g)
    prog = Program(2, (("sub", (0, 1), ()),), ((2, "bf16"),))
    with executors.current().run("gfx942") as ex:
        (out,) = fused_reduce([ex.put(x), ex.put(c)], prog.text(), kind, [-1], False, params)
    assert len(ex.launches) == 2
    out = out.cpu()
    ref = REF[kind](x.float() - c, [-1], False, params).to(torch.bfloat16)
    close(out, ref, torch.bfloat16, f"two-stage {kind}{params}")


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_isa_no_spills(arch, compiled_isa):
    from translator_kernels.isa import summary_row as row
    from translator_kernels.isa import tensor_specs

    prog = Program(2, (("sub", (0, 1), ()), ("exp", (2,), ())), ((3, "bf16"),)).text()
    cases = {"sum": (64, 4096), "argmax": (64, 4096), "var": (256, 96)}
    jobs = {kind: ("translator_kernels.codegen.reduce:fused_reduce",  # the call bench.isa_reduce.isa_stats makes
                   (tensor_specs([shape, (shape[0], 1)], ["bf16", "f32"]), prog, kind, [1], False,
                    (1,) if kind == "var" else ()), {}) for kind, shape in cases.items()}
    for kind, shape in cases.items():
        s = row(compiled_isa(jobs, kind, arch))  # the three compile in one child
        assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0, (kind, s)
        if shape[1] % 8 == 0:
            assert "buffer_load_dwordx4" in s["loads"], (kind, s)


def test_emit_sources_with_checks(tmp_path, without_translator):
    """emit_sources writes the exact compiled sources plus check scripts that pass on flysim."""
    import json
    import subprocess
    import sys

    from translator_kernels.codegen.elementwise import fused_elementwise
    from translator_kernels.codegen.emit import emit_sources

    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(4, 24, generator=g), torch.rand(24, generator=g)
    ew = Program(2, (("mul", (0, 1), ()), ("silu", (2,), ())), ((3, "f32"),)).text()
    red = Program(2, (("mul", (0, 1), ()), ("mul", (2, 2), ())), ((3, "f32"),)).text()
    epi = Program(2, (("add", (0, 1), ()), ("rsqrt", (2,), ())), ((3, "f32"),)).text()  # rsqrt(mean + eps[row])
    with executors.current().run("gfx942") as ex:
        fused_elementwise([ex.put(x), ex.put(w)], ew)
        fused_reduce([ex.put(x), ex.put(w)], red, "mean", [-1], True, (), [ex.put(torch.full((4, 1), 1e-5))], epi)
    paths = emit_sources(tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    mine = [e for e in index if e.get("program") in (ew, red) and e["shapes"] == [[4, 24], [24]]]
    assert {e["family"] for e in mine} == {"elementwise", "reduce"}, index
    for e in mine:
        src = (tmp_path / e["kernel"]).read_text()
        assert "@flyc.kernel" in src and "def launch" in src
        proc = subprocess.run([sys.executable, str(tmp_path / e["check"])], capture_output=True, text=True,
                              cwd=str(tmp_path), env=without_translator)
        want = "ok on flysim" if executors.current().name == "flysim" else "ok on GPU"  # where the script ran
        assert proc.returncode == 0 and want in proc.stdout, proc.stderr[-2000:]
    assert all(p.exists() for p in paths)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 127, 255, 256, 257, 1000, 1023, 2049, 4097, 9999, 20000, 65536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_length_sweep_slow(n, dtype):
    """Every kind over row lengths that exercise each plan: 1..32 lanes per row, whole workgroups of
    64..1024 lanes, VEC 1..8, partial last tiles. Arg results compare the values at the indices
    (rounding to bf16 / fp16 makes real ties)."""
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n)).to(dtype)
    for kind, params in CASES:
        outs = run([x], ident(dtype), kind, [-1], False, params)
        ref = REF[kind](x.float(), [-1], False, params)
        refs = [ref.values.to(dtype), ref.indices] if kind in ("max", "min") else \
            [ref if ref.dtype == torch.int64 else ref.to(dtype)]
        for o, r in zip(outs, refs):
            if r.dtype == torch.int64:
                assert torch.equal(x.float().gather(1, o[:, None]), x.float().gather(1, r[:, None])), (kind, o, r)
            else:  # sums of n terms in another order: atol grows like sqrt(n) ulps
                tol = TOL[dtype]
                torch.testing.assert_close(o.float(), r.float(), atol=max(tol["atol"], 1e-4 * math.sqrt(n)),
                                           rtol=tol["rtol"], equal_nan=True, msg=lambda m: f"{kind}{params}: {m}")


@pytest.mark.parametrize("n", [40, 72000])
def test_epilogue_per_row(n):
    """log(sum(exp(x - m))) + m with the log and add as the epilogue (m a per-row input), in one
    launch, and for 72000-long rows in the second stage of two."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, n, generator=g)
    m = x.amax(-1)
    prog = Program(2, (("sub", (0, 1), ()), ("exp", (2,), ())), ((3, "f32"),))
    epi = Program(2, (("log", (0,), ()), ("add", (2, 1), ())), ((3, "bf16"),))
    with executors.current().run("gfx950") as ex:
        (out,) = fused_reduce([ex.put(x), ex.put(m[:, None])], prog.text(), "sum", [-1], False, (), [ex.put(m)],
                              epi.text())
    assert len(ex.launches) == (1 if n < 65536 else 2)
    out = out.cpu()
    close(out, torch.logsumexp(x, -1).to(torch.bfloat16), torch.bfloat16, f"epilogue n={n}")
