"""Bad input gets one TranslatorError subclass whose message names the problem and the fix,
never a raw ValueError / AssertionError / ZeroDivisionError from a kernel or torch.export."""

from __future__ import annotations

import pytest
import torch

from translator import translate
from translator.errors import DeviceError, DtypeError, EmptyInputError, ShapeError, TranslatorError
from translator.frontends import cli


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.register_buffer("pos", torch.randn(16, 32))

    def forward(self, x):
        return torch.softmax(self.lin(x) + self.pos[: x.shape[1]], -1)


@pytest.fixture(scope="module")
def tm():
    return translate(Net(), (torch.randn(2, 8, 32),), backend="flysim")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.float16])
def test_a_call_in_another_dtype(tm, dtype):
    x = torch.randn(2, 8, 32).to(dtype)
    with pytest.raises(DtypeError, match=r"translated for float32 .* x\.to\(torch\.float32\)"):
        tm(x)


def test_a_sequence_longer_than_the_model_allows(tm):
    with pytest.raises(ShapeError, match=r"limit the model sets .*<= 16.*within that limit"):
        tm(torch.randn(2, 32, 32))
    tm(torch.randn(2, 12, 32))  # within the limit: fine (the sequence dim is dynamic)
    assert tm.last_launches


def test_a_meta_input_at_call_time(tm):
    with pytest.raises(DeviceError, match="meta device.*real tensors"):
        tm(torch.randn(2, 8, 32, device="meta"))


def test_a_batch_0_example():
    with pytest.raises(EmptyInputError, match=r"size 0 in dim 0 .* at least 2"):
        translate(Net(), (torch.randn(0, 8, 32),), backend="reference")


def test_a_meta_example_and_a_meta_model():
    with pytest.raises(DeviceError, match=r"meta device .*torch\.randn\(2, 8, 32"):
        translate(Net(), (torch.randn(2, 8, 32, device="meta"),), backend="reference")
    with torch.device("meta"):
        m = Net()
    with pytest.raises(DeviceError, match="to_empty"):
        translate(m, (torch.randn(2, 8, 32),), backend="reference")


def test_every_new_error_is_a_translator_error():
    for cls in (DtypeError, DeviceError, EmptyInputError):
        assert issubclass(cls, TranslatorError)


def test_the_cli_says_so_for_a_meta_input(tmp_path, capsys):
    script = tmp_path / "meta_model.py"
    script.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.relu(x)\n"
        "def get_inputs():\n"
        "    return [torch.randn(4, 8, device='meta')]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    code = cli.main(["convert", str(script), "--backend", "reference", "--out", str(tmp_path / "out")])
    err = capsys.readouterr()
    assert code == 2, err
    assert "meta device" in err.err + err.out


# ---- the public API's error paths, walked: each raises a TranslatorError subclass naming the fix ----

class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.softmax(self.fc(x), -1), self.fc(x).sum(0)


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    m = Small().eval()
    return m, translate(m, (torch.randn(4, 16),), backend="reference")


