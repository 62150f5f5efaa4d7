"""The stride contract (docs/strides.md): every FlyDSL op returns the layout of the aten op it
replaced, or the translator fixes the consumers that depend on it.

- Per family (the registry's sample inputs, contiguous and in a permuted memory order): the fake
  implementation's strides equal the real output's, on the reference backend and on flysim.
- Per lowering form (stride_forms.FORMS: one small model per form, inputs in the layouts real
  models give): the translated graph's FlyDSL nodes carry eager's layout of what they replaced
  (`fix_strides` counts every one that does not as ``stride_mismatch_<family>``), every node's
  real output on flysim has the strides its ``meta["val"]`` says, and the outputs have eager's
  strides and values.
- gpt-fast's ``y.transpose(1, 2).contiguous().view(B, S, D)`` after SDPA runs on flysim (it
  raised "view size is not compatible"), with O written as [B, S, H, D] (no copy); with the
  attention layout turned off, `fix_strides` rewrites the view as a reshape instead.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import translator
import translator.lowerings  # noqa: F401  (fills the registry)
from translator import runtime
from translator.layouts import dim_order, same_layout
from translator.registry import FAMILIES
from translator.tolerances import model_tol, op_tolerance

from stride_forms import FORMS

flysim = pytest.importorskip("flysim")


def _permuted(a):
    """`a` with the same values, its memory in reverse dim order (column-major for 2-D)."""
    if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.is_floating_point():
        return a.permute(*reversed(range(a.dim()))).contiguous().permute(*reversed(range(a.dim())))
    if isinstance(a, list):
        return [_permuted(x) for x in a]
    return a


def _flat(out):
    if out is None:  # an op that writes its argument in place (flydsl.cache_write): no output, no strides
        return []
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _fake(fam, args):
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        conv = lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else (  # noqa: E731
            [conv(x) for x in a] if isinstance(a, list) else a)
        return _flat(fam.op(*[conv(a) for a in args]))


# arguments that are weights the translator prepares (preshuffled, always made contiguous)
PREPARED = {"gemm": {1}, "gemm_gated": {1}, "gemm_fp8": {1}, "fp8_block_linear": {1}, "fp8_static_linear": {1},
            "gemm_fp8_gated": {1}, "moe_experts_fp8": {3, 4, 5, 6},
            # the written state: lowerings/inplace.py takes a contiguous destination only (a strided view of
            # state stays in PyTorch with its reason), so the kernel never sees a permuted one
            "elementwise_": {0}}


def _samples(name):
    args = FAMILIES[name].sample_inputs(torch.float32)
    cases = [("contiguous", args),
             ("permuted", [a if i in PREPARED.get(name, ()) else _permuted(a) for i, a in enumerate(args)])]
    if name == "attention":  # O written as [B, S, H, D] memory (SDPA on a query viewed from [B, S, H, D])
        cases.append(("out_order", list(args) + [None, None, [0, 2, 1, 3]]))
    return cases


CASES = [(n, b) for n in sorted(FAMILIES) for b in ("reference", "flysim")]


@pytest.mark.parametrize("name,backend", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_fake_and_real_outputs_have_the_same_strides(name, backend):
    fam = FAMILIES[name]
    base = None
    for how, args in _samples(name):
        fake = _fake(fam, args)
        with runtime.use_backend(backend, "gfx942") as st:
            real = _flat(fam.op(*args))
        if backend == "flysim":
            assert st.launches, f"flydsl.{name} ({how}) launched no kernel under flysim"
        for f, r in zip(fake, real):
            assert tuple(f.shape) == tuple(r.shape)
            assert same_layout(f, r), (f"flydsl.{name} ({how} inputs, {backend}): fake strides {f.stride()}, "
                                       f"real {r.stride()} for shape {tuple(r.shape)}")
        if base is None:
            base = real
        elif how in ("permuted", "out_order"):  # same values, another memory order: the same result
            atol, rtol = op_tolerance(torch.float32, name)
            for r, b in zip(real, base):
                torch.testing.assert_close(r.float(), b.float(), atol=atol, rtol=rtol)  # fp8 outputs compare as fp32


def _strides_ok(tm, eager_out, got_out):
    for e, g in zip(_flat(eager_out), _flat(got_out)):
        assert same_layout(g, e), f"output strides {g.stride()} differ from eager's {e.stride()}"


class _Checker(torch.fx.Interpreter):
    """Runs the translated graph and asserts each node's real layout is its meta['val'] layout."""

    def run_node(self, n):
        out = super().run_node(n)
        want = n.meta.get("val")
        if isinstance(out, torch.Tensor) and isinstance(want, torch.Tensor):
            assert same_layout(out, want), (f"{n.format_node()}: runs with strides {out.stride()}, the graph was "
                                            f"traced with {want.stride()} (shape {tuple(out.shape)})")
        return out


