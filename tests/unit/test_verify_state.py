"""translate() leaves the user's model as it found it: buffers a forward advances are restored
after every internal run, the translated module owns its copy of them, and a model in training
mode is said to be verified in eval mode."""

from __future__ import annotations

import pytest
import torch
from translator.tolerances import model_tol

from translator import InputError, translate


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("offset", torch.ones(16))

    def forward(self, x):
        self.steps += 1
        return torch.relu(self.lin(x)) * self.steps + self.offset


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_a_buffer_updating_model_is_not_advanced(backend):
    m = Counter()
    x = torch.randn(4, 16)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    tm = translate(m, (x,), backend=backend)
    assert tm.report.verification.passed, tm.report.verification.message
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=f"translate() changed {k}")
    # the translated module starts where the model is and advances its own copy, as the model would
    torch.testing.assert_close(tm(x), m(x), **model_tol(check="few_ops"))
    torch.testing.assert_close(tm(x), m(x), **model_tol(check="few_ops"))
    assert float(m.steps) == 2.0 and float(tm.gm.steps) == 2.0
    assert tm.gm.steps.data_ptr() != m.steps.data_ptr()
    if backend == "flysim":
        assert tm.last_launches  # the linear really ran as a FlyDSL kernel


def test_a_failing_verification_restores_state_too(monkeypatch):
    import translator.lowerings  # noqa: F401  (fills the registry)
    from translator.registry import FAMILIES
    fam = FAMILIES["gemm"]
    good = fam.reference
    monkeypatch.setattr(fam, "reference", lambda *a: good(*a) + 1.0)  # localization runs both graphs again
    m = Counter()
    tm = translate(m, (torch.randn(4, 16),), backend="reference")
    assert tm.report.verification.passed is False and tm.report.verification.divergence is not None
    assert float(m.steps) == 0.0 and float(tm.gm.steps) == 0.0


class WritesParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)

    def forward(self, x):
        self.scale.mul_(2.0)
        return x * self.scale


def test_a_model_writing_a_parameter_gets_a_clear_error():
    m = WritesParameter()
    with pytest.raises(InputError, match="writes its parameter.*register_buffer"):
        translate(m, (torch.randn(4),), backend="reference")


def test_training_mode_is_stated_and_kept():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    m.train()
    tm = translate(m, (torch.randn(2, 8),), backend="reference")
    assert m.training and all(c.training for c in m.modules())
    assert any("training mode" in n and "eval mode" in n for n in tm.report.capture_notes)
    assert tm.report.verification.passed
    assert "training mode" in tm.report.to_markdown()
