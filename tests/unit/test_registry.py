"""Every registered FlyDSL op: its kernel (run by flysim) and its reference both match plain
torch math that is independent of the kernel library (a small nn.Module per family, run in
eager fp32), within the one tolerance table, and the kernel's call recorded a launch; the fake
implementation agrees with the real output's shape and dtype; the registry is well-formed."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator import runtime
import translator.lowerings  # noqa: F401  (fills the registry)
from translator.registry import FAMILIES, RULES
from translator.report.ops_table import supported_ops_markdown
from translator.tolerances import op_tolerance

class Fn(nn.Module):
    def __init__(self, fn, *mods):
        super().__init__()
        self.fn, self.mods = fn, nn.ModuleList(mods)

    def forward(self, *xs):
        return self.fn(self.mods, *xs)


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


# per family: plain torch (module, inputs) whose translation is that family's op
ORACLES = {
    "gemm": lambda: (Fn(lambda m, x, r: F.gelu(m[0](x)) + r, nn.Linear(40, 24)), (_r(5, 40), _r(5, 24))),
    "bmm": lambda: (Fn(lambda m, a, b: a @ b), (_r(2, 7, 16), _r(2, 16, 9))),
    "attention": lambda: (Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                          (_r(1, 2, 16, 32), _r(1, 2, 16, 32, seed=1), _r(1, 2, 16, 32, seed=2))),
    "layer_norm": lambda: (Fn(lambda m, x: m[0](x), nn.LayerNorm(48)), (_r(6, 48),)),
    "rms_norm": lambda: (Fn(lambda m, x: m[0](x), nn.RMSNorm(48, eps=1e-6)), (_r(6, 48),)),
    "add_layer_norm": lambda: (Fn(lambda m, x, r: (lambda h: (h, m[0](h)))(x + r), nn.LayerNorm(48)),
                               (_r(6, 48), _r(6, 48, seed=1))),
    "add_rms_norm": lambda: (Fn(lambda m, x, r: (lambda h: (h, m[0](h)))(x + r), nn.RMSNorm(48, eps=1e-6)),
                             (_r(6, 48), _r(6, 48, seed=1))),
    "norm_add_rms_norm": lambda: (Fn(lambda m, x, r: (lambda h: (h, m[1](h)))(r + m[0](x)), nn.RMSNorm(48, eps=1e-6),
                                     nn.RMSNorm(48, eps=1e-6)), (_r(6, 48), _r(6, 48, seed=1))),  # Gemma's sandwich
    "norm_add": lambda: (Fn(lambda m, x, r: r + m[0](x), nn.RMSNorm(48, eps=1e-6)), (_r(6, 48), _r(6, 48, seed=1))),
    "group_norm": lambda: (Fn(lambda m, x: m[0](x), nn.GroupNorm(4, 16)), (_r(2, 16, 5, 3),)),
    "softmax": lambda: (Fn(lambda m, x: torch.softmax(x, -1)), (_r(6, 50) * 3.0 + 100.0,)),  # needs max subtraction
    "fused_elementwise": lambda: (Fn(lambda m, a, b: torch.tanh(a) * torch.sigmoid(b) + a.exp() / (b.abs() + 1)),
                                  (_r(6, 33), _r(6, 33, seed=1))),
    "fused_reduce": lambda: (Fn(lambda m, x: (x * x).mean(-1) + x.amax(-1)), (_r(6, 70),)),
    "scan": lambda: (Fn(lambda m, x: torch.cumsum(x.exp(), 1)), (_r(4, 37),)),
    "embedding": lambda: (Fn(lambda m, ids: m[0](ids), nn.Embedding(40, 24)),
                          (torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(0)),)),
    "gemm_gated": lambda: (Fn(lambda m, x: F.silu(m[0](x)) * m[1](x), nn.Linear(40, 24), nn.Linear(40, 24)),
                           (_r(5, 40),)),
    "layout": lambda: (Fn(lambda m, x: F.pad(x, (1, 2, -1, 1), value=0.5)), (_r(5, 6),)),
    "cache_write": lambda: (_Cache(), (_r(1, 2, 3, 4), torch.tensor([1, 4, 6]))),
    "elementwise_": lambda: (_Ema(), (_r(3, 8),)),
    "rope": lambda: (Fn(lambda m, x, c, s: x * c + torch.cat((-x[..., 4:], x[..., :4]), -1) * s),  # rotate-half
                     (_r(1, 2, 3, 8), _r(1, 1, 3, 8, seed=1), _r(1, 1, 3, 8, seed=2))),
    "moe_topk": lambda: (Fn(lambda m, x: (lambda v: v / v.sum(-1, keepdim=True))(
        torch.topk(torch.softmax(x, -1, dtype=torch.float32), 2, dim=-1).values)), (_r(7, 8),)),
    "moe_experts": lambda: (Fn(_moe_loop, nn.Linear(32, 4, bias=False), *[nn.Linear(32, 48, bias=False) for _ in range(8)],
                               *[nn.Linear(48, 32, bias=False) for _ in range(4)]), (_r(6, 32),)),
    "gemm_fp8": lambda: _fp8_oracle(),
    "quantize_fp8": lambda: _fp8_dynamic_oracle(),
    "norm_fp8": lambda: _fp8_norm_oracle(nn.RMSNorm(48, eps=1e-6)),
    "add_norm_fp8": lambda: _fp8_norm_oracle(nn.LayerNorm(48), residual=True),
    "quantize_fp8_program": lambda: _fp8_prologue_oracle(),
    "gemm_w8": lambda: _w8_oracle(),
    "fp8_block_linear": lambda: _fp8_block_oracle(),
    "gemm_w4": lambda: _w4_oracle(),
    "gemm_fp8_gated": lambda: _fp8_gated_oracle(),
    "moe_experts_fp8": lambda: _moe_fp8_oracle(),
    "fp8_static_linear": lambda: _fp8_block_oracle(static=torch.tensor(0.01)),
}


class _Cache(nn.Module):
    """A KV cache buffer written at positions (index_put_), then read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))

    def forward(self, x, pos):
        self.cache[:, :, pos] = x
        return self.cache * 1


