"""precision="fp8" on HF gpt-oss (tiny config, random init, experts redrawn so their gate / up values reach the
clamps): the experts (biases, interleaved gate / up, the clamped SwiGLU) run as `moe_experts_fp8` on flysim, both
grouped GEMMs with fp8 MFMAs, the accuracy report's fp8 rule passing (translator/lowerings/moe_fp8.py,
`emit_gpt_oss_fp8`). Before, they stayed bf16 under fp8."""

from __future__ import annotations

from test_moe_fp8_hf import _check_fp8_experts
from test_moe_gpt_oss_hf import _clamped, _gpt_oss
from translator import translate


def test_hf_gpt_oss_experts_fp8_on_flysim():
    m, ids = _gpt_oss(scale=0.6)
    assert _clamped(m, ids)
    tm = translate(m, (ids,), backend="flysim", arch="gfx942", precision="fp8")
    _check_fp8_experts(tm, "moe_experts_fp8_gpt_oss")
    assert not tm.report.counters.get("moe_experts_gpt_oss") and not tm.report.counters.get("moe_experts_fp8_kept_bf16")
