"""TranslatedModule.forward checks its inputs once per input signature (dtype, shape, device): a
signature that passed is not checked again, and every other one still gets its clear error,
also after good calls."""

import pytest
import torch
import torch.nn as nn

from translator import translate
from translator.errors import DeviceError, DtypeError, ShapeError


@pytest.fixture(scope="module")
def tm():
    torch.manual_seed(0)
    return translate(nn.Sequential(nn.Linear(32, 16), nn.ReLU()).eval(), (torch.randn(4, 32),),
                     backend="reference", verify=False)


def test_checked_once_per_signature_and_bad_inputs_still_refused(tm, monkeypatch):
    checks = []
    orig = type(tm)._check_inputs
    monkeypatch.setattr(type(tm), "_check_inputs", lambda self, args: checks.append(1) or orig(self, args))
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(3):
            tm(x)
        n = len(checks)
        assert n <= 1  # 0 where an earlier test passed this signature already
        for bad, err, msg in [(x.double(), DtypeError, "translated for float32"),
                              (torch.randn(4, 16), ShapeError, "dim 1 is 16"),
                              (torch.randn(4, 32, 1), ShapeError, "has 3 dims"),
                              (torch.randn(4, 32, device="meta"), DeviceError, "meta device")]:
            for _ in range(2):  # a refused signature is never remembered as passed
                with pytest.raises(err, match=msg):
                    tm(bad)
        with pytest.raises(ShapeError, match="takes 1 inputs, got 2"):
            tm(x, x)
        tm(torch.randn(7, 32))  # a new batch size: checked once, then passes
        tm(x)
    assert len(checks) == n + 8 + 1 + 1
