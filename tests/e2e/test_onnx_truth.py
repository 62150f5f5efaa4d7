"""An .onnx file is verified against ONNX Runtime's execution of the original file (issue 32 item 1).

A bug seeded in the importer (Gemm's transB read the wrong way round) is in both our import and
the translation of it: against the import it verifies, against ONNX Runtime it fails, and the
message names the ONNX node the import gets wrong."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import translator
from translator.adapters import onnx_import, onnx_truth

pytest.importorskip("onnxruntime")


class Square(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def square_onnx(tmp_path):
    torch.manual_seed(0)
    m = Square().eval()
    x = torch.randn(4, 16)
    path = tmp_path / "square.onnx"
    torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17)
    return m, x, path


def _seed_transposed_gemm(monkeypatch):
    real = onnx_import.OPS["Gemm"]

    def gemm_trans_b_flipped(n, a, b, c=None):  # the seeded bug: transB taken the wrong way round
        attrs = dict(n.attrs, transB=1 - n.attrs.get("transB", 0))
        return real(onnx_import._Node(n.op_type, n.name, n.inputs, n.outputs, attrs), a, b, c)

    monkeypatch.setitem(onnx_import.OPS, "Gemm", gemm_trans_b_flipped)


def test_verified_against_onnx_runtime(square_onnx):
    m, x, path = square_onnx
    tm = translator.translate(path, (x,), backend="reference")
    v = tm.report.verification
    assert v.passed, v.message
    assert v.truth.startswith("ONNX Runtime") and "square.onnx" in v.truth
    assert v.message.startswith("all outputs match ONNX Runtime")
    assert "all outputs match ONNX Runtime" in tm.report.to_markdown()


def test_seeded_importer_bug_fails_against_onnx_runtime(square_onnx, monkeypatch):
    m, x, path = square_onnx
    _seed_transposed_gemm(monkeypatch)
    tm = translator.translate(path, (x,), backend="reference")
    v = tm.report.verification
    assert v.passed is False
    assert v.truth.startswith("ONNX Runtime")
    assert "first at ONNX node" in v.message and "(Gemm)" in v.message, v.message
    # the circular check it replaces: judged against our own import, the same bug verifies
    monkeypatch.setattr(onnx_truth, "run_truth", lambda p, mod, ins: onnx_truth.OnnxTruth(p, "our own import"))
    tm = translator.translate(path, (x,), backend="reference")
    assert tm.report.verification.passed and tm.report.verification.truth == "our own import"


def test_without_onnxruntime_the_report_says_the_import_judged(square_onnx, monkeypatch):
    import sys

    m, x, path = square_onnx
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    tm = translator.translate(path, (x,), backend="reference")
    v = tm.report.verification
    assert v.passed
    assert "our own import" in v.truth and "onnxruntime is not installed" in v.truth


def test_low_precision_judged_against_onnx_runtime(square_onnx, monkeypatch):
    m, x, path = square_onnx
    _seed_transposed_gemm(monkeypatch)
    tm = translator.translate(path, (x,), backend="reference", precision="bf16")
    assert tm.report.verification.passed is False
    assert "(Gemm)" in tm.report.verification.message


def test_fp16_file_import_is_checked_against_onnx_runtime(tmp_path, monkeypatch):
    """A file in fp16: its outputs are judged against the import run in fp32, so the import itself is
    compared with ONNX Runtime's fp16 output."""
    rng = torch.Generator().manual_seed(0)
    w = torch.randn(16, 16, generator=rng).half()
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], name="the_gemm", transB=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])],
                          initializer=[numpy_helper.from_array(w.numpy(), "w")])
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = torch.randn(4, 16, generator=rng).half()
    assert translator.translate(path, (x,), backend="reference").report.verification.passed
    _seed_transposed_gemm(monkeypatch)
    v = translator.translate(path, (x,), backend="reference").report.verification
    assert v.passed is False and "our import differs from ONNX Runtime" in v.message, v.message
    assert "the_gemm (Gemm)" in v.message
