"""copy.deepcopy(tm) is an independent, working translation; pickling names translator.save.

Before, a deep copy of a translation with a folded shape region (Llama's rotary tables, HF masks)
failed on the region's lock ("cannot pickle '_thread.lock' object"), and one without lost the
link between its prepared weights (preshuffled GEMM copies) and the weights they are made from:
a write to the copy's weights was not seen by its forward. torch.save(tm) failed deep inside
pickle on a lambda of torch.export's graph module.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

from models import llama_block
from translator import InputError, state, translate
from translator.tolerances import model_tol
from translator.verify import verify_outputs


class Counter(nn.Module):
    """A GEMM whose weight is read as a view (`weight.t()`, as GPT-2's Conv1D) and a step counter the graph
    writes (the translation's own state)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 48) / 6)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps += 1
        return torch.relu(x @ self.w) + self.steps


def _verified(tm, model, x):
    with torch.no_grad():
        got, want = tm(x), model(x)
    assert verify_outputs(want, got, "fp32").passed
    return got


def _scale_weights(module, by):
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(by)


def test_deepcopy_of_a_llama_block_is_independent():
    torch.manual_seed(0)
    model = llama_block.Model(*llama_block.get_init_inputs()).eval()
    x, = llama_block.get_inputs()
    tm = translate(model, (x,), backend="reference")
    assert any(k.startswith("_flydsl_folded_") for k in tm.gm._modules)  # the rotary tables: a region with a lock
    before = _verified(tm, model, x)

    tm2 = copy.deepcopy(tm)
    model2 = tm2.__dict__["_model"]
    assert model2 is not model and tm2.gm is not tm.gm
    assert tm2.report is not tm.report and tm2.report.headline() == tm.report.headline()
    torch.testing.assert_close(_verified(tm2, model2, x), before, rtol=0, atol=0)

    _scale_weights(model2, 1.5)  # the copy's weights: its prepared copies follow them, the original is untouched
    changed = _verified(tm2, model2, x)
    assert not torch.allclose(changed, before)
    torch.testing.assert_close(_verified(tm, model, x), before, rtol=0, atol=0)
    _scale_weights(model, 0.5)  # and the reverse
    _verified(tm, model, x)
    torch.testing.assert_close(_verified(tm2, model2, x), changed, rtol=0, atol=0)
    assert len(tm2.last_launches) == len(tm.last_launches)


@pytest.mark.parametrize("lazy", [False, True], ids=["made", "lazy"])
def test_deepcopy_owns_its_state_and_follows_a_viewed_weight(lazy, monkeypatch):
    """`lazy`: the prepared GEMM weight left unmade (state.settle, as for a large model on the reference)."""
    torch.manual_seed(0)
    if lazy:
        monkeypatch.setattr(state, "LAZY_BYTES", 0)
    model, x = Counter().eval(), torch.randn(4, 32)
    tm = translate(model, (x,), backend="reference")
    assert any(state.is_lazy(b) for b in tm.gm.buffers()) == lazy
    eager = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(tm(x), eager(x), **model_tol())
    tm2 = copy.deepcopy(tm)
    eager2 = copy.deepcopy(eager)
    with torch.no_grad():
        for _ in range(2):  # the copy's counter advances, the original's stays
            torch.testing.assert_close(tm2(x), eager2(x), **model_tol())
        torch.testing.assert_close(tm(x), eager(x), **model_tol())
    assert float(tm2.state_dict()["steps"]) == 3 and float(tm.state_dict()["steps"]) == 2
    _scale_weights(tm2.__dict__["_model"], 2.0)  # read through weight.t(): the view of the copied weight
    _scale_weights(eager2, 2.0)
    with torch.no_grad():
        torch.testing.assert_close(tm2(x), eager2(x), **model_tol())
        torch.testing.assert_close(tm(x), eager(x), **model_tol())
    assert float(model.steps) == 0  # the user's model was never advanced
    if lazy:
        assert all(id(b) in state._LAZY_LIVE for b in tm2.gm.buffers() if state.is_lazy(b))


def test_pickling_names_translator_save(tmp_path):
    torch.manual_seed(0)
    model, x = Counter().eval(), torch.randn(4, 32)
    tm = translate(model, (x,), backend="reference", verify=False)
    for dump in (lambda: torch.save(tm, io.BytesIO()), lambda: pickle.dumps(tm)):
        with pytest.raises(InputError, match=r"translator\.save\(tm"):
            dump()
    shallow = copy.copy(tm)
    assert shallow.gm is tm.gm
    torch.save(tm.state_dict(), tmp_path / "sd.pt")  # the weights alone still save


def test_translate_save_load_and_deepcopy_warn_nothing(tmp_path):
    """A user sees no warning from us: `copy.deepcopy(tm)` printed torch's FutureWarning "isinstance(treespec,
    LeafSpec) is deprecated" (copying the graph's frozen pytree specs built a new LeafSpec); now they are shared."""
    import warnings

    import translator
    from bundled_models import load_model

    model, mod = load_model("mini_gpt", n_layer=1)
    x = tuple(mod.get_inputs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tm = translate(model, x, backend="reference")
        path = translator.save(tm, tmp_path / "mini_gpt.pt2", x)
        loaded = translator.load(path)
        tm2, loaded2 = copy.deepcopy(tm), copy.deepcopy(loaded)
        with torch.no_grad():
            outs = [m(*x) for m in (tm, loaded, tm2, loaded2)]
    for got in outs[1:]:
        torch.testing.assert_close(got, outs[0], rtol=0, atol=0)
    assert tm2.gm._out_spec is tm.gm._out_spec  # shared: frozen
