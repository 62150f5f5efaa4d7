"""MX GEMMs as people write them, gfx950 under flysim: `torch._scaled_mm(x_q, W_q.t(), scale_a, scale_b)` with
float8_e8m0fnu block scales (torch's BlockWise1x32 recipe, ROCm's unswizzled [rows, K / 32] layout) ->
flydsl.gemm_fp8 with an MX weight (translator_kernels.gemm.mx). The rewrite fires, the scaled MFMA launches, and
the translated model equals the dequantized math (torch's CPU _scaled_mm has no MX path, so eager cannot run:
the reference dequantizes). Forms not taken stay in PyTorch with the reason."""

import pytest
import torch

from translator import translate
from translator.tolerances import model_tol
from translator_kernels.gemm import mx

MFMA = "mfma.scale.f32.16x16x128.f8f6f4"


@pytest.fixture
def cpu_mx_scaled_mm():
    """torch's CPU _scaled_mm has no MX path (it raises on e8m0 scales), so eager cannot run the models here. For
    the test's duration its CPU kernel is a stand-in with the GPU op's documented math (both operands dequantized,
    the fp32 matmul, + bias, one cast; scales read unswizzled, ROCm's layout); removed afterwards."""
    lib = torch.library.Library("aten", "IMPL")

    def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        if scale_a.dtype != torch.float8_e8m0fnu:
            raise NotImplementedError("the test's stand-in takes MX scales only")
        m, k = a.shape
        n = b.shape[1]
        y = mx.dequantize_mx(a, scale_a.reshape(-1, k // 32)[:m]) @ mx.dequantize_mx(b.t(), scale_b.reshape(-1, k // 32)[:n]).t()
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype or a.dtype)

    lib.impl("_scaled_mm", scaled_mm, "CPU")
    yield
    lib._destroy()


def _pad_rows(s, rows):
    """e8m0 [r, c] -> [rows, c] (torch's meta check wants 128-row multiples); pad bytes 127 (2^0), never read."""
    b = s.view(torch.uint8)
    return torch.nn.functional.pad(b, (0, 0, 0, rows - b.shape[0]), value=127).view(torch.float8_e8m0fnu)


def mx_quantize_torch(x):
    """The activation's MXFP8 quantization as a user writes it in torch ops (OCP rule: floor(log2 amax) - 8)."""
    g = x.float().reshape(*x.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = (torch.floor(torch.log2(amax)) - 8).clamp(-127, 127)
    e = torch.where(amax > 0, e, torch.full_like(e, -127))
    q = (g / torch.exp2(e)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(x.shape)
    return q, (e.squeeze(-1) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


class MxLinear(torch.nn.Module):
    """An MXFP8 linear for ROCm's torch._scaled_mm: W quantized once (e4m3fn + e8m0 per 32), x at run time."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        wq, ws = mx.quantize_mx(lin.weight.detach())
        n = wq.shape[0]
        self.register_buffer("w_mx", wq)
        self.register_buffer("w_scale", _pad_rows(ws, -(-n // 128) * 128))
        self.bias = torch.nn.Parameter(lin.bias.detach().to(torch.bfloat16)) if lin.bias is not None else None

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        xq, sa = mx_quantize_torch(x2)
        sa = _pad_rows(sa, -(-x2.shape[0] // 128) * 128)
        y = torch._scaled_mm(xq, self.w_mx.t(), sa, self.w_scale, bias=self.bias, out_dtype=torch.bfloat16)
        return y.reshape(*x.shape[:-1], -1)



class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = MxLinear(torch.nn.Linear(256, 160))
        self.down = MxLinear(torch.nn.Linear(128, 48, bias=False))

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x).float())[..., :128])


def test_scaled_mm_mx_lowers_to_the_mx_gemm(cpu_mx_scaled_mm):
    model = Mlp().eval()
    x = torch.randn(2, 5, 256)
    tm = translate(model, (x,), arch="gfx950", backend="flysim")
    assert tm.report.counters.get("scaled_mm_mx") == 2, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    out = tm(x)
    assert sum(set(rec.counters.get("mfma_by_kind", {})) == {MFMA} for rec in tm.last_launches) == 2
    torch.testing.assert_close(out.float(), model(x).float(), **model_tol("bf16"))
    assert all(torch.equal(tm(x), out) for _ in range(2))  # the recorded plan replays the same launches


def test_scaled_mm_mx_stays_in_pytorch_with_a_reason(cpu_mx_scaled_mm):
    """gfx942 has no scaled MFMA; a CUDA-swizzled scale layout is not ROCm's: both stay, with the reason."""
    model = Mlp().eval()
    tm = translate(model, (torch.randn(3, 256),), arch="gfx942", backend="flysim")
    assert not tm.report.counters.get("scaled_mm_mx")
    assert "need gfx950's scaled MFMA" in " ".join(str(r.detail) for r in tm.report.rows)

    swz = Mlp().eval()
    # cuBLAS's 128x4-swizzled 2-D shape [32 ceil(N / 128), 16 ceil(K / 128)] = [64, 32] for N 160, K 256
    swz.up.w_scale = swz.up.w_scale.view(torch.uint8).reshape(64, 32).view(torch.float8_e8m0fnu)
    tm = translate(swz, (torch.randn(3, 256),), arch="gfx950", backend="flysim")
    assert tm.report.counters.get("scaled_mm_mx") == 1
    assert "not the unswizzled [rows, K / 32]" in " ".join(str(r.detail) for r in tm.report.rows)


def test_torchao_mx_linear_stays_in_pytorch_with_a_reason():
    """torchao's MX inference linear (MXDynamicActivationMXWeightConfig; its weight an MXTensor subclass, the
    emulated kernel on CPU) translates: the linears stay in PyTorch with the reason (its dynamic MX activation
    quantization has no FlyDSL kernel), the rest runs as FlyDSL kernels, and the model equals eager. Before, the
    MXTensor reached the weight preshuffle and the translator failed with an InternalError."""
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.inference_workflow import MXDynamicActivationMXWeightConfig
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common import KernelPreference

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False), torch.nn.GELU(), torch.nn.Linear(128, 64))
    model = model.to(torch.bfloat16).eval()
    quantize_(model, MXDynamicActivationMXWeightConfig(kernel_preference=KernelPreference.EMULATED))
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    tm = translate(model, (x,), arch="gfx950", backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    linears = [r for r in tm.report.rows if r.op == "aten.linear"]
    assert len(linears) == 2 and all(r.where == "pytorch" and "torchao MX" in r.detail for r in linears)
    assert tm.report.counters.get("fused_elementwise") == 1  # the GELU
    torch.testing.assert_close(tm(x), model(x), rtol=0, atol=0)