class _Ema(nn.Module):
    """Running statistics updated in place (mul_, add_ with alpha), then read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.ones(3, 8))

    def forward(self, x):
        self.ema.mul_(0.9).add_(x, alpha=0.1)
        return self.ema * 1


def _moe_loop(m, x):
    """Top-2 of 4 SwiGLU experts, written as a loop with where / index_add_ (translator/lowerings/moe.py)."""
    w, top = torch.topk(torch.softmax(m[0](x), -1, dtype=torch.float32), 2, dim=-1)
    out = torch.zeros_like(x)
    for e in range(4):
        tok, slot = torch.where(top == e)
        xe = x[tok]
        y = m[9 + e](F.silu(m[1 + 2 * e](xe)) * m[2 + 2 * e](xe))
        out.index_add_(0, tok, (y * w[tok, slot, None]).to(x.dtype))
    return out


def _w8_oracle():
    """Weight-only int8 as gpt-fast writes it: F.linear(x, w_int8.to(x.dtype)) * scales."""
    w8 = torch.randint(-128, 128, (24, 48), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    s = _r(24).abs() / 100
    return Fn(lambda m, x: F.linear(x, w8.to(x.dtype)) * s), (_r(5, 48),)


def _w4_oracle():
    """A hand-written int4 linear (lowerings/quant_w4.py): codes from nibbles, (q - z) * s per group of 32, bf16."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (24, 64), generator=g, dtype=torch.uint8)
    p = q[:, 0::2] | (q[:, 1::2] << 4)
    z, s = torch.randint(0, 16, (24, 2, 1), generator=g).to(torch.bfloat16), (_r(24, 2, 1).abs() / 50).to(torch.bfloat16)

    def f(m, x):
        w = ((torch.stack([p & 0xF, p >> 4], -1).reshape(24, 2, 32).to(torch.bfloat16) - z) * s).reshape(24, 64)
        return F.linear(x.to(torch.bfloat16), w).float()
    return Fn(f), (_r(5, 64),)


