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
