"""tm.state_dict() / tm.load_state_dict(): the model's keys, values and order, both ways.

Before, tm.state_dict() was the graph module's (keys `gm.*`, preshuffled copies instead of the
linear weights cleanup removed, num_batches_tracked missing), so `tm.load_state_dict(
model.state_dict())` failed on key names and a saved tm state dict lost weights. The translated
module shares the model's weights (like torch.compile's OptimizedModule): loading into it loads
into the model, and into its own copies of the buffers its graph writes.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn

from translator import translate
from translator.tolerances import model_tol


class Net(nn.Module):
    """Linear weights cleanup removes (preshuffled copies serve them), a batchnorm in eval (its
    num_batches_tracked unread), a tied weight, a non-persistent buffer, a step counter the
    graph writes (the translated module's own copy) and a one-element parameter."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 48), nn.Linear(48, 16)
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 16, bias=False)
        self.tied = self.head  # the same module twice: its weight under two keys, as torch lists it
        self.register_buffer("scale", torch.ones(16))
        self.register_buffer("eps", torch.full((1,), 0.5), persistent=False)
        self.register_buffer("steps", torch.zeros(()))
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x):
        self.steps += 1
        y = self.bn(self.b(torch.relu(self.a(x)))) * self.scale + self.eps
        return self.head(y) * self.gain + self.steps


def _model(seed=0):
    torch.manual_seed(seed)
    m = Net().eval()
    with torch.no_grad():
        m.bn.running_mean.normal_()
        m.bn.running_var.uniform_(0.5, 2)
    return m


def _values(m, seed):
    g = torch.Generator().manual_seed(seed)
    out = {k: (torch.randn(v.shape, generator=g) / 4 if v.is_floating_point() else v + 3)
           for k, v in m.state_dict().items()}
    out["bn.running_var"] = out["bn.running_var"].abs() + 0.5
    return out


@pytest.fixture(scope="module")
def x():
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def pair(x):
    m = _model()
    tm = translate(m, (x,), backend="flysim")
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("linear", 0) >= 2, tm.report.counters
    assert not hasattr(tm.gm.a, "weight")  # cleanup removed it: a preshuffled copy serves the kernel
    return m, tm


def _same(a: dict, b: dict):
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def _check_forward(tm, want_model, x):
    with torch.no_grad():
        got, want = tm(x), want_model(x)
    torch.testing.assert_close(got, want, **model_tol())
    assert len(tm.last_launches) >= 3  # the GEMMs ran as FlyDSL kernels on flysim


def test_state_dict_is_the_models(pair):
    m, tm = pair
    _same(tm.state_dict(), m.state_dict())
    assert "a.weight" in tm.state_dict() and "bn.num_batches_tracked" in tm.state_dict()
    assert not any(k.startswith("gm.") or "_flydsl" in k for k in tm.state_dict())
    kept = tm.state_dict(keep_vars=True)
    assert kept["a.weight"] is m.a.weight  # shared, not copied


def test_saved_state_dict_loads_into_a_fresh_model(pair, x):
    _, tm = pair
    buf = io.BytesIO()
    torch.save(tm.state_dict(), buf)
    fresh = _model(seed=5)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    _same(fresh.state_dict(), tm.state_dict())


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_round_trip(pair, x, assign):
    """Strict load of new values: the forward uses them (the preshuffled copies are rebuilt) and matches
    an eager model holding them; the user's model holds them too (shared)."""
    m, tm = pair
    new = _values(m, seed=7)
    eager = _model(seed=3)
    eager.load_state_dict(new)
    result = tm.load_state_dict(new, assign=assign)
    assert result.missing_keys == [] and result.unexpected_keys == []
    _same(tm.state_dict(), eager.state_dict())
    _same(m.state_dict(), eager.state_dict())  # loading into tm loaded into the model: they share
    assert (m.a.weight.data_ptr() == new["a.weight"].data_ptr()) == assign  # assign: the given tensor itself
    assert tm.gm.steps.data_ptr() != m.steps.data_ptr()  # the written buffer stays tm's own
    _check_forward(tm, eager, x)
    with torch.no_grad():  # later in-place updates on the model (new objects with assign) still reach tm
        m.a.weight.mul_(-1)
        eager.a.weight.mul_(-1)
    _check_forward(tm, eager, x)


def test_written_buffer_is_the_translated_modules_own(pair, x):
    m, tm = pair
    with torch.no_grad():
        tm(x)
        tm(x)
    assert float(tm.state_dict()["steps"]) == 2.0 and float(m.steps) == 0.0
    sd = tm.state_dict()
    sd["steps"] = torch.tensor(10.0)
    tm.load_state_dict(sd, assign=True)
    assert float(tm.gm.steps) == 10.0 and float(m.steps) == 10.0
    assert tm.gm.steps is not m.steps and tm.gm.steps.data_ptr() != m.steps.data_ptr()


def test_strict_false_returns_the_usual_keys_and_strict_names_them(pair, x):
    m, tm = pair
    sd = dict(m.state_dict())
    before = sd.pop("b.weight").clone()
    sd["extra.weight"] = torch.zeros(3)
    result = tm.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["b.weight"] and result.unexpected_keys == ["extra.weight"]
    torch.testing.assert_close(m.b.weight, before, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match='Missing key.*"b.weight".*|Unexpected key.*"extra.weight"'):
        tm.load_state_dict(sd)
    sd["b.weight"] = torch.zeros(5, 5)
    with pytest.raises(RuntimeError, match="size mismatch for b.weight"):
        tm.load_state_dict(sd, strict=False)
    _check_forward(tm, copy.deepcopy(m), x)


