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
