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
