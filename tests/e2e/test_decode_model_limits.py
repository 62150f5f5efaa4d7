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
    """fused_norm folds the two norms of a layer and the final norm at batch <= NORM_FOLD_M_MAX (normfuse's rule),
    and nothing at larger batches; the split-KV merge is inside the attention launch in every list."""
    s = M.LLAMA3_8B
    for arch in GPUS:
        for b in (1, 16):
            base = M.decode_step_launches(arch, b, 2048, variants=())
            n = sum(x["count"] for x in base)
            assert n == 8 * s.layers + 3  # one attention launch a layer, split or not
            assert sum(x["count"] for x in base if x["name"].startswith("decode attention")) == s.layers
            norm = M.decode_step_launches(arch, b, 2048, variants=("fused_norm",))
            if b > M.NORM_FOLD_M_MAX:
                assert norm == base
                continue
            assert sum(x["count"] for x in norm) == n - 2 * s.layers - 1
            assert not any(x["name"].startswith("RMSNorm") for x in norm)
            # the folded GEMM costs more than the plain one (the A rows re-read from L2, the dependent rounds)
            kt = {x["name"]: x["kernel_t"] for x in base + norm}
            for g in ("QKV GEMM", "gated MLP GEMM (gate + up)", "LM head"):
                assert kt[g + " + RMSNorm"] > kt[g]
    with pytest.raises(ValueError, match="unknown decode-step variant"):
        M.decode_step_launches("gfx942", 1, 2048, variants=("fused_everything",))


def test_fused_norm_rounds_follow_the_rows(no_compile):
    """Each workgroup's prologue: its valid rows x K re-read from L2, ceil(rows / 2) dependent rounds: batch 4 pays
    one round more than batch 1 (and twice the bytes) on the same tile."""
    g = GPUS["gfx950"]
    k, n = M.LLAMA3_8B.hidden, 6144
    plain = {m: M._gemm_launch("QKV", m, n, k, "gfx950")["kernel_t"] for m in (1, 4)}
    fused = {m: M._gemm_launch("QKV", m, n, k, "gfx950", fused_norm=True) for m in (1, 4)}
    assert "1 dependent L2 round)" in fused[1]["how"] and "2 dependent L2 rounds)" in fused[4]["how"]
    step = g.timing["l2_latency_s"] + M.ROWNORM_VECTOR_CYCLES / g.clock_hz
    extra = {m: fused[m]["kernel_t"] - plain[m] for m in (1, 4)}
    assert extra[1] > step and extra[4] - extra[1] > step


def test_launch_lists_name_what_is_built(monkeypatch):
    """AS_BUILT is the default launch list and the tables name every list against it: flipping it (one line, at
    the merge of a variant's kernel) renames the rows and changes the default."""
    assert M.variant_lists()[0] == M.AS_BUILT == ("fused_norm",)  # normfuse's fold is built (norm_gemm.py)
    assert M.variant_lists() == [("fused_norm",), ()]
    assert M.list_label(("fused_norm",)) == "as built (fused_norm)" and M.list_label(()) == "without fused_norm"
    monkeypatch.setattr(M, "AS_BUILT", ())
    assert M.variant_lists()[0] == ()
    assert M.list_label(()) == "as built" and M.list_label(("fused_norm",)) == "fused_norm"


def test_attention_launch_bytes_hold_the_in_launch_merge():
    """One launch's bytes: K and V once per sequence, q in and O out, and under split KV the fp32 partials written
    and read back and the tickets (splitkv's fwd.py): no separate combine, no second write of O."""
    from translator_kernels.attention import padded_head_dim

    s = M.LLAMA3_8B
    b, h, d, e = 2, s.heads, s.head_dim, s.bytes_per_elem
    kv = s.kv_bytes(b, 2048) // s.layers
    assert M.attention_launch_bytes(b, s, 2048, 1) == kv + 2 * b * h * d * e
    part = 16 * b * h * (padded_head_dim(d) + 2) * 4
    assert M.attention_launch_bytes(b, s, 2048, 16) == kv + 2 * b * h * d * e + 2 * part + b * h * (8 * 16 + 4)
    # packed GQA decode (attention/gqa.py): the same partials per query head, one ticket per block (KV head)
    g = h // s.kv_heads
    assert M.attention_launch_bytes(b, s, 2048, 16, g) == kv + 2 * b * h * d * e + 2 * part + b * h // g * (8 * 16 + 4)


