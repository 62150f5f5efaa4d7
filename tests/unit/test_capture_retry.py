"""A pass that fails on a dynamic-dims capture is retried on a static capture (and the report says
so); an unexpected error of the passes is an InternalError (a TranslatorError), never a bare one."""

import pytest
import torch
import torch.nn as nn

import translator.passes as passes
from translator import TranslatorError, translate
from translator.errors import InternalError


class TimeShift(nn.Module):
    """HF RWKV's time shift: ZeroPad2d((0, 0, 1, -1)), a constant pad that crops the sequence dim.
    Its fake implementation cannot run on a symbolic sequence length (a bare RuntimeError before)."""

    def __init__(self):
        super().__init__()
        self.shift = nn.ZeroPad2d((0, 0, 1, -1))
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        return self.shift(h) * h


def test_symbolic_failure_in_a_pass_is_retried_with_static_shapes():
    m = TimeShift().eval()
    x = torch.randn(2, 8, 16)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.capture == "torch.export (static)"
    assert any("captured again with static shapes" in n and "storage_offset" in n for n in tm.report.capture_notes)
    assert tm.report.verification.passed, tm.report.verification.message
    torch.testing.assert_close(tm(x), m(x))


def test_unexpected_error_in_a_pass_is_an_internal_error(monkeypatch):
    def broken(ctx):
        raise KeyError("boom")

    monkeypatch.setattr(passes, "PIPELINE", [*passes.PIPELINE[:1], ("broken", broken)])
    with pytest.raises(InternalError, match="KeyError.*translator bug") as e:
        translate(nn.Linear(4, 4).eval(), (torch.randn(3, 4),), backend="reference")
    assert isinstance(e.value, TranslatorError)
