"""torch._scaled_mm with an fp8 weight (torchao float8 inference linears, hand-written fp8 linears) ->
flydsl.gemm_fp8 under flysim, both archs: the rewrite fires, the kernel launches, the translated model
equals eager's _scaled_mm within the bf16 tolerance; unsupported forms stay in PyTorch with a reason."""

import pytest
import torch

from translator import translate
from translator.tolerances import model_tol
from translator_kernels.arch import ARCHS
from translator_kernels.gemm.fp8 import fp8_dtype, quantize_fp8


class Fp8Linear(torch.nn.Module):
    """The shape of torchao's float8 dynamic-activation / float8-weight inference linear (re-typed from its
    well-known form): weight quantized once per output channel (or per tensor), the activation per token
    (rowwise) or per tensor at run time, then one torch._scaled_mm with bias and a bf16 output."""

    def __init__(self, lin: torch.nn.Linear, dtype, rowwise=True):
        super().__init__()
        wq, ws = quantize_fp8(lin.weight.detach(), dtype, dim=-1 if rowwise else None)
        self.register_buffer("w_fp8", wq)
        self.register_buffer("w_scale", ws.reshape(1, -1) if rowwise else ws.reshape(()))
        self.bias = torch.nn.Parameter(lin.bias.detach().to(torch.bfloat16)) if lin.bias is not None else None
        self.dtype, self.rowwise = dtype, rowwise

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        amax = x2.abs().amax(dim=-1, keepdim=True) if self.rowwise else x2.abs().amax()
        scale = (amax.float() / torch.finfo(self.dtype).max).clamp(min=1e-12)
        xq = (x2.float() / scale).clamp(-torch.finfo(self.dtype).max, torch.finfo(self.dtype).max).to(self.dtype)
        y = torch._scaled_mm(xq, self.w_fp8.t(), scale_a=scale, scale_b=self.w_scale, bias=self.bias,
                             out_dtype=torch.bfloat16)
        return y.reshape(*x.shape[:-1], -1)


class Mlp(torch.nn.Module):
    def __init__(self, arch, rowwise=True, fmt="fp8"):
        super().__init__()
        torch.manual_seed(0)
        dt = fp8_dtype(arch, fmt)
        self.up = Fp8Linear(torch.nn.Linear(64, 128), dt, rowwise)
        self.down = Fp8Linear(torch.nn.Linear(128, 48, bias=False), dt, rowwise)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x).float()))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_scaled_mm_lowers_to_fp8_gemm(arch, rowwise):
    model = Mlp(arch, rowwise).eval()
    x = torch.randn(2, 5, 64)
    tm = translate(model, (x,), arch=arch, backend="flysim")
    c = tm.report.counters
    if rowwise:  # the per-token quantization is the quantize kernel (lowerings.fp8_mode's pattern)
        assert c.get("scaled_mm_dynamic") == 2 and c.get("quantize_fp8") == 2 and not c.get("scaled_mm")
    else:
        assert c.get("scaled_mm") == 2
    assert tm.report.verification.passed, tm.report.verification.message
    fp8_mfma = {"mfma.f32.16x16x32.fp8.fp8", "mfma.scale.f32.16x16x128.f8f6f4"}
    assert sum(bool(fp8_mfma & set(rec.counters["mfma_by_kind"])) for rec in tm.last_launches) == 2
    torch.testing.assert_close(tm(x).float(), model(x).float(), **model_tol("bf16"))


@pytest.mark.parametrize("arch", ARCHS)
def test_scaled_mm_other_formats_stay_in_pytorch(arch):
    """The other arch's fp8 formats (OCP on gfx942, fnuz on gfx950) are not its MFMA's: a reason, no rewrite."""
    other = "gfx950" if arch == "gfx942" else "gfx942"
    model = Mlp(other).eval()
    tm = translate(model, (torch.randn(3, 64),), arch=arch, backend="flysim")
    assert not tm.report.counters.get("scaled_mm")
    reasons = " ".join(str(r.detail) for r in tm.report.rows)
    assert "is not an 8-bit float format of" in reasons


class WeightOnlyInt8Linear(torch.nn.Module):
    """gpt-fast's int8 weight-only linear, re-typed from its well-known form."""

    def __init__(self, lin: torch.nn.Linear, dtype):
        super().__init__()
        w = lin.weight.detach()
        scales = w.abs().amax(-1) / 127
        self.register_buffer("weight", torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(dtype))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(dtype=x.dtype)) * self.scales


@pytest.mark.parametrize("arch", ARCHS)
def test_weight_only_int8_lowers_to_gemm_w8(arch):
    torch.manual_seed(0)
    dt = torch.bfloat16
    model = torch.nn.Sequential(WeightOnlyInt8Linear(torch.nn.Linear(64, 128), dt), torch.nn.SiLU(),
                                WeightOnlyInt8Linear(torch.nn.Linear(128, 48), dt)).eval()
    x = torch.randn(2, 5, 64).to(dt)
    tm = translate(model, (x,), arch=arch, backend="flysim")
    assert tm.report.counters.get("w8_linear") == 2
    assert tm.report.verification.passed, tm.report.verification.message
    assert len([r for r in tm.last_launches if r.counters["mfma_by_kind"]]) == 2
    w8 = [b for n, b in tm.gm.named_buffers() if n.startswith("_flydsl_w8_")]
    assert w8 and all(b.dtype == torch.int8 for b in w8)  # the weights stay int8 on the device
