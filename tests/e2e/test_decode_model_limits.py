"""bench.generate's decode MODEL against both HBM limits (issue 23): the vendor peak's and the measured
streaming bandwidth's (arch.STREAM_MEASURED), each step priced alone (T_LAUNCH per launch), graph-replayed
(GRAPH_LAUNCH per launch, measured back to back in one HIP graph) and kernels only."""

import pytest

from bench import generate as G
from translator_kernels.arch import GPUS, STREAM_MEASURED


@pytest.fixture(scope="module")
def rows():
    with pytest.MonkeyPatch.context() as mp:  # the fused RoPE launch at its bandwidth floor: no compile here
        mp.setattr(G, "_ROPE_FEATURES", {a: "skipped: no compile in this test" for a in GPUS})
        return G.model_rows(batches=(1, 16), contexts=(2048,))


def test_the_streaming_limit_is_the_vendor_limit_at_the_measured_fraction(rows):
    assert STREAM_MEASURED == pytest.approx(6468 / 8000, abs=0.005)  # the seed's vec_add on MI350X
    for r in rows:
        assert r["streaming_us"] == pytest.approx(r["limit_us"] / STREAM_MEASURED)
        assert r["streaming_fraction"] == pytest.approx(r["streaming_us"] / r["model_us"])


def test_graph_replayed_step_lies_between_alone_and_kernels_only(rows):
    for r in rows:
        g = GPUS[r["arch"]].timing
        assert r["graph_us"] == pytest.approx(r["kernels_us"] + r["launches"] * g["graph_launch_s"] * 1e6)
        assert r["kernels_us"] < r["graph_us"] < r["model_us"]
        assert r["fraction"] < r["graph_fraction"] < r["kernels_fraction"]
        assert r["streaming_graph_fraction"] == pytest.approx(r["graph_fraction"] / STREAM_MEASURED)


def test_batch_1_goal_is_not_met_under_the_model_and_the_table_says_both(capsys, rows):
    """Issue 23's 0.8 at batch 1: not met against either limit (docs/host-overhead.md says by how much);
    no kernel streams above the fitted cap, which is under the measured streaming fraction."""
    for r in rows:
        if r["batch"] == 1:
            assert r["graph_fraction"] < 0.8 and r["streaming_graph_fraction"] < 0.8
        assert r["streaming_kernels_fraction"] <= GPUS[r["arch"]].timing["hbm_efficiency"] / STREAM_MEASURED + 1e-9
    G.print_ours_table(rows)
    out = capsys.readouterr().out
    assert "limit us: vendor / streaming" in out and "alone / graph / kernels" in out
