"""LLM generation with a KV cache that the graph writes: one state, shared by every graph.

The model is models/_static_cache_decoder.py (gpt-fast's form: cache buffers [B, Hkv, S_max, D]
written with `cache[:, :, input_pos] = k`, the mask and RoPE table sliced by input_pos), run by
its greedy loop: one prefill call, then one decode call per token. Under torch.compile the
prefill and the decode are two dynamo graphs (dynamic=False); before the state contract each
translation wrote a private copy of the cache, and decode read a cache that prefill never wrote
(wrong tokens, no warning). Eager's tokens and eager's final cache are the expectation.

The reference backend covers the state logic fast; flysim runs the kernels (slow on CPU: a GEMM
launch takes about a second to interpret) with launch records as the evidence. HF models:
tests/e2e/test_generation_hf.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import translator
from translator.tolerances import model_tol
from translator.frontends import compile_backend
from bundled_models import load_module  # tests/ is on sys.path (tests/conftest.py)

NEW = 4  # new tokens in the default suite (prefill + 3 decode steps)


D = load_module("_static_cache_decoder", "_gen")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


def _model(merge="reshape", config=D.TINY):
    torch.manual_seed(0)
    return D.Model(merge, config).eval()


def _eager(m, prompt, n):
    """Eager's tokens and its caches after generating, with m's caches zeroed before and after."""
    D.reset_caches(m)
    tokens = D.generate(m, prompt, n)
    caches = [c.clone() for c in D.caches(m)]
    D.reset_caches(m)
    return tokens, caches


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_prefill_and_decode_share_the_users_cache(dynamic):
    m = _model()
    prompt = D.get_inputs(D.TINY, 4)[0]
    tokens, caches = _eager(m, prompt, NEW)
    user = D.caches(m)
    cm = torch.compile(m, backend="flydsl", dynamic=dynamic, options={"backend": "reference"})
    assert D.generate(cm, prompt, NEW) == tokens
    # the user's own buffers (the same objects) hold what eager's generation left in them
    assert all(a is b for a, b in zip(D.caches(m), user))
    for got, want in zip(user, caches):
        torch.testing.assert_close(got, want)
    recs = compile_backend.reports()
    assert sum(r.calls_translated for r in recs) == NEW and not any(r.calls_pytorch for r in recs)
    assert all(len(r.state) == 2 * D.TINY.n_layer for r in recs)  # every graph writes the caches
    if not dynamic:  # prefill and decode: two graphs, each with its own translation
        assert len(recs) == 2 and [r.calls_translated for r in recs] == [1, NEW - 1]


def test_compile_follows_a_replaced_cache_buffer():
    """The user swaps a cache buffer for a new tensor between generations: the translations write the new one."""
    m = _model()
    prompt = D.get_inputs(D.TINY, 4)[0]
    tokens, caches = _eager(m, prompt, 3)
    cm = torch.compile(m, backend="flydsl", options={"backend": "reference"})
    D.generate(cm, prompt, 3)
    kv = m.layers[0].attention.kv_cache
    kv.k_cache = torch.zeros_like(kv.k_cache)  # a new object (register_buffer's slot)
    D.reset_caches(m)
    assert D.generate(cm, prompt, 3) == tokens
    torch.testing.assert_close(kv.k_cache, caches[0])


def test_translate_owns_one_cache_and_leaves_the_users():
    m = _model()
    prompt, pos = D.get_inputs(D.TINY, 4)
    tokens, caches = _eager(m, prompt, NEW)
    tm = translator.translate(m, (prompt, pos), backend="reference")
    assert tm.report.verification.passed
    assert D.generate(tm, prompt, NEW) == tokens  # prefill [1, 4] and decode [1, 1]: one graph, one cache
    assert all(float(c.abs().max()) == 0 for c in D.caches(m)), "translate() advanced the user's cache"
    sd = tm.state_dict()  # the translated module's own cache, as its state dict gives it
    for key, want in zip([k for k in sd if k.endswith(("k_cache", "v_cache"))], caches):
        torch.testing.assert_close(sd[key], want)


def test_translate_save_load_generates_eagers_tokens(tmp_path):
    m = _model()
    prompt, pos = D.get_inputs(D.TINY, 4)
    tokens, caches = _eager(m, prompt, NEW)
    tm = translator.translate(m, (prompt, pos), backend="reference")
    path = translator.save(tm, tmp_path / "decoder.pt2")
    loaded = translator.load(path)
    assert D.generate(loaded, prompt, NEW) == tokens
    own = [b for n, b in loaded.gm.named_buffers() if n.endswith(("k_cache", "v_cache"))]
    for got, want in zip(own, caches):  # written in place in the loaded module's one copy
        torch.testing.assert_close(got, want)


@torch._dynamo.config.patch(recompile_limit=2)
def test_compiled_calls_are_counted_and_a_recompile_limit_is_said():
    """dynamo stops compiling a function past its recompile_limit and runs it in eager PyTorch: the
    records say so, with dynamo's reason, and one warning is given."""
    lin = torch.nn.Linear(8, 8).eval()
    tag = ["a"]

    def f(x):
        return lin(x) + len(tag[0] * 2) if tag[0] in "ab" else lin(x) - 1  # a guard on the string: each a recompile

    cf = torch.compile(f, backend="flydsl", options={"backend": "reference"})
    x = torch.randn(2, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for v in ("a", "b", "c", "d", "b"):  # c and d: past the limit of 2, eager
            tag[0] = v
            torch.testing.assert_close(cf(x), f(x))
    recs = compile_backend.reports()
    assert len(recs) == 2 and [r.calls_translated for r in recs] == [1, 2]
    assert recs[1].recompile_reason and "0/0" in recs[1].recompile_reason
    assert all(r.dynamo_fallback and "recompile_limit (2)" in r.dynamo_fallback for r in recs)
    said = [w for w in caught if "dynamo hit its recompile_limit" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "graph1" in compile_backend.summary()


def test_compile_reports_is_public():
    """README's line: translator.compile_reports() (translator.compile_backend.reports() raised AttributeError)."""
    assert translator.compile_reports is compile_backend.reports


def launches_per_call(cm):
    """A step function around `cm` and the list it fills: per call, the FlyDSL launches of the
    translation that ran it (the graph whose translated-call count moved)."""
    launches = []

    def step(*args):
        before = {id(r): r.calls_translated for r in compile_backend.reports()}
        out = cm(*args)
        ran = [r for r in compile_backend.reports() if r.calls_translated > before.get(id(r), 0)]
        launches.append(len(ran[0].translated[-1].last_launches) if len(ran) == 1 else 0)
        return out

    return step, launches


@pytest.mark.slow
def test_flysim_compile_generates_on_kernels():
    """flysim: prefill and decode graphs run FlyDSL kernels (launch records on every step), eager's tokens."""
    m = _model("reshape")
    prompt = D.get_inputs(D.TINY, 4)[0]
    tokens, caches = _eager(m, prompt, 3)
    cm = torch.compile(m, backend="flydsl", options={"backend": "flysim"})
    step, launches = launches_per_call(cm)
    assert D.generate(step, prompt, 3) == tokens
    assert len(launches) == 3 and all(n > 0 for n in launches), launches
    assert [r.calls_translated for r in compile_backend.reports()] == [1, 2]
    for got, want in zip(D.caches(m), caches):
        torch.testing.assert_close(got, want, **model_tol())


@pytest.mark.slow
def test_flysim_compile_generates_gpt_fast_view_form():
    m = _model("view")
    prompt = D.get_inputs(D.TINY, 4)[0]
    tokens, _ = _eager(m, prompt, 2)
    cm = torch.compile(m, backend="flydsl", options={"backend": "flysim"})
    assert D.generate(cm, prompt, 2) == tokens


class _AttrState(torch.nn.Module):
    """State in a plain tensor attribute (not a registered buffer): torch.export captures it as a constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.acc = torch.zeros(2, 4)

    def forward(self, x):
        self.acc.add_(self.lin(x))
        return self.acc * 1


class _InputWrite(torch.nn.Module):
    """The caller's tensor is the state (HF's StaticCache tensors arrive this way)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, cache):
        cache[:, 0] = self.lin(x)
        return cache.sum(1)