def test_graph_keys_are_refused_with_the_fix(pair):
    _, tm = pair
    with pytest.raises(RuntimeError, match="keys under 'gm.'.*model.state_dict"):
        tm.load_state_dict({f"gm.{k}": v for k, v in tm.gm.state_dict().items()})


def test_as_a_submodule_of_a_larger_model(pair, x):
    m, tm = pair
    outer = nn.Sequential(tm, nn.ReLU())
    sd = outer.state_dict()
    assert list(sd) == [f"0.{k}" for k in m.state_dict()]
    new = {f"0.{k}": v for k, v in _values(m, seed=11).items()}
    assert outer.load_state_dict(new).missing_keys == []
    eager = _model(seed=2)
    eager.load_state_dict({k[2:]: v for k, v in new.items()})
    _check_forward(tm, eager, x)
    result = outer.load_state_dict({k: v for k, v in new.items() if k != "0.a.bias"}, strict=False)
    assert result.missing_keys == ["0.a.bias"] and result.unexpected_keys == []


def test_direct_dict_writes_on_the_model_are_followed(pair, x):
    """`module._parameters[name] = new` (accelerate, quantization libraries) and `module._buffers[...]`
    bypass torch's registration hooks: before, the translated forward kept the old tensors."""
    from translator import weights

    m, tm = pair
    _check_forward(tm, m, x)  # the model's forward assigns its step counter (a new object each call) ...
    weights.follow(tm.gm)  # ... so tm looks at every name once here (as its next forward would)
    assert weights._TRACKED[id(tm.gm)].unchanged()
    g = torch.Generator().manual_seed(3)
    m.a._parameters["weight"] = nn.Parameter(torch.randn(48, 32, generator=g) / 5)  # a preshuffled copy's source
    m.bn._parameters["bias"] = nn.Parameter(torch.randn(16, generator=g))  # read directly by the graph
    m._buffers["scale"] = torch.randn(16, generator=g)
    m._parameters["gain"] = nn.Parameter(torch.ones(()))  # one element, equal value: a new object all the same
    assert not weights._TRACKED[id(tm.gm)].unchanged()
    _check_forward(tm, m, x)
    with torch.no_grad():
        m.gain.mul_(3)  # the new object's later in-place update reaches tm
        m.a.weight.mul_(-1)
    _check_forward(tm, m, x)
    _same(tm.state_dict(), m.state_dict())


def test_direct_dict_write_of_another_shape_is_a_clear_error(pair, x):
    from translator.errors import TranslatorError

    m, tm = pair
    keep = m.b.weight
    m.b._parameters["weight"] = nn.Parameter(torch.randn(16, 40))
    try:
        for _ in range(2):  # and again on the next call (before, the second call ran on the old weight)
            with pytest.raises(TranslatorError, match=r"b\.weight is now a tensor of shape \[16, 40\].*translate again"):
                tm(x)
    finally:
        m.b._parameters["weight"] = keep
    _check_forward(tm, m, x)



def test_eval_is_accepted_and_train_is_a_clear_error(pair, x):
    """tm.eval() raised torch.export's NotImplementedError("Calling train() is not supported yet.")."""
    from translator.errors import TranslatorError

    m, tm = pair
    assert tm.eval() is tm and tm.training is False
    with pytest.raises(TranslatorError, match="eval-mode forward.*train the original model"):
        tm.train()
    assert m.training is False and not any(mod.training for mod in m.modules())
    _check_forward(tm, m, x)


def test_conversions_and_requires_grad_reach_the_whole_shared_model(pair, x):
    """tm.double() / tm.requires_grad_(False) changed only the weights the graph reads directly (the
    biases, the batchnorm's): the model was left half converted (a.weight float32, a.bias float64)."""
    m, tm = pair
    tm.double()
    assert {p.dtype for p in m.state_dict().values() if p.is_floating_point()} == {torch.float64}
    tm.float()
    assert {p.dtype for p in m.state_dict().values() if p.is_floating_point()} == {torch.float32}
    _check_forward(tm, m, x)
    tm.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    tm.requires_grad_(True)
    assert all(p.requires_grad for p in m.parameters())


def test_huggingface_model_state_and_replaced_weights():
    """An HF model is captured through an adapter module (use_cache off); the weights were tracked on
    that adapter, which nothing kept alive: weights replaced on the user's model after translate()
    were not followed. The state dict is the user's model's, without the adapter's prefix."""
    import gc

    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
    m = T.GPT2LMHeadModel(cfg).eval()
    m.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 100, (2, 8))
    tm = translate(m, (ids,), backend="reference")
    gc.collect()
    assert list(tm.state_dict()) == list(m.state_dict())
    g = torch.Generator().manual_seed(4)
    for mod in (m.transformer.h[0].mlp.c_fc, m.transformer.h[0].attn.c_attn):  # new objects (untied weights)
        mod.weight = nn.Parameter(torch.randn(mod.weight.shape, generator=g) / 8)
    with torch.no_grad():
        got, want = tm(ids), m(ids, use_cache=False).logits
    got = got.logits if hasattr(got, "logits") else got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, want, **model_tol())
