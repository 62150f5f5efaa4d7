"""Smoke tests of the bench modules at tiny shapes: they print their tables and exit 0.

The ISA parser and occupancy model are checked on a real compile; the traffic model is checked
against flysim's counters (that equality is what the anchor extrapolation rests on).
"""

import pytest
import torch

from bench import host_overhead, isa, kernels, models, rocm, roofline, weights_look
from translator_kernels.arch import gpu


def test_occupancy_model():
    assert isa.occupancy(49, 14, 32, 256, "gfx942") == (8, "waves")
    assert isa.occupancy(198, 86, 32768, 256, "gfx942") == (2, "VGPR")
    assert isa.occupancy(182, 30, 65536, 256, "gfx942") == (1, "LDS")
    assert isa.occupancy(182, 30, 65536, 256, "gfx950")[0] == 2  # 160 KiB LDS: VGPR-bound instead
    assert isa.occupancy(26, 22, 0, 1024, "gfx942") == (8, "waves")


def test_classify():
    assert isa.classify("v_mfma_f32_16x16x16_bf16") == "MFMA"
    assert isa.classify("buffer_load_dwordx4") == "vmem_load" and isa._width("buffer_load_dwordx4") == 128
    assert isa.classify("ds_read_b128") == "LDS_read" and isa.classify("s_waitcnt") == "wait"
    assert isa.classify("v_add_f32_e32") == "VALU" and isa.classify("s_mov_b32") == "SALU"


def test_compile_stats_softmax():
    s = isa.compile_stats("ours", "softmax", "bf16", (4, 1024), "gfx942")
    assert s.meta["vgpr"] > 0 and s.spills == 0
    assert s.vmem_loads and s.mix["VALU"] > 0
    assert 1 <= s.occupancy[0] <= 8


@pytest.mark.parametrize("family,dt,shape", [("softmax", "bf16", (8, 1024)), ("rms_norm", "bf16", (64, 512)),
                                             ("gemm", "bf16", (64, 128, 128))])
def test_traffic_model_matches_flysim(family, dt, shape):
    from translator_kernels.measure import traffic

    m = traffic.measure(family, dt, shape)
    assert m["moved"] == m["model"] and m["moved"] >= m["compulsory"]


def test_roofline_model():
    r = roofline.kernel_time(2 * 4096**3, 3 * 4096**2 * 2, "bf16", "gfx942", waves=1)
    assert r["bound"] == "compute" and r["efficiency"] == 0.5
    # MI300X: AMD's measured Max-Achievable 708 TFLOPS (the peak is 1307)
    assert r["t"] == pytest.approx(2 * 2 * 4096**3 / gpu("gfx942").achievable_flops("bf16"))


def test_bench_kernels_prints_tables(capsys):
    assert kernels.main(["--only", "softmax", "--arch", "gfx942", "--small", "--no-traffic"]) == 0
    out = capsys.readouterr().out
    assert "## ISA statistics" in out and "| softmax | 256x8192 | gfx942 | ours |" in out
    assert "Roofline MODEL" in out


def test_bench_models_traffic(capsys):
    assert models.main(["--only", "mlp", "--no-timing"]) == 0
    out = capsys.readouterr().out
    row = [ln for ln in out.splitlines() if ln.startswith("| mlp |")][0]
    eager_k, trans_k = (int(c) for c in row.split("|")[2:4])
    assert trans_k < eager_k


def test_model_traffic_fusion_saves_bytes():
    model, inputs = models.build("mini_gpt")
    r = roofline.model_traffic(model, inputs)
    assert r["translated"]["bytes"] < r["eager"]["bytes"]
    assert r["translated"]["flops"] == r["eager"]["flops"]


def test_bench_rocm_exits_0_without_gpu(capsys):
    if rocm.rocm_available():
        pytest.skip("a ROCm GPU is present: bench.rocm times for real")
    assert rocm.main([]) == 0
    assert "needs a ROCm GPU" in capsys.readouterr().out


def test_flydsl_traffic_without_source_says_so(capsys, monkeypatch):
    from bench import flydsl_traffic

    monkeypatch.delenv("FLYDSL_SRC", raising=False)
    assert flydsl_traffic.main([]) == 0
    assert "FLYDSL_SRC is not set" in capsys.readouterr().out


def test_bench_host_overhead_runs(capsys):
    assert host_overhead.main(["--tiny", "--repeat", "3", "--no-models", "--pieces"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and ln.endswith("| 1 |")]
    assert len(rows) == 8 and "median over families" in out  # every family: one recorded device call per op
    pieces = out.split("## Pieces of one planned call")[1].splitlines()
    assert len([ln for ln in pieces if ln.startswith("| ") and not ln.startswith("| op")]) == 8


def test_bench_weights_look_prints_the_costs(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["weights_look", "--tiny"])
    weights_look.main()
    out = capsys.readouterr().out
    assert "tracked weights" in out and "follow (nothing changed)" in out and "data pointers" in out