def _onnx_with_input_dims(path, dims):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    import onnx

    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _error_paths(small, tmp_path):
    """(label, call) for each documented way to misuse the public API."""
    import os

    import translator
    from translator.frontends.compile_backend import flydsl_backend

    m, tm = small
    x = torch.randn(4, 16)
    fifo = tmp_path / "fifo.pt2"
    os.mkfifo(fifo)
    (tmp_path / "not_a_zip.pt2").write_text("hello")
    return [
        ("translate: example inputs not a tuple", lambda: translate(m, "x")),
        ("translate: unknown backend", lambda: translate(m, (x,), backend="cuda")),
        ("translate: unknown precision", lambda: translate(m, (x,), precision="int4")),
        ("translate: a batch-0 example", lambda: translate(m, (torch.randn(0, 16),))),
        ("translate: the model fails in eager", lambda: translate(m, (torch.randn(4, 15),))),
        ("call: wrong dtype", lambda: tm(x.double())),
        ("call: wrong feature size", lambda: tm(torch.randn(4, 15))),
        ("call: an input that requires grad", lambda: tm(x.clone().requires_grad_())),
        ("save: not a TranslatedModule", lambda: translator.save(m, tmp_path / "m.pt2")),
        ("save: a missing folder", lambda: translator.save(tm, tmp_path / "nope" / "m.pt2")),
        ("save: a folder", lambda: translator.save(tm, ".")),
        ("load: no such file", lambda: translator.load(tmp_path / "missing.pt2")),
        ("load: not a zip", lambda: translator.load(tmp_path / "not_a_zip.pt2")),
        ("load: a FIFO", lambda: translator.load(fifo)),
        ("load: a folder", lambda: translator.load(tmp_path)),
        ("compile backend: unknown option", lambda: flydsl_backend(None, [x], {"fast": True})),
        ("onnx: no such file", lambda: translate(str(tmp_path / "missing.onnx"), None)),
        ("onnx: absurd dims", lambda: translate(str(_onnx_with_input_dims(tmp_path / "big.onnx", [1 << 20, 1 << 20])),
                                                None)),
        ("onnx: negative dims", lambda: translate(str(_onnx_with_input_dims(tmp_path / "neg.onnx", [2, -3])), None)),
    ]


def test_every_public_error_path_raises_a_translator_error(small, tmp_path):
    bad = []
    for label, call in _error_paths(small, tmp_path):
        try:
            call()
        except TranslatorError as e:
            assert str(e).strip(), label
            continue
        except BaseException as e:  # noqa: BLE001 — the point: name every raw one
            bad.append(f"{label}: {type(e).__name__}: {str(e)[:120]}")
            continue
        bad.append(f"{label}: raised nothing")
    assert not bad, "\n".join(bad)


def test_the_cli_error_paths_exit_2_with_one_line(tmp_path, capsys):
    script = tmp_path / "m.py"
    script.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                      "def get_inputs():\n    import sys; sys.exit(0)\ndef get_init_inputs():\n    return []\n")
    for argv in (["convert", str(tmp_path / "missing.py")], ["convert", str(script)],
                 ["convert", str(script), "--out", "/proc/flydsl_nope"], ["convert", str(script), "--arch", "gfx1"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("flydsl-translate: error: "), (argv, err)


def test_backward_through_a_translated_model_is_refused_at_the_call(small):
    """Translation is for inference: the FlyDSL ops have no backward. The output carried a grad_fn
    that failed at .backward() with a raw 'no autograd formula' RuntimeError."""
    from translator.errors import GradError

    m, tm = small
    with pytest.raises(GradError, match="inference.*torch.no_grad"):
        tm(torch.randn(4, 16, requires_grad=True))
    out, _ = tm(torch.randn(4, 16))  # parameters that require grad: no autograd graph is recorded
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        tm(torch.randn(4, 16, requires_grad=True))


def test_a_batch_of_0_on_flysim_matches_eager():
    """A reduction over an empty batch: the kernel refused (a raw KernelInputError); eager gives zeros."""
    torch.manual_seed(0)
    m = Small().eval()
    tm = translate(m, (torch.randn(4, 16),), backend="flysim")
    x0 = torch.randn(0, 16)
    got, want = tm(x0), m(x0)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)
    assert tm(torch.randn(3, 16)) is not None and tm.last_launches  # non-empty calls still launch kernels


def test_a_data_dependent_output_shape_is_costed_not_a_crash():
    """`x[x > 0]`: the cost model read the size hint of a data-dependent dim (None): a raw TypeError."""

    class Masked(torch.nn.Module):
        def forward(self, x):
            return (x[x > 0] * 2).sum() + x.sum()

    m = Masked()
    x = torch.randn(4, 8)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    torch.testing.assert_close(tm(x), m(x))
    rows = {r.node: r for r in tm.report.rows}
    assert rows["mul"].bytes == 2 * 4 * int((x > 0).sum())  # counted on the example's real values
