"""python -m bench.generate: its MODEL table is the HBM limit of Llama-3-8B's decode step from the one
hardware table (translator_kernels/arch.py), our kernels' MODEL time per step (translator_kernels.timing) sits
at or under that limit for every row, and the command runs end to end on the tiny decoder."""

import pytest

from bench import decode_model as M
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
    assert "MODEL (not measured)" in out and out.count("| translated (rocm path, recorded) |") == 2
    assert "| tiny HF Llama (transformers " in out and "| fused_norm |" in out


@pytest.fixture
def no_rope_compile(monkeypatch):
    """The fused RoPE launch at its bandwidth floor (as without a toolchain): no ISA compile in these tests;
    test_fused_rope_launch_is_priced_from_its_compiled_isa compiles it."""
    monkeypatch.setattr(M, "compiled_features", lambda *a, **k: "skipped: no compile in this test")


def test_fused_rope_launch_is_priced_from_its_compiled_isa(monkeypatch):
    from translator_kernels.timing import KernelFeatures

    monkeypatch.setattr(M, "_FEATURES", {})
    r = M._rope_cache_launch(1, G.LLAMA3_8B, 2048, "gfx950")
    (feat,) = M._FEATURES[("rope_cache", "gfx950")].values()
    assert isinstance(feat, KernelFeatures), feat  # compiled (COMPILE_ONLY child), not the floor
    assert r["how"] == "MODEL (features of our compiled kernel)" and not feat.has_loop
    assert r["t"] > GPUS["gfx950"].timing["launch_s"] and r["kernel_t"] > 0


def test_our_kernels_model_rows_cover_every_shape_and_stay_under_the_limit(no_rope_compile):
    rows, before = G.model_rows(), G.model_rows(fused_rope=False)
    assert {(r["arch"], r["batch"], r["context"]) for r in rows} == {
        (a, b, c) for a in GPUS for b in (1, 16, 64) for c in (2048, 8192)}
    for r in rows:
        # no modelled step beats the HBM limit (what a step must read over the vendor peak)
        assert 0 < r["fraction"] <= r["kernels_fraction"] <= 1.05
        assert r["fraction"] == pytest.approx(r["limit_us"] / r["model_us"])
        # 8 launches per layer, the cache writes inside RoPE's, the split-KV merge inside attention's, x 32,
        # + gather, final norm, LM head; at batch <= 4 the norms fold into their GEMMs (norm_gemm.py): 6 x 32 + 2;
        # before: + 3 a layer (RoPE q, RoPE k and the two cache writes apart)
        assert r["launches"] == (32 * 6 + 2 if r["batch"] <= 4 else 32 * 8 + 3)
    for r, b in zip(rows, before):
        assert b["launches"] == r["launches"] + 3 * 32 and b["fraction"] < r["fraction"]
    # a longer context reads more KV: a longer MODEL step, at every GPU and batch
    by = {(r["arch"], r["batch"], r["context"]): r["model_us"] for r in rows}
    assert all(by[a, b, 8192] > by[a, b, 2048] for a in GPUS for b in (1, 16, 64))


def test_model_table_prints_labelled_rows_with_the_calibration_line(capsys, no_rope_compile):
    from translator_kernels.timing import CALIBRATION

    G.print_ours_table(G.model_rows(), G.model_rows(fused_rope=False))
    out = capsys.readouterr().out
    assert "MODEL (not measured)" in out and CALIBRATION in out
    assert out.count("| MI300X (gfx942) |") == 6 and out.count(f"| {GPUS['gfx950'].gpu} (gfx950) |") == 6
    assert "| LM head + RMSNorm | GEMM " in out and "| decode attention" in out and "bandwidth floor" in out
    assert "| RoPE q + k, K / V cache writes (one kernel) | bandwidth floor (no compile: skipped" in out