@pytest.mark.parametrize("form", [_AttrState, _InputWrite])
@pytest.mark.parametrize("how", ["translate", "compile"])
def test_state_forms_advance_like_eager(form, how):
    """Three calls advance the state as eager's three calls do; translate() leaves the model's own
    state as it was (a plain attribute advanced by the eager check made the translation start from
    the advanced value: [2l, 3l, 4l] for eager's [l, 2l, 3l])."""
    x = torch.randn(2, 4)

    def run(step):
        args = (x, torch.zeros(2, 3, 4)) if form is _InputWrite else (x,)
        outs = [step(*args) for _ in range(3)]
        return outs, args[1:]

    torch.manual_seed(0)
    want, want_state = run(form().eval())
    torch.manual_seed(0)
    m = form().eval()
    before = {k: v.clone() for k, v in vars(m).items() if type(v) is torch.Tensor}
    with torch.no_grad():
        step = (translator.translate(m, (x, torch.zeros(2, 3, 4)) if form is _InputWrite else (x,), backend="reference")
                if how == "translate" else torch.compile(m, backend="flydsl", options={"backend": "reference"}))
        if how == "translate":
            assert all(torch.equal(v, getattr(m, k)) for k, v in before.items()), "translate() advanced the model"
        got, got_state = run(step)
    for a, b in zip(got + list(got_state), want + list(want_state)):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["translate", "compile", "compile-dynamic"])
