"""GEMM epilogue fusion: bias / activation / residual / scale after a gemm fold into it
(counters asserted, no leftover PyTorch node), numerics vs eager on the reference backend and
on flysim (the FlyDSL GEMM's fused epilogue)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import translate


class MLPBlock(nn.Module):
    """ViT / GPT-2 MLP: x + drop(proj(gelu(fc(x))))."""

    def __init__(self, d=64, approximate="none"):
        super().__init__()
        self.fc, self.proj, self.drop, self.approximate = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.Dropout(0.1), approximate

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Conv1DStyle(nn.Module):
    """HF GPT-2 Conv1D: addmm-free form mm(x, W) + b, then relu; and a scaled projection."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 48) * 0.1)
        self.b = nn.Parameter(torch.randn(48))
        self.w2 = nn.Parameter(torch.randn(48, 32) * 0.1)

    def forward(self, x):
        h = torch.relu(torch.mm(x, self.w) + self.b)
        return F.silu(torch.mm(h, self.w2) * 0.5)


def gemm_nodes(tm):
    return [n for n in tm.gm.graph.nodes if getattr(n.target, "namespace", "") == "flydsl"]


@pytest.mark.parametrize("backend", ["reference", "flysim"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_mlp_block_activation_and_residual(backend, approximate):
    torch.manual_seed(0)
    m = MLPBlock(approximate=approximate).eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend=backend)
    c = tm.report.counters
    assert c["epilogue_activation"] == 1 and c["epilogue_residual"] == 1, c
    (fc, proj) = gemm_nodes(tm)
    assert fc.args[5] == ("gelu_tanh" if approximate == "tanh" else "gelu") and proj.args[6] is not None
    ops = [n.target for n in tm.gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.gelu.default not in ops and torch.ops.aten.add.Tensor not in ops
    assert tm.report.verification.passed, tm.report.verification.message
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_bias_relu_scale_silu(backend):
    torch.manual_seed(0)
    m = Conv1DStyle().eval()
    x = torch.randn(7, 64)
    tm = translate(m, (x,), backend=backend)
    c = tm.report.counters
    assert c["epilogue_bias"] == 1 and c["epilogue_activation"] == 2 and c["epilogue_scale"] == 1, c
    g1, g2 = gemm_nodes(tm)
    assert g1.args[4] is not None and g1.args[5] == "relu"
    assert g2.args[7] == 0.5 and g2.args[5] == "silu"
    assert tm.report.verification.passed, tm.report.verification.message
    rows = {r.op: r.where for r in tm.report.rows}
    assert rows["aten.relu"].startswith("flydsl") and rows["aten.silu"].startswith("flydsl")


def test_scale_after_bias_is_not_folded():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 16)

        def forward(self, x):
            return self.fc(x) * 2.0

    m = M().eval()
    x = torch.randn(3, 32)
    tm = translate(m, (x,), backend="reference")
    assert "epilogue_scale" not in tm.report.counters  # 2 * (xW + b) != (2 * xW) + b
    assert tm.report.verification.passed
