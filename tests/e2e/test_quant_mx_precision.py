"""precision="fp8" with MX weights (fp8_mode.FP8_WEIGHTS = "mxfp8" / "mxfp4", gfx950): every fp8 linear's
weight is quantized once at translate time to e4m3fn (e2m1) with e8m0 scales per 32 of K and runs the MX GEMM (the
scaled MFMA with the weight's scales, the per-token activation scale in the epilogue); MXFP8 passes the fp8 accuracy
rule; gfx942 raises."""

import pytest
import torch

from translator import translate
from translator.errors import InputError
from translator.lowerings import fp8_mode

from bundled_models import load_model

MFMA = "mfma.scale.f32.16x16x128.f8f6f4"


def _mx_gemms(tm):
    """gemm_fp8 nodes whose weight scales are MX (uint8 e8m0 bytes)."""
    return [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.gemm_fp8.default
            and n.args[5] is not None and n.args[5].meta["val"].dtype == torch.uint8]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(256, 160), torch.nn.Linear(160, 64)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) * 0.5  # not the model output itself: fp8 too


def _check_mx(model, inputs):
    tm = translate(model, inputs, arch="gfx950", backend="flysim", precision="fp8")
    v = tm.report.verification
    assert v.passed, v.message
    c = tm.report.counters
    assert c.get("linear_fp8", 0) >= 2 and len(_mx_gemms(tm)) == c["linear_fp8"]
    tm(*inputs)
    gemms = [r for call in tm.last_calls if call.family == "gemm_fp8" for r in call.launches]
    assert len(gemms) == c["linear_fp8"] and all(set(r.counters["mfma_by_kind"]) == {MFMA} for r in gemms)
    return tm


def test_mlp_mxfp8_weights(monkeypatch):
    monkeypatch.setattr(fp8_mode, "FP8_WEIGHTS", "mxfp8")
    tm = _check_mx(Mlp().eval(), (torch.randn(2, 7, 256),))
    assert tm.report.counters["linear_fp8"] == 2


@pytest.mark.slow  # ~40 s; test_mlp_mxfp8_weights covers the path in the default suite
def test_llama_block_mxfp8_weights(monkeypatch):
    monkeypatch.setattr(fp8_mode, "FP8_WEIGHTS", "mxfp8")
    model, mod = load_model("llama_block", prefix="_mx_model")
    _check_mx(model, tuple(mod.get_inputs()))


def test_mxfp8_weights_are_gfx950_only(monkeypatch):
    monkeypatch.setattr(fp8_mode, "FP8_WEIGHTS", "mxfp8")
    model, inputs = Mlp().eval(), (torch.randn(3, 256),)
    with pytest.raises(InputError, match="need gfx950's scaled MFMA.*FP8_WEIGHTS = 'channel'"):
        translate(model, inputs, arch="gfx942", backend="flysim", precision="fp8")
    monkeypatch.setattr(fp8_mode, "FP8_WEIGHTS", "mxfp4x")
    with pytest.raises(InputError, match="not a weight format"):
        translate(model, inputs, arch="gfx950", backend="flysim", precision="fp8")


def test_mlp_mxfp4_weights(monkeypatch):
    """FP8_WEIGHTS = "mxfp4": e2m1 weights (2 codes a byte) with e8m0 scales per 32, the fp8 x fp4 scaled MFMA. The
    kernels equal the reference backend's torch math of the same quantized graph. (The fp8 accuracy rule judges
    4-bit weights too: this all-GEMM MLP fails it, 0.21 RMS rel err; docs/fp8.md has the numbers.)"""
    from translator.tolerances import model_tol

    monkeypatch.setattr(fp8_mode, "FP8_WEIGHTS", "mxfp4")
    model, x = Mlp().eval(), torch.randn(2, 7, 256)
    tm = translate(model, (x,), arch="gfx950", backend="flysim", precision="fp8", verify=False)
    gemms = _mx_gemms(tm)
    assert len(gemms) == 2 and all(n.args[1].meta["val"].dtype == torch.uint8 and  # packed codes: K_pad / 2 bytes
                                   n.args[1].meta["val"].shape[1] == -(-n.args[3] // 128) * 64 for n in gemms)
    ref = translate(model, (x,), arch="gfx950", backend="reference", precision="fp8", verify=False)
    out = tm(x)
    assert sum(set(r.counters["mfma_by_kind"]) == {MFMA} for c in tm.last_calls if c.family == "gemm_fp8"
               for r in c.launches) == 2
    torch.testing.assert_close(out, ref(x), **model_tol("bf16"))
