"""python -m bench.generate: its MODEL table is the HBM limit of Llama-3-8B's decode step from the one
hardware table (translator_kernels/arch.py), and the command runs end to end on the tiny decoder."""

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
