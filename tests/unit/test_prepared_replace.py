"""Parameter OBJECTS replaced after translate(): the translation follows them by name.

Weights the translator prepares (preshuffled GEMM weights, the gated GEMM's arranged
gate/up weight, einsum permutations) and shape-only regions folded once per input shape
(fold_shapes) are made from the model's parameters. Updates in place are seen through the
version counter (test_prepared_weights); here the parameter object itself is replaced, on the
user's model or on the translated one: `load_state_dict(assign=True)`, `module.weight =
nn.Parameter(...)`, `.to()` under `overwrite_module_params_on_conversion`. Before, the prepared
copies and folded constants kept the tensors they were made from: a silent wrong answer.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import translate, weights
from translator.errors import TranslatorError
from translator.tolerances import model_tol

V, D, H, T = 64, 32, 64, 8


def _embedding():
    e = nn.Embedding(V, D)
    with torch.no_grad():
        e.weight.mul_(0.2)  # outputs of order 1: the fp32 tolerance is absolute
    return e


class Block(nn.Module):
    """Every kind of prepared weight: a linear, a gated MLP, an einsum against a parameter, a
    tied LM head (the embedding's weight, read directly and preshuffled for the head) and a
    position table sliced by the sequence length (a folded shape-only region)."""

    def __init__(self):
        super().__init__()
        self.wte = _embedding()
        self.pos = nn.Parameter(torch.randn(16, D) / 4)
        self.proj = nn.Linear(D, D)
        self.gate, self.up, self.down = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)
        self.mix = nn.Parameter(torch.randn(D, 2, D // 2) / 6)

    def forward(self, ids):
        x = self.wte(ids) + self.pos[: ids.shape[1]]
        x = self.proj(x)
        x = x + self.down(F.silu(self.gate(x)) * self.up(x))
        x = torch.einsum("btd,dhe->bthe", x, self.mix).flatten(2)
        return F.linear(x, self.wte.weight)


@pytest.fixture(scope="module")
def translated():
    torch.manual_seed(0)
    m = Block().eval()
    ids = torch.randint(0, V, (2, T))
    tm = translate(m, (ids,), backend="flysim")
    assert tm.report.verification.passed
    assert {"gated_mlp", "einsum", "linear", "fold_shapes"} <= set(tm.report.counters), tm.report.counters
    return m, tm, ids


def _check(tm, eager, ids):
    with torch.no_grad():
        got, want = tm(ids), eager(ids)
    torch.testing.assert_close(got, want, **model_tol())
    assert len(tm.last_launches) >= 5  # the FlyDSL kernels ran (flysim records each launch)
    return got


def _mirror(m, tm):
    """A copy of the model holding the weights the translated module holds now."""
    ref = copy.deepcopy(m)
    own = dict(ref.named_parameters())
    with torch.no_grad():
        for k, v in tm.gm.named_parameters():
            if k in own:
                own[k].copy_(v)
    return ref


def _new_values(module, scale):
    return {k: torch.randn_like(v) * scale for k, v in module.state_dict().items()}


def test_load_state_dict_assign_on_the_model(translated):
    m, tm, ids = translated
    before = _check(tm, m, ids)
    _check(tm, m, ids)
    assert weights._TRACKED[id(tm.gm)].unchanged()  # nothing moved since the last forward: no name resolved
    m.load_state_dict(_new_values(m, 0.2), assign=True)
    after = _check(tm, m, ids)
    assert not torch.allclose(before, after)


def test_new_parameter_set_on_a_submodule_of_the_model(translated):
    m, tm, ids = translated
    for mod in (m.proj, m.gate, m.up, m.down):
        mod.weight = nn.Parameter(torch.randn_like(mod.weight) / 5)
    m.mix = nn.Parameter(torch.randn_like(m.mix) / 6)
    m.pos = nn.Parameter(torch.randn_like(m.pos) / 4)
    _check(tm, m, ids)
    m.wte = _embedding()  # a whole submodule replaced: its weight is resolved by name too
    _check(tm, m, ids)


def test_in_place_copy_and_optimizer_step_on_the_model(translated):
    m, tm, ids = translated
    with torch.no_grad():
        m.mix.copy_(torch.randn_like(m.mix) / 6)
        m.gate.weight.copy_(torch.randn_like(m.gate.weight) / 5)
    _check(tm, m, ids)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    m(ids).square().mean().backward()  # eager training step; the translation serves inference
    opt.step()
    opt.zero_grad()
    _check(tm, m, ids)


def test_replacement_of_another_shape_is_a_clear_error(translated):
    m, tm, ids = translated
    keep = m.mix
    m.mix = nn.Parameter(torch.randn(D, 4, D // 4))
    try:
        with pytest.raises(TranslatorError, match="mix.*translate again"):
            tm(ids)
    finally:
        m.mix = keep
    _check(tm, m, ids)


def test_replaced_on_the_translated_module(translated):
    """tm.load_state_dict(assign=True) takes the model's keys and loads into the model, whose weights
    tm shares (as torch.compile's OptimizedModule does); a new Parameter set on tm's graph module
    reaches only tm. The prepared copies of those weights (the tied head) and the folded position
    slice follow both."""
    m, tm, ids = translated
    sd = tm.state_dict()
    assert list(sd) == list(m.state_dict()), sorted(sd)
    new_wte, new_pos = torch.randn(V, D) / 5, torch.randn(16, D) / 5
    sd["wte.weight"], sd["pos"] = new_wte, new_pos
    tm.load_state_dict(sd, assign=True)
    assert m.wte.weight.data_ptr() == new_wte.data_ptr() and m.pos.data_ptr() == new_pos.data_ptr()
    _check(tm, m, ids)
    ref = copy.deepcopy(m)
    untouched = {k: v.clone() for k, v in m.state_dict().items()}
    tm.gm.wte.weight = nn.Parameter(torch.randn(V, D) / 5)
    with torch.no_grad():
        ref.wte.weight.copy_(tm.gm.wte.weight)
    _check(tm, ref, ids)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, untouched[k], rtol=0, atol=0)


def test_direct_dict_writes_on_the_translated_module_and_the_model(translated):
    """`_parameters[name] = new`, which no registration hook sees: on tm's graph module the tied head's
    weight (read by the embedding, and the source of the head's preshuffled copy) follows; on the
    model, the gated MLP's weights and the position table (folded per shape) follow."""
    m, tm, ids = translated
    ref = _mirror(m, tm)
    untouched = {k: v.clone() for k, v in m.state_dict().items()}
    tm.gm.wte._parameters["weight"] = new = nn.Parameter(torch.randn(V, D) / 5)
    with torch.no_grad():
        ref.wte.weight.copy_(new)
    _check(tm, ref, ids)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, untouched[k], rtol=0, atol=0)
    m.wte._parameters["weight"] = nn.Parameter(torch.randn(V, D) / 5)  # the model's: tm follows it again
    m.gate._parameters["weight"] = nn.Parameter(torch.randn(H, D) / 5)
    m.up._parameters["bias"] = nn.Parameter(torch.randn(H) / 5)
    m._parameters["pos"] = nn.Parameter(torch.randn(16, D) / 4)
    assert not weights._TRACKED[id(tm.gm)].unchanged()
    _check(tm, m, ids)


def test_to_round_trip_with_new_parameter_objects(translated):
    """`.to()` under overwrite_module_params_on_conversion makes new Parameter objects; an update of
    the translated module's weight after that still reaches its preshuffled copy."""
    m, tm, ids = translated
    ref = _mirror(m, tm)
    old = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        tm.double().float()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(old)
    with torch.no_grad():
        tm.gm.wte.weight.mul_(-0.5)
        ref.wte.weight.mul_(-0.5)
    _check(tm, ref, ids)
