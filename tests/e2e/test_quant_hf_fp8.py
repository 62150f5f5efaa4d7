"""HF transformers' fine-grained fp8 (FineGrainedFP8Config(weight_block_size=(128, 128)), the DeepSeek-V3 layout) ->
flydsl.fp8_block_linear under flysim, both archs: a tiny Llama built from a config with random init, its linears
swapped for FP8Linear and quantized the way transformers quantizes on load (integrations.finegrained_fp8:
replace_with_fp8_linear, Fp8Quantize), the LM head kept as transformers keeps it. The hub kernel FP8Linear calls
(kernels-community/finegrained-fp8) cannot be downloaded here: its slot holds `_matmul_2d`, the kernel's math
re-typed from the well-known per-token-group quantization + block matmul (written for this test, independent of
the translator's reference). The rewrite fires for every FP8Linear, the kernels launch, the translation equals
eager; unsupported configurations stay in PyTorch with their reason."""

import types

import pytest
import torch

from translator import translate
from translator.tolerances import model_tol

T = pytest.importorskip("transformers")
from transformers.integrations import finegrained_fp8 as hf  # noqa: E402

E4M3 = torch.float8_e4m3fn
FP8_MFMA = {"mfma.f32.16x16x32.fp8.fp8", "mfma.scale.f32.16x16x128.f8f6f4"}