def _fp8_block_oracle(static=None):
    """HF's fine-grained fp8 linear as captured (translator/adapters/hf_quant.py), with its torch math; `static`:
    a fixed activation scale (activation_scheme='static')."""
    from translator_kernels.gemm.fp8 import quantize_fp8_blocks

    w8, ws = quantize_fp8_blocks(_r(160, 256), torch.float8_e4m3fn, (128, 128))
    return Fn(lambda m, x: torch.ops.flydsl_hf.fp8_linear(x, w8, ws, [128, 128], None, static)), (_r(5, 256),)


def _fp8_oracle(dt=torch.float8_e4m3fnuz):
    """torch._scaled_mm of an fp8 constant weight; x travels as its bytes (uint8) so the test's casts
    leave it alone, and the output is fp32 (the only difference left: the fp32 summation order)."""
    w8, ws, sa = (_r(24, 48) * 8).to(dt), _r(1, 24).abs() + 0.5, _r(5, 1).abs() + 0.5
    return (Fn(lambda m, x: torch._scaled_mm(x.view(dt), w8.t(), scale_a=sa, scale_b=ws, out_dtype=torch.float32)),
            ((_r(5, 48) * 8).to(dt).view(torch.uint8),))


def _fp8_dynamic_oracle(norm=None, residual=False, dt=torch.float8_e4m3fnuz):
    """Per-token quantization (lowerings.fp8_mode's form) feeding torch._scaled_mm; with `norm`, of a norm's
    output (of x + r, also returned, with `residual`): the norm then writes the fp8 input (norm_fp8.py)."""
    fmax, w8, ws = torch.finfo(dt).max, (_r(24, 48) * 8).to(dt), _r(1, 24).abs() + 0.5

    def f(m, x, *r):
        h = x + r[0] if r else x
        x = m[0](h) if m else h
        s = (x.abs().amax(-1, keepdim=True).float() / fmax).clamp(min=1e-12)
        q = (x.float() / s).clamp(-fmax, fmax).to(dt)
        y = torch._scaled_mm(q, w8.t(), scale_a=s, scale_b=ws, out_dtype=torch.float32)
        return (h, y) if r else y
    return Fn(f, *([norm] if norm is not None else [])), (_r(5, 48), *([_r(5, 48, seed=1)] if residual else []))


def _fp8_gated_oracle():
    """A SwiGLU pair under precision="fp8" (lowerings/gated_fp8.py) on +-powers of two: every row's |max| is a power
    of two, so the per-token and per-channel fp8 quantization is exact and only the bf16 output rounds."""
    g = torch.Generator().manual_seed(0)

    def pow2(*shape):
        return torch.randint(-3, 3, shape, generator=g).float().exp2() * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    gate, up = nn.Linear(48, 24, bias=False), nn.Linear(48, 24, bias=False)
    with torch.no_grad():
        gate.weight.copy_(pow2(24, 48))
        up.weight.copy_(pow2(24, 48))
    return Fn(lambda m, x: F.silu(m[0](x)) * m[1](x), gate, up), (pow2(5, 48),), {"precision": "fp8"}


def _moe_fp8_oracle():
    """_moe_loop under precision="fp8" (lowerings/moe_fp8.py) with +-power-of-two experts and inputs: the first
    quantization is exact; the hidden activation's per-token fp8 rounding is the family's tolerance."""
    g = torch.Generator().manual_seed(0)

    def pow2(*shape):
        return torch.randint(-3, 3, shape, generator=g).float().exp2() * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    router = nn.Linear(32, 4, bias=False)
    experts = [nn.Linear(32, 48, bias=False) for _ in range(8)] + [nn.Linear(48, 32, bias=False) for _ in range(4)]
    with torch.no_grad():
        router.weight.copy_(torch.randn(4, 32, generator=g) * 4)  # far from ties: bf16 routing picks eager's experts
        for lin in experts:  # outputs of order 1
            lin.weight.copy_(pow2(*lin.weight.shape) / (8 if lin.in_features == 32 else 64))
    return Fn(_moe_loop, router, *experts), (pow2(6, 32),), {"precision": "fp8"}


