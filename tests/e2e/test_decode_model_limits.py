"""bench.generate's decode MODEL (bench/decode_model.py) against the three HBM limits of issue 23: the achievable
bandwidth the validated MODEL fits (the headline, the goal judged on it), the vendor peak's and the measured
streaming bandwidth's (arch.STREAM_MEASURED); each step priced alone (T_LAUNCH per launch), graph-replayed
(GRAPH_LAUNCH per launch) and kernels only; the launch-list variants; the printed verdict read from the numbers."""

import re

import pytest

from bench import decode_model as M
from translator_kernels.arch import GPUS, STREAM_MEASURED

COMPILED_FEATURES = M.compiled_features  # the real one (the module fixture below replaces it)


@pytest.fixture(scope="module")
def no_compile():
    """Every compiled-kernel launch at its labelled bandwidth floor: no ISA compile in these tests (the last test
    compiles one)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "compiled_features", lambda *a, **k: "skipped: no compile in this test")
        yield


@pytest.fixture(scope="module")
def rows(no_compile):
    return M.model_rows(batches=(1, 16), contexts=(2048,))


def test_the_three_limits_are_the_same_bytes_over_three_bandwidths(rows):
    assert STREAM_MEASURED == pytest.approx(6468 / 8000, abs=0.005)  # the seed's vec_add on MI350X
    for r in rows:
        eff = GPUS[r["arch"]].timing["hbm_efficiency"]
        assert r["streaming_us"] == pytest.approx(r["limit_us"] / STREAM_MEASURED)
        assert r["achievable_us"] == pytest.approx(r["limit_us"] / eff)
        assert r["streaming_fraction"] == pytest.approx(r["streaming_us"] / r["model_us"])
        assert r["achievable_graph_fraction"] == pytest.approx(r["graph_fraction"] / eff)
        assert r["of_model_cap"] == pytest.approx(r["achievable_kernels_fraction"])


def test_graph_replayed_step_lies_between_alone_and_kernels_only(rows):
    for r in rows:
        g = GPUS[r["arch"]].timing
        assert r["graph_us"] == pytest.approx(r["kernels_us"] + r["launches"] * g["graph_launch_s"] * 1e6)
        assert r["kernels_us"] < r["graph_us"] < r["model_us"]
        assert r["fraction"] < r["graph_fraction"] < r["kernels_fraction"]
        assert r["streaming_graph_fraction"] == pytest.approx(r["graph_fraction"] / STREAM_MEASURED)


def test_no_step_streams_above_the_models_cap(rows):
    """Against the vendor peak the goal is out of reach of the validated MODEL: no kernel streams above
    HBM_EFFICIENCY of it, so no step's kernels-only fraction of the vendor limit exceeds it."""
    for r in rows:
        assert r["kernels_fraction"] <= GPUS[r["arch"]].timing["hbm_efficiency"] + 1e-9
        assert r["achievable_kernels_fraction"] <= 1 + 1e-9


def _printed_goal_column(out: str) -> dict:
    """(arch, batch, context) -> the goal column of the headline table's rows, as printed."""
    head = out.split("**of achievable")[1].split("\n\n")[0]
    got = {}
    for ln in head.splitlines():
        m = re.match(r"\| \S+ \((gfx\d+)\) \| (\d+) \| (\d+) \|", ln)
        if m:
            got[m.group(1), int(m.group(2)), int(m.group(3))] = ln.split(" | ")[6]
    return got


def test_printed_verdict_follows_the_numbers(capsys, rows):
    """The goal column is computed from the row's graph-replayed fraction of the achievable limit, at batch 1
    only: the printed verdict is what the numbers say, whatever they are."""
    M.print_ours_table(rows)
    printed = _printed_goal_column(capsys.readouterr().out)
    assert len(printed) == len(rows)
    for r in rows:
        want = "-" if r["batch"] != 1 else ("met" if r["achievable_graph_fraction"] >= M.GOAL_FRACTION else "not met")
        assert r["verdict"] == want == printed[r["arch"], r["batch"], r["context"]]
    # the same code on moved numbers moves the verdict
    r1 = next(r for r in rows if r["batch"] == 1)
    assert M.goal_verdict(dict(r1, achievable_graph_fraction=M.GOAL_FRACTION)) == "met"
    assert M.goal_verdict(dict(r1, achievable_graph_fraction=M.GOAL_FRACTION - 1e-6)) == "not met"
    assert M.goal_verdict(dict(r1, batch=16, achievable_graph_fraction=0.99)) == "-"


def test_variants_drop_the_launches_they_fuse(no_compile):
    from translator_kernels.attention import split_geometry

    s = M.LLAMA3_8B
    for arch in GPUS:
        for b in (1, 64):
            base = M.decode_step_launches(arch, b, 2048)
            n = sum(x["count"] for x in base)
            split = split_geometry(b, s.heads, 1, 2048, s.head_dim, "bf16", arch)[0] > 1
            norm = M.decode_step_launches(arch, b, 2048, variants=("fused_norm",))
            assert sum(x["count"] for x in norm) == n - 2 * s.layers
            assert not any(x["name"].startswith("RMSNorm (attention") or x["name"] == "RMSNorm (MLP)" for x in norm)
            # the folded GEMM costs more than the plain one (the A rows re-read from L2, one L2 trip)
            qkv = {x["name"]: x["kernel_t"] for x in base + norm if x["name"].startswith("QKV GEMM")}
            assert qkv["QKV GEMM + RMSNorm"] > qkv["QKV GEMM"]
            comb = M.decode_step_launches(arch, b, 2048, variants=("combine_in_launch",))
            assert sum(x["count"] for x in comb) == n - s.layers * split
            assert not any(x["name"] == "split-KV combine" for x in comb)
    with pytest.raises(ValueError, match="unknown decode-step variant"):
        M.decode_step_launches("gfx942", 1, 2048, variants=("fused_everything",))


def test_decode_attention_is_priced_on_our_compiled_kernels_not_a_floor(monkeypatch):
    """gfx950, batch 1, context 2048 (16 slices): the forward kernel and the combine are compiled (COMPILE_ONLY
    child) and priced by the MODEL; neither beats its bandwidth floor."""
    from translator_kernels.timing import KernelFeatures

    monkeypatch.setattr(M, "_FEATURES", {})
    monkeypatch.setattr(M, "compiled_features", COMPILED_FEATURES)
    att = M._attention_launches(1, M.LLAMA3_8B, 2048, "gfx950")
    feats = M._FEATURES[("attention split=True", "gfx950")]
    assert not isinstance(feats, str), feats
    assert {k.split("_kernel")[0] for k in feats} == {"attention_fwd", "attention_combine"}
    assert all(isinstance(f, KernelFeatures) and f.has_loop for f in feats.values())
    assert [x["name"] for x in att] == ["decode attention (split 16)", "split-KV combine"]
    kv = M.LLAMA3_8B.kv_bytes(1, 2048) // M.LLAMA3_8B.layers
    floor = M._floor_launch("floor", kv, "gfx950")["kernel_t"]
    assert att[0]["how"] == att[1]["how"] == "MODEL (features of our compiled kernel)"
    assert att[0]["kernel_t"] > floor and att[1]["kernel_t"] > 0
    inl = M._attention_launches(1, M.LLAMA3_8B, 2048, "gfx950", in_launch=True)
    assert len(inl) == 1 and att[0]["kernel_t"] < inl[0]["kernel_t"] < att[0]["kernel_t"] + att[1]["kernel_t"]