def _translate_and_check(name, backend):
    family, model, inputs = FORMS[name]
    model = model.eval()
    tm = translator.translate(model, inputs, backend=backend, dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    fams = {n.meta["flydsl"]["family"] for n in tm.gm.graph.nodes
            if "flydsl" in n.meta and getattr(n.target, "namespace", None) == "flydsl"}
    assert family in fams, f"{name}: expected a flydsl.{family} node, the graph has {sorted(fams)}"
    mismatch = {k: v for k, v in tm.report.counters.items() if k.startswith("stride_mismatch_")}
    assert mismatch == KNOWN_MISMATCH.get(name, {}), f"{name}: {mismatch}"
    with torch.no_grad():
        want = model(*inputs)
        got = tm(*inputs)
    _strides_ok(tm, want, got)
    for g, w in zip(_flat(got), _flat(want)):
        torch.testing.assert_close(g, w, **model_tol())
    with torch.no_grad(), runtime.use_backend(backend, "gfx942"):
        _Checker(tm.gm).run(*inputs)
    return tm


# forms whose FlyDSL op returns another layout than eager, and why that is kept (docs/strides.md)
KNOWN_MISMATCH = {
    # the kernel normalizes (sample, group) rows of contiguous memory; a channels-last input is copied
    "group_norm_channels_last": {"stride_mismatch_group_norm": 1},
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_every_form_keeps_eager_strides_reference(name):
    _translate_and_check(name, "reference")


# forms whose layouts differ from contiguous (the rest: slow, same checks; the gpt-fast test covers sdpa_bshd)
FLYSIM_DEFAULT = {"sdpa_bshd_gqa", "elementwise_transposed", "softmax_transposed", "linear_transposed_in",
                  "group_norm_channels_last"}


@pytest.mark.parametrize("name", [n if n in FLYSIM_DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(FORMS)])
def test_every_form_keeps_eager_strides_flysim(name):
    _translate_and_check(name, "flysim")


def _gptfast():
    from gptfast_model import build

    m = build(n_layer=1)
    return m, (torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0)), torch.arange(8))


def test_gptfast_attention_output_view_runs_on_flysim():
    """gpt-fast's merge of heads after SDPA: O is written as [B, S, H, D], the view needs no fix."""
    m, x = _gptfast()
    with torch.no_grad():
        want = m(*x)
    m, x = _gptfast()  # a fresh cache: the eager call above wrote the user's
    tm = translator.translate(m, x, backend="flysim", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    att = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.attention.default]
    assert len(att) == 1 and dim_order(att[0].meta["val"]) == (0, 2, 1, 3)
    assert not any(k.startswith("stride_") for k in tm.report.counters), tm.report.counters
    assert any(c.family == "attention" and c.launches for c in tm.last_calls)
    with torch.no_grad():  # a prefill writes every cache row it reads: the result needs no earlier state
        torch.testing.assert_close(tm(*x), want, **model_tol())


def test_fix_strides_rewrites_the_view_when_attention_keeps_its_own_layout(monkeypatch):
    """The safety net: with attention writing [B, H, S, D] (its layout choice turned off), the view
    that only eager's layout allows becomes a reshape, and the model still matches eager."""
    import translator.lowerings.attention as att

    monkeypatch.setattr(att, "dim_order", lambda t: None)
    m, x = _gptfast()
    tm = translator.translate(m, x, backend="reference", dynamic_shapes=None)
    assert tm.report.verification.passed, tm.report.verification.message
    assert tm.report.counters.get("stride_mismatch_attention") == 1
    assert tm.report.counters.get("stride_view_to_reshape", 0) >= 1
