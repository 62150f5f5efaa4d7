"""ONNX input: inputs made from the file, flysim on an imported linear, the CLI, malformed files.
Every bundled model through both exporters: test_onnx_exporters.py."""

from __future__ import annotations

import logging
import warnings

import onnx
import pytest
import torch
from translator.tolerances import model_tol
from onnx import TensorProto, helper

import translator
from translator import InputError
from translator.frontends import cli
from translator.adapters.onnx_import import import_onnx

from bundled_models import load_model as load_bundled  # noqa: E402


def load_model(name):
    model, mod = load_bundled(name, "_onnx_model")
    return model, tuple(mod.get_inputs())


def export(model, inputs, path, dynamo):
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, inputs, str(path), dynamo=dynamo, verbose=False)
    finally:
        logging.disable(logging.NOTSET)
    return path


def test_inputs_made_from_the_file_when_not_given(tmp_path):
    model, x = load_model("mlp")
    path = export(model, x, tmp_path / "mlp.onnx", True)
    tm = translator.translate(str(path), None, backend="reference")
    assert tm.report.verification.passed
    with torch.no_grad():
        torch.testing.assert_close(tm(*x), model(*x), **model_tol(check="few_ops"))


def test_flysim_runs_an_imported_linear(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(32, 16)).eval()
    x = torch.randn(4, 32)
    path = export(lin, (x,), tmp_path / "lin.onnx", True)
    tm = translator.translate(path, (x,), backend="flysim")
    assert tm.report.verification.passed
    assert any(r.where == "flydsl-kernel" for r in tm.report.rows)
    assert tm.last_launches


def test_truncated_file_is_one_clear_error(tmp_path):
    model, x = load_model("mlp")
    good = export(model, x, tmp_path / "mlp.onnx", True).read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(good[: len(good) // 3])
    with pytest.raises(InputError, match="truncated|not a readable ONNX|checker"):
        translator.translate(bad, x, backend="reference")
    with pytest.raises(InputError, match="no such file"):
        translator.translate(tmp_path / "missing.onnx", x)


def test_op_we_cannot_import_is_named(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    g = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g", [x], [y])
    p = tmp_path / "hardmax.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    with pytest.raises(InputError, match=r"cannot import Hardmax \(first at node hm"):
        translator.translate(p, None)
    g2 = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], name="f", domain="com.example")], "g", [x], [y])
    p2 = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(g2, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)]), p2)
    with pytest.raises(InputError, match="node f \\(Foo\\) is in domain com.example"):
        import_onnx(p2)


def test_wrong_number_of_inputs(tmp_path):
    model, x = load_model("bert_layer")
    path = export(model, x, tmp_path / "bert.onnx", True)
    with pytest.raises(InputError, match="takes 2 inputs"):
        translator.translate(path, x[:1])


def test_cli_convert_accepts_onnx(tmp_path):
    model, x = load_model("mlp")
    path = export(model, x, tmp_path / "mlp.onnx", True)
    out = tmp_path / "out"
    rc = cli.main(["convert", str(path), "--backend", "reference", "--out", str(out)])
    assert rc == 0
    assert (out / "report.md").exists() and (out / "report.html").exists()
