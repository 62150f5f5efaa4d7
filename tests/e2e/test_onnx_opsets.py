"""Opsets, domains and external data the ONNX importer refuses, each with one error naming the node
(issue 32 item 3)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import translator
from translator import TranslatorError
from translator.adapters.onnx_import import OPSETS, load_onnx


def _model(nodes, opsets, inits=(), y_shape=(2, 4)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    g = helper.make_graph(nodes, "g", [x], [y], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _save(tmp_path, model, name):
    p = tmp_path / name
    onnx.save(model, p)
    return p


@pytest.mark.parametrize("opset", [OPSETS.start, 17, 18, 19, 20, OPSETS.stop - 1])
def test_known_opsets_import(tmp_path, opset):
    p = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("", opset)]), "ok.onnx")
    assert load_onnx(p) is not None


def test_opset_99_is_refused_naming_the_node(tmp_path):
    p = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"], name="the_relu")], [("", 99)]), "o99.onnx")
    with pytest.raises(TranslatorError, match=r"opset 99, newer than any ONNX opset.*first node the_relu, Relu"):
        translator.translate(p, None)


def test_old_opset_is_refused(tmp_path):
    p = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("", 9)]), "o9.onnx")
    with pytest.raises(TranslatorError, match="opset 9, older than the importer reads"):
        load_onnx(p)


def test_op_changed_after_known_opsets_is_refused_naming_the_node(tmp_path):
    """Opset 23 redefines Reshape (Reshape-23): refused at that node; an op it left alone is taken."""
    shape = numpy_helper.from_array(np.array([4, 2], np.int64), "s")
    p = _save(tmp_path, _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="the_reshape")], [("", 23)],
                               [shape]), "o23.onnx")
    with pytest.raises(TranslatorError, match=r"node the_reshape is Reshape-23 under opset 23.*versions 13, 14, 19, 21"):
        load_onnx(p)
    p = _save(tmp_path, _model([helper.make_node("Softmax", ["x"], ["y"], name="sm")], [("", 23)]), "sm23.onnx")
    assert load_onnx(p) is not None  # Softmax-13 is still in force at opset 23


@pytest.mark.parametrize("domain,op", [("com.microsoft", "FastGelu"), ("ai.onnx.ml", "Binarizer"),
                                       ("com.example", "FastGelu")])
def test_custom_domain_is_refused_naming_the_node(tmp_path, domain, op):
    node = helper.make_node(op, ["x"], ["y"], name="fg", domain=domain)
    p = _save(tmp_path, _model([node], [("", 17), (domain, 1)]), "custom.onnx")
    with pytest.raises(TranslatorError, match=rf"node fg \({op}\) is in domain {domain}"):
        translator.translate(p, None)


def test_external_data_stays_inside_the_model_folder(tmp_path):
    w = np.ones((4, 4), np.float32)
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    (tmp_path / "m").mkdir()
    onnx.save(_model([mm], [("", 17)], [numpy_helper.from_array(w, "w")]), tmp_path / "m" / "ok.onnx",
              save_as_external_data=True, location="ok.bin", size_threshold=0)
    tm = translator.translate(tmp_path / "m" / "ok.onnx", None, backend="reference")
    assert tm.report.verification.passed and tm.report.verification.truth.startswith("ONNX Runtime")
    w.tofile(tmp_path / "secret.bin")
    bad = _model([mm], [("", 17)], [numpy_helper.from_array(w, "w")])
    t = bad.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../secret.bin")
    (tmp_path / "m" / "bad.onnx").write_bytes(bad.SerializeToString())
    with pytest.raises(TranslatorError, match="external data is refused.*must be a file inside"):
        translator.translate(tmp_path / "m" / "bad.onnx", None)
