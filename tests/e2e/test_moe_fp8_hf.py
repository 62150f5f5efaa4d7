"""precision="fp8" on MoE models (translator/lowerings/moe_fp8.py): HF Mixtral / Qwen3-MoE tiny configs (random
init) and a hand-written top-2 loop run their experts as `moe_experts_fp8` on flysim: the gated and the down grouped
GEMMs launched with fp8 MFMAs, the accuracy report (translator.accuracy's fp8 rule) passing; the router linear kept
bf16 (fp8_mode.KEEP_ROUTER). Experts whose sizes the
fp8 rows cannot take stay bf16 with their reason."""

from __future__ import annotations

import pytest
import torch

from translator import translate
from translator import accuracy as A

from test_moe import HandMoE, _hf

FP8_MFMA = {"mfma.f32.16x16x32.fp8.fp8", "mfma.scale.f32.16x16x128.f8f6f4"}


def _expert_launches(tm, family="moe_experts_fp8"):
    return [r for c in tm.last_calls if c.family == family for r in c.launches]


def _check_fp8_experts(tm, counter, layers=1):
    v = tm.report.verification
    assert v.passed, v.message
    assert A.FP8_RULE in v.message
    c = tm.report.counters
    assert c.get(counter) == layers and not c.get("moe_experts"), c
    launches = _expert_launches(tm)
    assert len(launches) == 7 * layers, launches  # align, gather, quantize, gated GEMM, quantize, GEMM, un-permute
    fp8 = [r for r in launches if FP8_MFMA & set(r.counters.get("mfma_by_kind", {}))]
    assert len(fp8) == 2 * layers  # both expert GEMMs, fp8 MFMAs only
    assert all(set(r.counters["mfma_by_kind"]) <= FP8_MFMA for r in fp8)
    left = [(r.op, r.detail) for r in tm.report.rows if not r.layout and r.where == "pytorch"
            and "by design" not in r.detail]
    assert left == [], f"left in PyTorch: {left}"


@pytest.mark.parametrize("family,arch", [("mixtral", "gfx942"), pytest.param("qwen3_moe", "gfx950",
                                                                              marks=pytest.mark.slow)])
def test_hf_moe_fp8_on_flysim(family, arch):
    model, ids = _hf(family)
    tm = translate(model, (ids,), backend="flysim", arch=arch, precision="fp8")
    _check_fp8_experts(tm, "moe_experts_fp8")
    # the router stays bf16 (fp8_mode.KEEP_ROUTER): an fp8 router changes the top-2 set of 2.5-5 % of tokens
    assert any("router" in why for why in tm.gm.meta["fp8_kept_bf16"].values()), tm.gm.meta["fp8_kept_bf16"]


def test_hand_written_loop_fp8_on_flysim():
    torch.manual_seed(0)
    m = HandMoE().eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend="flysim", precision="fp8")
    _check_fp8_experts(tm, "moe_experts_fp8_loop")


def test_experts_fp8_rows_cannot_take_stay_bf16():
    """I = 40 is not a multiple of 16: the experts run in bf16 and say why."""
    torch.manual_seed(0)
    m = HandMoE(f=40).eval()
    tm = translate(m, (torch.randn(2, 5, 64),), backend="reference", precision="fp8")
    c = tm.report.counters
    assert c.get("moe_experts_fp8_kept_bf16") == 1 and c.get("moe_experts_loop") == 1 and not c.get(
        "moe_experts_fp8_loop"), c
    assert any("not multiples of 16" in why for why in tm.gm.meta["fp8_kept_bf16"].values())


def test_fp8_experts_follow_a_parameter_update():
    """The four prepared constants (W13, S13, W2, S2) are rebuilt from the experts' parameters when one changes
    after translation (state.prepared): the output follows eager within the fp8 rule, and moves."""
    torch.manual_seed(0)
    m = HandMoE().eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend="reference", precision="fp8", verify=False)
    assert tm.report.counters.get("moe_experts_fp8_loop") == 1
    with torch.no_grad():
        before = tm(x)
        for e in m.experts:
            e.w2.weight.mul_(-2.0)  # in place: every expert's output doubles and flips
        after = tm(x)
        rep = A.accuracy(m(x), after)
    assert rep.passed, rep.message
    assert float((after + 2 * before).norm() / before.norm()) < 0.1
