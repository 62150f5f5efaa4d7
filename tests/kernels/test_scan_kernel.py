"""translator_kernels.codegen.scan against eager torch scans computed in fp32, on the session's
executor (flysim, or rocm on an AMD GPU: tests/executors.py).

Tolerances: the dtype table, fp32 relaxed to atol=rtol=1e-5 (the kernel combines lanes, waves
and tiles in a tree, torch scans sequentially; logaddexp is a 1-ulp exp / log sequence); for
cumsum atol is scaled by the largest partial sum (a result near zero after large partial sums
carries their rounding)."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tolerance
from translator_kernels.program import DTYPES, Program
from translator_kernels.codegen.scan import scan

TOL = {dt: op_tolerance(dt, "scan") for dt in (torch.float32, torch.bfloat16, torch.float16)}
IDENT = {"cumsum": 0.0, "cumprod": 1.0, "logcumsumexp": float("-inf")}


def ident(dt):
    return Program(1, (), ((0, DTYPES[dt]),)).text()


def eager(y, kind, dim, reverse, exclusive):
    """fp32 torch reference of the scan of fp32 value `y`."""
    if reverse:
        y = y.flip(dim)
    if exclusive:
        y = torch.cat([torch.full_like(y.narrow(dim, 0, 1), IDENT[kind]), y.narrow(dim, 0, y.shape[dim] - 1)], dim)
    r = getattr(torch, kind)(y, dim)
    return r.flip(dim) if reverse else r


def sample(shape, kind, dt):
    x = torch.randn(shape)
    if kind == "cumprod":
        x = 1 + 0.02 * x  # products stay O(1) over long rows
    return x.to(dt)


def run_case(shape, dim, kind, dt, reverse=False, exclusive=False, arch="gfx942"):
    x = sample(shape, kind, dt)
    with executors.current().run(arch) as ex:
        got = scan([ex.put(x)], ident(dt), kind, dim, reverse, exclusive).cpu()
    assert ex.launches, "the scan kernel did not launch"
    want = eager(x.float(), kind, dim % len(shape), reverse, exclusive)
    atol, rtol = TOL[dt]
    if kind == "cumsum":  # a long sum's rounding scales with its partial sums, not with the result
        atol = atol * max(1.0, float(want.abs().max()))
    assert got.dtype == dt and got.shape == x.shape
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)


# (shape, dim): sub-wave lane groups, one wave, LDS across waves, carried tiles, partial tiles,
# odd rows (VEC=1), a scan along dim 0 of a 3-d tensor
CASES = [((5, 7), -1), ((3, 64), -1), ((2, 1000), -1), ((2, 8192), -1), ((2, 40000), -1), ((3, 257), -1),
         ((6, 5, 9), 0), ((1,), 0)]


@pytest.mark.parametrize("shape,dim", CASES)
def test_cumsum_fp32(shape, dim):
    run_case(shape, dim, "cumsum", torch.float32)


@pytest.mark.parametrize("kind", ["cumsum", "cumprod", "logcumsumexp"])
@pytest.mark.parametrize("reverse,exclusive", [(False, False), (True, False), (False, True), (True, True)])
def test_kinds_forms(kind, reverse, exclusive):
    run_case((3, 300), -1, kind, torch.float32, reverse, exclusive)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["cumsum", "logcumsumexp"])
def test_low_precision_accumulates_fp32(dt, kind):
    run_case((4, 2000), -1, kind, dt)


def test_gfx950():
    run_case((2, 5000), 1, "cumsum", torch.float32, reverse=True, arch="gfx950")


def test_masked_cumsum_prologue():
    x, mask = torch.randn(4, 3, 130), torch.rand(4, 1, 130) > 0.5  # mask broadcast over dim 1
    prog = Program(2, (("mul", (0, 1), ()),), ((2, "f32"),)).text()
    with executors.current().run("gfx942") as ex:
        got = scan([ex.put(x), ex.put(mask)], prog, "cumsum", -1).cpu()
    torch.testing.assert_close(got, torch.cumsum(x * mask, -1), atol=TOL[torch.float32][0],
                               rtol=TOL[torch.float32][1])


def test_special_values():
    x = torch.tensor([[0.0, float("-inf"), 1.0, float("nan"), 2.0], [float("-inf")] * 4 + [3.0]])
    with executors.current().run("gfx942") as ex:
        got = scan([ex.put(x)], ident(torch.float32), "logcumsumexp", -1).cpu()
        s = scan([ex.put(x[:, :3])], ident(torch.float32), "cumsum", -1).cpu()
    torch.testing.assert_close(got, torch.logcumsumexp(x, -1), equal_nan=True)
    torch.testing.assert_close(s, torch.cumsum(x[:, :3], -1), equal_nan=True)


def test_emit_sources_writes_scan_with_a_passing_check(tmp_path, without_translator):
    """--emit-kernels' source writer includes scan kernels, with a check script that passes on flysim."""
    import json
    import subprocess
    import sys

    from translator_kernels.codegen.emit import emit_sources
    from translator_kernels.codegen.emit import record_kernels

    x = torch.randn(3, 40)
    prog = Program(1, (("mul", (0, 0), ()),), ((1, "f32"),)).text()  # cumsum(x * x, -1), reversed
    with executors.current().run("gfx942") as ex, record_kernels() as used:
        scan([ex.put(x)], prog, "cumsum", -1, reverse=True)
    assert len(used) == 1
    emit_sources(tmp_path, names=used)
    (entry,) = json.loads((tmp_path / "index.json").read_text())
    assert entry["family"] == "scan" and entry["reverse"] is True
    proc = subprocess.run([sys.executable, str(tmp_path / entry["check"])], capture_output=True, text=True,
                          cwd=str(tmp_path), env=without_translator)
    want = "ok on flysim" if executors.current().name == "flysim" else "ok on GPU"  # the script says where it ran
    assert proc.returncode == 0 and want in proc.stdout, proc.stderr[-2000:]


def test_empty_and_errors():
    with executors.current().run("gfx942") as ex:
        assert scan([ex.put(torch.randn(0, 5))], ident(torch.float32), "cumsum", -1).shape == (0, 5)
        with pytest.raises(ValueError, match="int64"):
            scan([ex.put(torch.arange(5))], ident(torch.float32), "cumsum", 0)
        with pytest.raises(ValueError, match="unknown scan kind"):
            scan([ex.put(torch.randn(5))], ident(torch.float32), "cummax", 0)
        with pytest.raises(ValueError, match="longer than one workgroup"):
            scan([ex.put(torch.randn(1, 1024 * 32 + 1))], ident(torch.float32), "cumsum", -1)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 31, 63, 64, 65, 255, 256, 1023, 1024, 4096, 4097, 65536, 131072])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["cumsum", "cumprod", "logcumsumexp"])
def test_sweep(n, dt, kind):
    run_case((3, n), -1, kind, dt, reverse=n % 2 == 1, exclusive=n % 3 == 0)
