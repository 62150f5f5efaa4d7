"""The calibration data itself (translator_kernels.measure.calibration): every measured row names its source,
at most half of the MI350X rows fit the constants, and rows added as validation points stay validation
points (issue 29: fit on at most half, report the error on the rest)."""

from translator_kernels.measure import calibration as cal


def test_every_row_carries_a_measured_time_and_a_source():
    for row in cal.POINTS + cal.MI300X_POINTS:
        kernel, params, measured, source, note = row[:5]
        assert kernel and params and measured > 0, row
        assert isinstance(source, str) and len(source) > 20, row  # a repository + path + run, or a publication
    assert all(src.startswith(("jhinpan/flydsl-kernel-profiling", "ROCm blog")) for _, _, _, src, *_ in
               cal.POINTS + cal.MI300X_POINTS)


def test_at_most_half_of_the_points_fit():
    roles = cal.split(cal.POINTS)
    assert set(roles) <= {"fit", "validation"}
    assert 2 * roles.count("fit") <= len(roles), roles.count("fit")


def test_rows_that_name_their_role_keep_it_and_the_rest_alternate():
    points = [("k", {}, 1.0, "s", ""), ("k", {}, 1.0, "s", ""), ("k", {}, 1.0, "s", "", "validation"),
              ("k", {}, 1.0, "s", ""), ("j", {}, 1.0, "s", "")]
    assert cal.split(points) == ["validation", "fit", "validation", "validation", "validation"]
    added = [r for r in cal.POINTS if len(r) > 5]
    assert len(added) == 7 and {r[5] for r in added} == {"validation"}
    mid_m = [r for r in added if 128 <= r[1]["m"] <= 2048]
    assert len(mid_m) == 4 and all(r[0] == "gemm_fp8" for r in mid_m)


def test_known_misses_are_validation_rows():
    shapes = {(k, ",".join(f"{a}={b}" for a, b in p.items())): role
              for (k, p, *_), role in zip(cal.POINTS, cal.split(cal.POINTS))}
    assert all(shapes.get(key) == "validation" for key in cal.KNOWN_MISSES), cal.KNOWN_MISSES
