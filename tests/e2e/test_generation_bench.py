"""python -m bench.generate: its MODEL table is the HBM limit of Llama-3-8B's decode step from the one
hardware table (translator_kernels/arch.py), our kernels' MODEL time per step (translator_kernels.timing) sits
at or under that limit for every row, and the command runs end to end on the tiny decoder."""

import pytest

from bench import generate as G
from translator_kernels.arch import GPUS


def test_llama3_8b_weights_are_its_known_parameter_count():
    s = G.LLAMA3_8B
    embedding = s.vocab * s.hidden
    assert abs((s.weight_bytes() / s.bytes_per_elem + embedding) / 1e9 - 8.03) < 0.01  # Meta's 8.03B


def test_model_rows_read_the_arch_table():
    rows = G.hbm_limit_rows()
    assert len(rows) == len(GPUS) * 3 * 2
    for r in rows:
        g = GPUS[r["arch"]]
        want = (G.LLAMA3_8B.weight_bytes() + G.LLAMA3_8B.kv_bytes(r["batch"], r["context"])) / g.hbm_bytes_per_s
        assert r["step_ms"] == pytest.approx(want * 1e3)


@pytest.mark.slow
def test_bench_generate_runs(capsys):
    assert G.main(["--tiny", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "MODEL (not measured)" in out and "| translated (rocm path, recorded) |" in out


def test_our_kernels_model_rows_cover_every_shape_and_stay_under_the_limit():
    rows = G.model_rows()
    assert {(r["arch"], r["batch"], r["context"]) for r in rows} == {
        (a, b, c) for a in GPUS for b in (1, 16, 64) for c in (2048, 8192)}
    for r in rows:
        # no modelled step beats the HBM limit (what a step must read over the vendor peak)
        assert 0 < r["fraction"] <= r["kernels_fraction"] <= 1.05
        assert r["fraction"] == pytest.approx(r["limit_us"] / r["model_us"])
        # 9 launches per layer + 2 cache writes (+ the split-KV combine), x 32, + gather, final norm, LM head
        assert r["launches"] in (32 * 11 + 3, 32 * 12 + 3)
    # a longer context reads more KV: a longer MODEL step, at every GPU and batch
    by = {(r["arch"], r["batch"], r["context"]): r["model_us"] for r in rows}
    assert all(by[a, b, 8192] > by[a, b, 2048] for a in GPUS for b in (1, 16, 64))


def test_model_table_prints_labelled_rows_with_the_calibration_line(capsys):
    from translator_kernels.timing import CALIBRATION

    G.print_ours_table(G.model_rows())
    out = capsys.readouterr().out
    assert "MODEL (not measured)" in out and CALIBRATION in out
    assert out.count("| MI300X (gfx942) |") == 6 and out.count(f"| {GPUS['gfx950'].gpu} (gfx950) |") == 6
    assert "| LM head | GEMM " in out and "| decode attention" in out and "bandwidth floor" in out
