"""Weight-only group-wise int4 linears -> flydsl.gemm_w4 under flysim, both archs: gpt-fast's int4 linear (its CPU
form, aten._weight_int4pack_mm_for_cpu, with its group quantizer re-typed from its well-known form) and a
hand-written unpack ((q - z) * s from packed nibbles, then F.linear). The rewrite fires, the kernels launch, the
translation equals eager within the bf16 tolerance; forms the kernel does not take stay in PyTorch with a reason."""

import pytest
import torch
import torch.nn.functional as F

from translator import translate
from translator.tolerances import model_tol
from translator_kernels.arch import ARCHS


def group_quantize(w, group, n_bit=4):
    """gpt-fast's asymmetric group quantizer: per (row, group) min / max -> (q in 0..15, scales_and_zeros [K/G, N, 2])
    with w ≈ (q - 8) * scale + zero."""
    wg = w.float().reshape(-1, group)
    lo, hi = wg.amin(1, keepdim=True), wg.amax(1, keepdim=True)
    scales = ((hi - lo).clamp(min=1e-6) / (2 ** n_bit - 1))
    zeros = lo + scales * 2 ** (n_bit - 1)
    q = ((wg - lo) / scales).round().clamp(0, 2 ** n_bit - 1).to(torch.int32).reshape(w.shape)
    sz = torch.cat([scales.reshape(w.shape[0], -1, 1), zeros.reshape(w.shape[0], -1, 1)], 2).transpose(0, 1)
    return q, sz.to(torch.bfloat16).contiguous()


class WeightOnlyInt4Linear(torch.nn.Module):
    """gpt-fast's int4 linear (re-typed), CPU kernel: x [.., K] -> aten._weight_int4pack_mm_for_cpu -> [.., N]."""

    def __init__(self, lin, group):
        super().__init__()
        q, sz = group_quantize(lin.weight.detach(), group)
        self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_and_zeros", sz)
        self.group, self.out_features = group, lin.out_features

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.weight, self.group, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features)


class UnpackInt4Linear(torch.nn.Module):
    """A hand-written int4 linear: two codes per byte (low nibble first), zero and scale per (row, group)."""

    def __init__(self, lin, group, signed=False):
        super().__init__()
        w = lin.weight.detach()
        n, k = w.shape
        wg = w.reshape(n, k // group, group)
        s = (wg.amax(-1) - wg.amin(-1)).clamp(min=1e-6) / 15
        z = (-wg.amin(-1) / s).round()
        q = (wg / s[..., None] + z[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        self.register_buffer("qweight", q[:, 0::2] | (q[:, 1::2] << 4))
        self.register_buffer("scales", s.to(torch.bfloat16))
        self.register_buffer("zeros", z.to(torch.bfloat16))
        self.bias = torch.nn.Parameter(lin.bias.detach().to(torch.bfloat16)) if lin.bias is not None else None
        self.group = group

    def forward(self, x):
        p = self.qweight
        q = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
        w = (q.reshape(q.shape[0], -1, self.group).to(x.dtype) - self.zeros.unsqueeze(-1)) * self.scales.unsqueeze(-1)
        return F.linear(x, w.reshape(q.shape[0], -1), self.bias)


def _mlp(cls, group, **kw):
    torch.manual_seed(0)
    return torch.nn.Sequential(cls(torch.nn.Linear(256, 128), group, **kw), torch.nn.SiLU(),
                               cls(torch.nn.Linear(128, 64), group, **kw)).eval()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("form,group", [("int4pack", 64), ("unpack", 32), ("unpack", 128)])
def test_int4_linears_lower_to_gemm_w4(arch, form, group):
    cls = WeightOnlyInt4Linear if form == "int4pack" else UnpackInt4Linear
    model = _mlp(cls, group)
    x = torch.randn(2, 5, 256).to(torch.bfloat16)
    tm = translate(model, (x,), arch=arch, backend="flysim")
    lowering = "int4pack_mm" if form == "int4pack" else "w4_linear"
    assert tm.report.counters.get(lowering) == 2, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    assert len([r for r in tm.last_launches if r.counters["mfma_by_kind"]]) == 2
    w4 = [b for name, b in tm.gm.named_buffers() if name.startswith("_flydsl_w4_")]
    assert len(w4) == 2 and all(b.dtype == torch.uint8 for b in w4)  # the codes stay packed on the device
    torch.testing.assert_close(tm(x).float(), model(x).float(), **model_tol("bf16"))


def test_int4_fp32_activation_stays_in_pytorch():
    model = _mlp(UnpackInt4Linear, 64).float()
    tm = translate(model, (torch.randn(3, 256),), arch="gfx942", backend="flysim")
    assert not tm.report.counters.get("w4_linear")
    reasons = " ".join(str(r.detail) for r in tm.report.rows)
    assert "the int4 GEMM takes bf16 / fp16" in reasons, reasons
