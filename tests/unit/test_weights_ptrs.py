"""translator.weights compares the tracked data pointers in one C call where torch has one (CUDA / ROCm
builds: torch._C._tensors_data_ptrs_at_indices_equal); here, a Python stand-in of the same contract:
a storage re-pointed while the old one stays alive (no weak-reference callback fires) is still seen."""

import torch

import translator
from translator import weights


def test_re_pointed_weight_is_seen_through_the_one_call(monkeypatch):
    calls = []

    def equal(tensors, ptrs, idx):  # the C function's contract
        calls.append(len(idx))
        return all(tensors[i].data_ptr() == ptrs[i] for i in idx)

    monkeypatch.setattr(weights, "_PTRS_EQUAL", equal)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    tm = translator.translate(m, (x,), backend="reference")
    with torch.no_grad():
        tm(x)
        assert calls and calls[-1] >= 2  # every tracked weight, one call
        kept = m[0].weight.data  # the old storage stays alive: only the pointer comparison can tell
        m[0].weight.data = torch.randn(8, 8)
        torch.testing.assert_close(tm(x), m(x))
    assert kept.data_ptr() != m[0].weight.data_ptr()
