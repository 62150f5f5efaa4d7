"""`python -m bench.calibration` prints every calibration point (issue 29's evidence): kernel, shape, MODEL /
measured ratio and whether it was a fitting or a validation point."""

from translator_kernels import timing
from translator_kernels.measure import calibration as cal


def test_bench_calibration_prints_every_point_with_its_role_and_ratio(capsys):
    from bench import calibration as bench_cal

    assert bench_cal.main([]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("| ") and ("| fit |" in ln or "| validation |" in ln)]
    rows = cal.evaluate(cal.load_features())
    assert len([ln for ln in lines if "| gfx942" not in ln]) >= len(rows)
    for r in rows:
        cell = f"| {r['ratio']:.2f} | {r['role']} |"
        assert any(r["shape"] in ln and cell in ln for ln in lines), (r["kernel"], r["shape"], cell)
    assert timing.CALIBRATION.split(" (bench")[0] in out


def test_bench_calibration_rereads_prices_our_mid_m_tiles_with_the_xcd_rereads(capsys):
    """`--rereads`: our chosen tiles at N = K = 4096 with the XCD re-reads the calibration validated. A decode tile
    (one row tile) barely moves; a mid-M tile whose W column blocks sit on several XCDs slows down by their bytes."""
    from bench import calibration as bench_cal
    from translator_kernels.arch import GPUS

    assert bench_cal.main(["--rereads"]) == 0
    out = capsys.readouterr().out
    assert "| arch | M | chosen tile | row tiles | re-read MB rows first / grouped |" in out
    rows = {(r["arch"], r["m"]): r for r in bench_cal.reread_table(ms=(16, 128))}
    for arch in ("gfx942", "gfx950"):
        g = GPUS[arch]
        decode, mid = rows[(arch, 16)], rows[(arch, 128)]
        assert decode["with_rereads"] <= 1.05 * decode["kernel_t"]
        assert mid["reread_bytes"] > 0 and mid["with_rereads"] >= mid["reread_bytes"] / (
            g.timing["reread_efficiency"] * g.hbm_bytes_per_s)
        assert mid["with_rereads"] > mid["kernel_t"]
        # the XCD-grouped order the kernel launches (gemm/xcd.py) reads a few W / A blocks again, not all of W
        assert mid["grouped_bytes"] < mid["reread_bytes"] / 10 and mid["grouped_t"] < 0.5 * mid["with_rereads"]


def test_printed_blog_table_matches_evaluate(capsys):
    """The device-timed table (the MI355X decode GEMMs): every priced row with kernel_t, MODEL = kernel_t + T_DEVICE,
    ratio and role as blog_gemm.evaluate() gives them, and the calibration line computed from those rows."""
    from bench.calibration import _print_blog
    from translator_kernels.measure import blog_gemm

    rows = blog_gemm.evaluate()
    _print_blog(rows=rows)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    for r in rows:
        if not r["config"]:
            continue
        cells = f"| {r['kernel_us']:.1f} | {r['model_us']:.1f} | {r['ratio']:.2f} | {r['role']} |"
        assert any(ln.startswith(f"| {r['m']} | {r['n']} | {r['k']} | {r['config']} |") and cells in ln
                   for ln in lines), cells
    assert f"calibration: {blog_gemm.device_line(rows)};" in out