def test_32_tokens_at_issue_size(how):
    """The issue's size (2 layers, dim 128, 4 q / 2 kv heads, prompt 8) for 32 new tokens."""
    m = _model("view", D.DEFAULT)
    prompt, pos = D.get_inputs(D.DEFAULT)
    tokens, caches = _eager(m, prompt, 32)
    if how == "translate":
        step = translator.translate(m, (prompt, pos), backend="reference")
    else:
        step = torch.compile(m, backend="flydsl", dynamic=how == "compile-dynamic", options={"backend": "reference"})
    assert D.generate(step, prompt, 32) == tokens
    if how != "translate":
        for got, want in zip(D.caches(m), caches):
            torch.testing.assert_close(got, want, **model_tol())
        assert len(compile_backend.reports()) == 2 and sum(r.calls_translated for r in compile_backend.reports()) == 32


def test_translate_specializations_share_one_cache():
    """Prefill and decode translated with fixed shapes (dynamic_shapes=None): the decode translation made
    by tm.specialize writes tm's cache; a second translate() owns its own copy and reads a cache that the
    prefill translation never wrote (the torch.compile bug, by hand)."""
    m = _model()
    prompt, pos = D.get_inputs(D.TINY, 4)
    tokens, _ = _eager(m, prompt, NEW)
    one = torch.tensor([4])
    prefill = translator.translate(m, (prompt, pos), backend="reference", dynamic_shapes=None)
    decode = prefill.specialize(prompt[:, :1], one)

    def step(idx, p):
        return (prefill if idx.shape[1] > 1 else decode)(idx, p)

    assert D.generate(step, prompt, NEW) == tokens
    assert all(float(c.abs().max()) == 0 for c in D.caches(m))
    apart = translator.translate(m, (prompt[:, :1], one), backend="reference", dynamic_shapes=None)
    D.reset_caches(prefill)

    def unshared(idx, p):
        return (prefill if idx.shape[1] > 1 else apart)(idx, p)

    assert D.generate(unshared, prompt, NEW) != tokens