def _compiled_attention(monkeypatch, nsplit: int, context: int = 2048, arch: str = "gfx950", decode: bool = True):
    monkeypatch.setattr(M, "compiled_features", COMPILED_FEATURES)
    s = M.LLAMA3_8B
    from translator_kernels.measure.decode_isa import DECODE_ATTENTION

    return M.compiled_features(f"attention split={nsplit > 1} decode={decode}", DECODE_ATTENTION,
                               (1, s.heads, s.kv_heads, s.head_dim, context, nsplit), arch, decode=decode)


def test_decode_attention_is_priced_on_our_compiled_kernel_not_a_floor(monkeypatch):
    """gfx950, batch 1, context 2048: one compiled kernel, the forward with the merge inside it, at the slice count
    the MODEL prefers (split_model.model_split), priced with the merge's further rounds as its tail; it does not
    beat its bandwidth floor. Against the unsplit compile, the split kernel's features hold the merge: one merge
    round (and on gfx942 the ticket) more dependent round trips outside the hot loop, and more straight-line loads
    (which the price leaves to the merger: the unsplit prologue is charged); the hot loop (the KV tiles) is the
    same. The features are the checked-in ones split_geometry ranks with (measure/decode_attention_isa.json)."""
    from translator_kernels.attention import split_model as dp
    from translator_kernels.attention.tiles import merge_trips
    from translator_kernels.timing import KernelFeatures

    monkeypatch.setattr(M, "_FEATURES", {})
    feats = _compiled_attention(monkeypatch, 16)
    assert not isinstance(feats, str), feats
    assert {k.split("_kernel")[0] for k in feats} == {"attention_fwd"}
    (split,) = feats.values()
    (whole,) = _compiled_attention(monkeypatch, 1).values()
    assert isinstance(split, KernelFeatures) and split.has_loop
    # the merge round at least (timing._Trips counts a returning atomic as a store: the ticket's round trip shows
    # on gfx942, where loads are pending at the atomic, not on gfx950)
    assert split.straight_trips > whole.straight_trips
    assert split.straight_bytes > whole.straight_bytes
    assert (split.loop_matrix, split.loop_flops) == (whole.loop_matrix, whole.loop_flops)
    # the checked-in features (decode_isa.FEATURE_SHAPES compiles them at a 4096-key cache) are these
    assert dp.cached_features("gfx950", "bf16", 128) == (whole, split)
    n, _ = dp.model_split(1, 8, 4, 2048, 128, "bf16", "gfx950")
    att = M._attention_launch(1, M.LLAMA3_8B, 2048, "gfx950")
    assert att["name"] == f"decode attention (split {n}, merge in the launch)"
    tail = merge_trips(128, 4, n) - 1
    assert att["how"] == "MODEL (features of our compiled kernel)" + (
        f" + the merge's other {tail} round trip{'s' * (tail > 1)}" if tail else "")
    nbytes = M.attention_launch_bytes(1, M.LLAMA3_8B, 2048, n, 4)
    assert att["kernel_t"] > M._floor_launch("floor", nbytes, "gfx950")["kernel_t"]


def test_decode_features_take_the_unmasked_key_loop(monkeypatch):
    """The decode kernel's two key loops hold the same MFMAs; plain timing.features took the masked one (more
    VALU) as the hot loop and charged the unmasked loop, and the masked loop's K / V loads, to every workgroup's
    prologue. decode_features prices the unmasked loop per tile and leaves the masked one out (it runs no tile
    at position context - 1): its straight-line code loses the unmasked body's vector work and one K / V tile."""
    monkeypatch.setattr(M, "_FEATURES", {})
    (plain,) = _compiled_attention(monkeypatch, 1, decode=False).values()
    (dec,) = _compiled_attention(monkeypatch, 1).values()
    assert dec.loop_matrix == plain.loop_matrix and dec.loop_vector < plain.loop_vector
    assert dec.straight_bytes == plain.straight_bytes - 2 * 64 * 128 * 2
    assert dec.straight_vector <= plain.straight_vector - dec.loop_vector
