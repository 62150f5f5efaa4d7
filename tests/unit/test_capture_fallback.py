"""translate() must never modify, share or delete anything of the user's model, on every
capture path; the symbolic_trace fallback must still lower its linears."""

import copy

import pytest
import torch

import translator


class ConvLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 16)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv(x))))
        return self.fc(x.flatten(1)) * self.scale


def _fail_export(*a, **k):
    raise RuntimeError("torch.export forced to fail by the test")


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("export_fails", [False, True], ids=["torch.export", "symbolic_trace"])
def test_translate_never_touches_user_model(monkeypatch, export_fails):
    torch.manual_seed(0)
    model = ConvLinear().eval()
    before = _state(model)
    params_before = {k: id(v) for k, v in model.named_parameters()}
    if export_fails:
        monkeypatch.setattr(torch.export, "export", _fail_export)
    x = torch.randn(2, 3, 8, 8)
    x_before = x.clone()
    tm = translator.translate(model, (x,), backend="reference", verify=True)
    assert tm.report.capture == ("torch.fx.symbolic_trace" if export_fails else tm.report.capture)
    after = model.state_dict()
    assert set(after) == set(before), "translate() removed entries from the user's state_dict"
    for k, v in before.items():
        torch.testing.assert_close(after[k], v, rtol=0, atol=0)
    assert {k: id(v) for k, v in model.named_parameters()} == params_before
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)
    # the translated module holds none of the user's parameter tensors
    user_ptrs = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in user_ptrs for p in tm.parameters()) or not export_fails
    assert tm.report.verification.passed
    # the user's model still runs, unchanged
    torch.testing.assert_close(model(x), copy.deepcopy(model)(x))


def test_symbolic_trace_fallback_lowers_linear(monkeypatch):
    torch.manual_seed(0)
    model = ConvLinear().eval()
    monkeypatch.setattr(torch.export, "export", _fail_export)
    tm = translator.translate(model, (torch.randn(2, 3, 8, 8),), backend="reference")
    assert tm.report.capture == "torch.fx.symbolic_trace"
    assert any("flydsl" in n.meta for n in tm.gm.graph.nodes), tm.gm.code
    assert any(r.where != "pytorch" and "linear" in r.op for r in tm.report.rows), \
        [(r.op, r.where, r.detail) for r in tm.report.rows]
    assert tm.report.verification.passed