def _fp8_prologue_oracle():
    """relu(a) * b feeding the dynamic fp8 form (the elementwise kernel joins the quantize: quantize_fold.py),
    on +-powers of two: exact in bf16 and in fp8, so a bf16 run matches the fp32 oracle."""
    model, _ = _fp8_dynamic_oracle()
    g = torch.Generator().manual_seed(0)

    def pow2(*shape):
        return torch.randint(-3, 3, shape, generator=g).float().exp2() * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    return Fn(lambda m, a, b: model(torch.relu(a) * b)), (pow2(5, 48), pow2(5, 48))


def _fp8_norm_oracle(norm, residual=False):
    """A norm feeding the dynamic fp8 form, on rows whose normalized values are +-w with power-of-two weights:
    q / s is exact in fp8, so a bf16 run rounds to the same fp8 values as the fp32 oracle (elsewhere one
    fp8 step, 6-12 %, can separate the two)."""
    with torch.no_grad():
        norm.weight.copy_(2.0 ** -(torch.arange(48) % 4))
    x = torch.ones(5, 48)
    x[:, 1::2] = -1  # zero mean, unit variance
    model, _ = _fp8_dynamic_oracle(norm, residual)
    return model, (x, *([x.clone()] if residual else []))
CASES = [(name, dt) for name in sorted(FAMILIES) for dt in (torch.float32, torch.bfloat16)]


def _run(fam, args, backend):
    with runtime.use_backend(backend, "gfx942"):
        return fam.op(*args)


def test_every_family_has_an_oracle():
    assert set(ORACLES) == set(FAMILIES)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_kernel_matches_plain_torch_on_flysim(name, dtype):
    fam = FAMILIES[name]
    model, inputs, *how = ORACLES[name]()  # how: translate's keywords where the family needs them (precision)
    model, inputs = model.eval().to(dtype), tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():  # the oracle: eager fp32 on the same (rounded) weights and inputs
        want = copy.deepcopy(model).float()(*(x.float() if x.is_floating_point() else x for x in inputs))
    atol, rtol = op_tolerance(dtype, fam)
    for backend in ("reference", "flysim"):
        tm = translator.translate(model, inputs, backend=backend, verify=False, dynamic_shapes=None, **dict(*how))
        with torch.no_grad():
            got = tm(*inputs)
        calls = [c for c in tm.last_calls if c.family == name]
        assert calls, f"{name}: the oracle did not translate to flydsl.{name}: {tm.report.counters}"
        if backend == "flysim":
            assert all(c.launches for c in calls), f"flydsl.{name} made no kernel launch under flysim"
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(g.float(), w, atol=atol, rtol=rtol,
                                       msg=lambda m: f"{backend}: {m}")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fake_matches_reference_metadata(name):
    fam = FAMILIES[name]
    args = fam.sample_inputs(torch.float32)
    ref = _run(fam, args, "reference")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = fam.op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    if ref is None:  # an op that writes its argument in place (flydsl.cache_write) returns nothing
        assert fake is None
        return
    for f, r in zip(fake if isinstance(fake, (list, tuple)) else [fake], ref if isinstance(ref, (list, tuple)) else [ref]):
        assert tuple(f.shape) == tuple(r.shape) and f.dtype == r.dtype


def test_every_rule_names_a_family_and_has_a_doc():
    for r in RULES:
        assert r.family in FAMILIES, r.name
        assert r.doc, f"rule {r.name} has no doc"
    table = supported_ops_markdown()
    assert all(f"`flydsl.{n}`" in table for n in FAMILIES)
