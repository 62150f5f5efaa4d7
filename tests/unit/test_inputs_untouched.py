"""translate() never changes the example inputs it is given, and each of its internal runs sees
them as given: before, a model that writes an input in place (`x.mul_(2)`) had the user's tensor
doubled by the eager check, again by calibration and by verification, and then failed
verification because the translated run was given the already-doubled input."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from translator import translate
from translator.tolerances import model_tol


class ScalesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, n: int):
        x.mul_(2)  # in place, on the caller's tensor
        return self.fc(x) * n


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_an_input_writing_model_leaves_the_example_inputs_alone(backend):
    torch.manual_seed(0)
    m = ScalesItsInput().eval()
    x = torch.randn(4, 16)
    given = x.clone()
    tm = translate(m, (x, 3), backend=backend)
    torch.testing.assert_close(x, given, rtol=0, atol=0)
    assert tm.report.verification.passed, tm.report.verification.message
    # called, the translated module does what the model does, the write to its input included
    a, b = given.clone(), given.clone()
    with torch.no_grad():
        torch.testing.assert_close(tm(a, 3), m(b, 3), **model_tol(check="few_ops"))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, given * 2, rtol=0, atol=0)
    if backend == "flysim":
        assert tm.last_launches  # the linear ran as a FlyDSL kernel
