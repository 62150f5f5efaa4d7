"""translator.truth.run_as: the model in another dtype with its weights cast module by module (never a
second copy of the model), whole where a module reads another's weights, the model left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from translator.tolerances import model_tol
from translator.truth import CastRunError, run_as


class Stack(nn.Module):
    def __init__(self, n=4, d=32):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.register_buffer("shift", torch.full((d,), 0.5))

    def forward(self, x):
        for lin in self.layers:
            x = torch.tanh(lin(x))
        return x + self.shift


def test_weights_are_cast_one_module_at_a_time():
    m = Stack()
    params = {n: (p, p.dtype) for n, p in m.named_parameters()}
    widest = []

    def count(_mod, _args, _out):  # a forward hook registered before run_as's: runs before its restore, copy live
        widest.append(sum(p.numel() for mod in m.modules() for p in mod._parameters.values()
                          if p is not None and p.dtype == torch.float64))

    for lin in m.layers:
        lin.register_forward_hook(count)
    x = torch.randn(3, 32)
    out = run_as(m, (x,), torch.float64)
    assert out.dtype == torch.float64
    ref = Stack()
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(out, ref.double()(x.double()), rtol=0, atol=0)  # the same math as a full fp64 copy
    # while a layer runs, only its own weights exist in fp64 (one layer: 32*32 + 32), never the model's
    assert widest == [32 * 32 + 32] * 4, widest
    for n, p in m.named_parameters():  # the model is as it was: the same objects, in fp32
        assert p is params[n][0] and p.dtype == params[n][1]
    assert m.shift.dtype == torch.float32


class Tied(nn.Module):
    """Reads another module's weight without calling it (a tied output projection)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, ids):
        h = self.proj(self.embed(ids))
        return torch.nn.functional.linear(h, self.embed.weight)


def test_a_module_reading_another_modules_weight_runs_whole():
    m = Tied()
    ids = torch.tensor([[1, 2, 3]])
    out = run_as(m, (ids,), torch.float64)
    ref = Tied()
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(out, ref.double()(ids), rtol=0, atol=0)
    assert all(p.dtype == torch.float32 for p in m.parameters())


class Unreachable(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.held = [torch.zeros(4)]  # state in a plain list: no run can cast it

    def forward(self, x):
        return self.held[0].index_copy_(0, torch.arange(2), self.lin(x)[0, :2])


def test_a_run_that_cannot_cast_raises_one_clear_error(capfd):
    with pytest.raises(CastRunError, match="index_copy_.*same dtype"):
        run_as(Unreachable(), (torch.randn(2, 4),), torch.float64)
    assert "Traceback" not in capfd.readouterr().err


def test_convolutions_run_in_the_models_dtype():
    # a conv stays in PyTorch in every translation; in fp64 it would take CPU im2col paths (many times the memory)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    seen = []
    m[0].register_forward_hook(lambda mod, args, out: seen.append((args[0].dtype, mod.weight.dtype, out.dtype)))
    m[3].register_forward_hook(lambda mod, args, out: seen.append((args[0].dtype, mod.weight.dtype, out.dtype)))
    x = torch.randn(2, 3, 8, 8)
    out = run_as(m, (x,), torch.float64)
    assert seen == [(torch.float32,) * 3, (torch.float64,) * 3], seen  # per module, not the whole-model fallback
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, m(x).double(), **model_tol())


def _hf_moe():
    """A tiny HF Qwen3-MoE (random init): its experts call F.grouped_mm, which has no fp64 kernel."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.Qwen3MoeConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, intermediate_size=48, moe_intermediate_size=24,
                           num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    m = T.Qwen3MoeForCausalLM(cfg).eval()
    m.config._attn_implementation = "sdpa"
    return m, torch.randint(0, 100, (2, 5))


def test_an_hf_moe_model_runs_in_fp64():
    # torch._grouped_mm takes fp32 / bf16 / fp16 only: the fp64 truth of every HF MoE model was skipped
    # ("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"), so fp32 verification had no truth
    m, ids = _hf_moe()
    out = run_as(m, (ids,), torch.float64).logits
    assert out.dtype == torch.float64
    m.set_experts_implementation("eager")  # HF's per-expert loop of F.linear, which runs in fp64 as written
    torch.testing.assert_close(out, run_as(m, (ids,), torch.float64).logits, rtol=1e-12, atol=1e-12)
    assert all(p.dtype == torch.float32 for p in m.parameters())


class AtenGrouped(nn.Module):
    """torch's grouped GEMM as a graph module calls it (the aten op, offs by position)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 8, 4))

    def forward(self, x):
        return torch.ops.aten._grouped_mm.default(x, self.w, torch.tensor([2, 2, 5], dtype=torch.int32))


def test_the_aten_grouped_mm_runs_in_fp64():
    m, x = AtenGrouped(), torch.randn(6, 8)
    out = run_as(m, (x,), torch.float64)
    w, xd = m.w.detach().double(), x.double()
    want = torch.cat([xd[:2] @ w[0], xd[2:5] @ w[2], torch.zeros(1, 4, dtype=torch.float64)])  # row 5: past offs[-1]
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_a_seeded_moe_mismatch_is_judged_with_the_fp64_truth(monkeypatch):
    from translator import translate
    from translator.registry import FAMILIES

    m, ids = _hf_moe()
    fam = FAMILIES["moe_experts"]
    good = fam.reference
    monkeypatch.setattr(fam, "reference", lambda *a, **k: good(*a, **k) * 1.01)  # every expert output 1 % off
    v = translate(m, (ids,), backend="reference").report.verification
    assert v.passed is False, v.message
    assert v.calibration.startswith("eager fp32 vs eager fp64"), v.calibration  # the truth ran: not "skipped"
    assert v.divergence is not None and v.divergence.op == "flydsl.moe_experts", v.divergence