def _matmul_2d(x, w, w_scale_inv, block_size, out_dtype, activation_scale=None):
    """The finegrained-fp8 kernel's math: x quantized per token and group of block_size[1] (amax / 448), then
    C += (xq_kb @ W_(j, kb)ᵀ) * xs[:, kb] * ws[j, kb] over the 128 x 128 tiles of W, fp32, one cast."""
    assert activation_scale is None
    bn, bk = block_size
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    xg = x.reshape(-1, k // bk, bk).float()
    xs = (xg.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
    xq = (xg / xs).clamp(-448.0, 448.0).to(E4M3).float()
    out = torch.zeros(xg.shape[0], n)
    for j in range(-(-n // bn)):
        for kb in range(k // bk):
            tile = w[j * bn:(j + 1) * bn, kb * bk:(kb + 1) * bk].float()
            out[:, j * bn:(j + 1) * bn] += (xq[:, kb] @ tile.t()) * (xs[:, kb] * w_scale_inv[j, kb].float())
    return out.to(out_dtype).reshape(*lead, n)


@pytest.fixture
def hub_kernel(monkeypatch):
    monkeypatch.setattr(hf, "_FINEGRAINED_FP8", hf.FineGrainedFP8(_matmul_2d, None, None))
    monkeypatch.setattr(hf, "is_deepgemm_loadable", lambda: False)


def fp8_llama(block=(128, 128), scheme="dynamic", hidden=256, seed=0):
    torch.manual_seed(seed)
    cfg = T.LlamaConfig(vocab_size=512, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=256, max_position_embeddings=64)
    model = T.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.config._attn_implementation = "sdpa"
    qcfg = T.FineGrainedFP8Config(weight_block_size=block, activation_scheme=scheme)
    dense = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    hf.replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=qcfg)
    quantize = hf.Fp8Quantize(types.SimpleNamespace(quantization_config=qcfg))
    n_fp8 = 0
    for name, mod in model.named_modules():
        if isinstance(mod, hf.FP8Linear):
            out = quantize._quantize_one(f"{name}.weight", dense[name])
            mod.weight = torch.nn.Parameter(out[f"{name}.weight"], requires_grad=False)
            if scheme == "static":
                mod.activation_scale = torch.nn.Parameter(torch.tensor(0.05))
            if f"{name}.weight_scale_inv" not in out:  # not a whole number of blocks: transformers keeps it bf16
                mod.weight_scale_inv = torch.nn.Parameter(torch.ones(mod.weight_scale_inv.shape), requires_grad=False)
                continue
            mod.weight_scale_inv = torch.nn.Parameter(out[f"{name}.weight_scale_inv"], requires_grad=False)
            n_fp8 += 1
    ids = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), n_fp8


@pytest.mark.parametrize("arch", ["gfx950", pytest.param("gfx942", marks=pytest.mark.slow)])  # gfx942: registry oracle
def test_hf_finegrained_fp8_llama_runs_block_scaled_kernels(arch, hub_kernel):
    model, inputs, n_fp8 = fp8_llama()
    assert n_fp8 == 7 and model.model.layers[0].mlp.up_proj.weight.dtype == E4M3
    tm = translate(model, inputs, arch=arch, backend="flysim")
    assert tm.report.counters.get("hf_fp8_block") == n_fp8, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    fp8 = [r for r in tm.last_launches if FP8_MFMA & set(r.counters["mfma_by_kind"])]
    assert len(fp8) == n_fp8  # one block-scaled GEMM per FP8Linear (each after its quantize launch)
    with torch.no_grad():
        want = model(*inputs).logits
    torch.testing.assert_close(tm(*inputs).logits.float(), want.float(), **model_tol("bf16"))


def _matmul_any(x, w, s, block_size, out_dtype, activation_scale=None):
    """The hub slot for the other configurations: a static activation scale (x / sa rounded to e4m3fn, clamped
    at 448, times the dequantized weight: the static FP8Linear math of transformers' earlier in-tree kernel), the
    dynamic 128 x 128 form (_matmul_2d), and for a per-tensor weight with dynamic activations a per-token stand-in
    (the hub kernel's own rule there is not re-typed: the translator leaves that form in PyTorch)."""
    if block_size is None:
        wd = w.float() * s.float().reshape(())
    else:
        wd = w.float() * s.float().repeat_interleave(block_size[0], 0).repeat_interleave(block_size[1], 1)
    if activation_scale is not None:
        xs = activation_scale.float()
        xq = (x.float() / xs).clamp(-448.0, 448.0).to(E4M3).float() * xs
        return (xq @ wd.t()).to(out_dtype)
    if block_size is None:
        xs = (x.float().abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
        return (((x.float() / xs).clamp(-448.0, 448.0).to(E4M3).float() * xs) @ wd.t()).to(out_dtype)
    return _matmul_2d(x, w, s, block_size, out_dtype)


@pytest.fixture
def hub_kernel_any(monkeypatch):
    monkeypatch.setattr(hf, "_FINEGRAINED_FP8", hf.FineGrainedFP8(_matmul_any, None, None))
    monkeypatch.setattr(hf, "is_deepgemm_loadable", lambda: False)


def _static_fp8_linear(d_in, d_out, block, scale, seed):
    """transformers' own FP8Linear with activation_scheme='static', its weight quantized by Fp8Quantize."""
    qcfg = T.FineGrainedFP8Config(weight_block_size=block, activation_scheme="static")
    lin = hf.FP8Linear(d_in, d_out, block_size=block, activation_scheme="static")
    dense = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(seed)) / d_in ** 0.5
    out = hf.Fp8Quantize(types.SimpleNamespace(quantization_config=qcfg))._quantize_one("w.weight", dense)
    lin.weight = torch.nn.Parameter(out["w.weight"], requires_grad=False)
    lin.weight_scale_inv = torch.nn.Parameter(out["w.weight_scale_inv"], requires_grad=False)
    lin.activation_scale = torch.nn.Parameter(torch.tensor(scale))
    return lin


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_hf_fp8_static_linears(arch, hub_kernel_any):
    """Two static FP8Linears (128 x 128 block weight scales, then one per-tensor weight scale) around a GELU, in
    bf16: both become flydsl.fp8_static_linear, 2 launches each, and the translation equals eager."""
    class Two(T.PreTrainedModel):  # an HF model (adapters/hf.py captures its fp8 linears), no attention
        config_class = T.PretrainedConfig

        def __init__(self, config):
            super().__init__(config)
            self.a = _static_fp8_linear(256, 128, (128, 128), 0.01, 0)
            self.b = _static_fp8_linear(128, 48, None, 0.004, 1)

        def forward(self, x, return_dict=True):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    model = Two(T.PretrainedConfig(attn_implementation="eager")).eval()
    x = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    tm = translate(model, (x,), arch=arch, backend="flysim")
    assert tm.report.counters.get("hf_fp8_static") == 2, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    tm(x)
    calls = [c for c in tm.last_calls if c.family == "fp8_static_linear"]
    assert len(calls) == 2 and all(len(c.launches) == 2 for c in calls)
    with torch.no_grad():
        torch.testing.assert_close(tm(x).float(), model(x).float(), **model_tol("bf16"))


@pytest.mark.slow  # ~60 s each; test_hf_fp8_static_linears covers both weight-scale forms on both archs
@pytest.mark.parametrize("block,arch", [((128, 128), "gfx942"), (None, "gfx950")], ids=["block-128", "per-tensor"])
def test_hf_fp8_static_activation_scale(block, arch, hub_kernel_any):
    """activation_scheme='static' (FP8Linear.activation_scale): every fp8 linear becomes flydsl.fp8_static_linear,
    2 launches each (the static-scale quantize, the fp8 GEMM); the translation equals eager (the static math)."""
    model, inputs, n_fp8 = fp8_llama(block, "static", hidden=128)
    assert n_fp8 == (5 if block else 7)  # 128 x 128 blocks: k / v (N = 64) are not whole blocks, HF keeps them bf16
    tm = translate(model, inputs, arch=arch, backend="flysim")
    assert tm.report.counters.get("hf_fp8_static") == n_fp8, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    tm(*inputs)
    calls = [c for c in tm.last_calls if c.family == "fp8_static_linear"]
    assert len(calls) == n_fp8 and all(len(c.launches) == 2 for c in calls)
    fp8 = [r for r in tm.last_launches if FP8_MFMA & set(r.counters["mfma_by_kind"])]
    assert len(fp8) == n_fp8
    with torch.no_grad():
        want = model(*inputs).logits
    torch.testing.assert_close(tm(*inputs).logits.float(), want.float(), **model_tol("bf16"))
    # the scale is read on the device at each call: a new calibration value is used as it is
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, hf.FP8Linear):
                mod.activation_scale.mul_(2)
        want = model(*inputs).logits
    torch.testing.assert_close(tm(*inputs).logits.float(), want.float(), **model_tol("bf16"))


@pytest.mark.parametrize("block,scheme,why", [((64, 64), "dynamic", "only 128 x 128 block scales"),
                                              pytest.param(None, "dynamic", "one weight scale per tensor with dynamic",
                                                           marks=pytest.mark.slow)])
def test_hf_fp8_other_configs_stay_in_pytorch(block, scheme, why, hub_kernel_any):
    """Other block sizes and a per-tensor weight scale with dynamic activations: HF's own fp8_linear runs (here the
    hub slot's math), with the reason on the node."""
    model, inputs, _ = fp8_llama(block, scheme, hidden=128)
    tm = translate(model, inputs, arch="gfx950", backend="flysim")
    assert not tm.report.counters.get("hf_fp8_block") and not tm.report.counters.get("hf_fp8_static")
    reasons = " ".join(str(r.detail) for r in tm.report.rows)
    assert why in reasons, reasons
    assert tm.report.verification.passed, tm.report.verification.message
