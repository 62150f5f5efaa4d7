"""In-place elementwise writes of state (translator/lowerings/inplace.py): one kernel writing the tensor in place.

HF's StaticCache bumps a 0-d int64 counter per layer (`cumulative_length.add_(kv_length)`, the step's
sequence length); in the graph translate_for_generation translates they were the two compute ops of tiny
Llama's step left in PyTorch ("no FlyDSL lowering for aten.add_ yet"). Each form here is checked for
what eager computes over several calls (the state advancing as eager's does), that the rewrite fired
(its counter, no compute op left in PyTorch) and, under flysim, that the FlyDSL kernel launched.
The state contract (docs/state.md): translate() leaves the model's own state as it was and writes its
one copy; torch.compile writes the user's tensor.
"""

from __future__ import annotations

import copy

import pytest
import torch

import translator
from translator import state
from translator.tolerances import model_tol
from translator.lowerings import inplace  # noqa: F401  (registers flydsl.elementwise_)

ELEMENTWISE_ = torch.ops.flydsl.elementwise_.default

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


def _compute_in_pytorch(report) -> list:
    return [(r.node, r.op, r.detail) for r in report.rows if r.where == "pytorch" and not r.layout]


# --- the forms, each on a buffer ------------------------------------------------------------------

class _Form(torch.nn.Module):
    """A buffer `s` written in place by `fn(s, x)`, then read (the output shows the written value)."""

    def __init__(self, fn, init):
        super().__init__()
        self.fn = fn
        self.register_buffer("s", init.clone())

    def forward(self, x):
        self.fn(self.s, x)
        return self.s * 1 + x.sum()


FORMS = {  # name -> (fn, initial state, input, the rewrite's counter)
    "counter_add_int64": (lambda s, x: s.add_(1), torch.tensor(3), torch.ones(2), "inplace_add_"),
    "counter_add_size": (lambda s, x: s.add_(x.shape[0]), torch.tensor(0, dtype=torch.int32), torch.ones(3),
                         "inplace_add_"),
    "sub_int64_tensor": (lambda s, x: s.sub_(torch.tensor([2, 1])), torch.tensor([9, 9]), torch.ones(2), "inplace_sub_"),
    "ema_mul_add_alpha": (lambda s, x: s.mul_(0.9).add_(x, alpha=0.1), torch.zeros(2, 8), torch.randn(2, 8),
                          "inplace_add_"),
    "bf16_add_f32": (lambda s, x: s.add_(x), torch.zeros(2, 8, dtype=torch.bfloat16), torch.randn(2, 8),
                     "inplace_add_"),
    "div_float": (lambda s, x: s.div_(2.0), torch.full((4,), 8.0), torch.ones(4), "inplace_div_"),
    "clamp_float": (lambda s, x: s.add_(x).clamp_(-1.0, 1.0), torch.zeros(6), torch.randn(6), "inplace_clamp_"),
    "fill_scalar": (lambda s, x: s.fill_(7), torch.zeros(3, dtype=torch.int64), torch.ones(3), "inplace_fill_"),
    "fill_tensor": (lambda s, x: s.fill_(x.sum()), torch.zeros(5), torch.randn(3), "inplace_fill_"),
    "zero_": (lambda s, x: s.zero_(), torch.ones(4), torch.ones(4), "inplace_zero_"),
    "copy_with_cast": (lambda s, x: s.copy_(x * 3), torch.zeros(4, dtype=torch.int32), torch.randn(4),
                       "inplace_copy_"),
}


def _eager(make, x, calls):
    m = make()
    outs = [m(x) for _ in range(calls)]
    return outs, m.s.clone()


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_is_one_in_place_kernel_and_advances_like_eager(name):
    fn, init, x, counter = FORMS[name]

    def make():
        return _Form(fn, init).eval()

    want, want_state = _eager(make, x, 3)
    m = make()
    with torch.no_grad():
        tm = translator.translate(m, (x,), backend="reference")
    assert torch.equal(m.s, init), "translate() advanced the model's own state"
    assert tm.report.counters.get(counter, 0) >= 1, tm.report.counters
    assert sum(1 for n in tm.gm.graph.nodes if n.target is ELEMENTWISE_) >= 1
    assert not _compute_in_pytorch(tm.report)
    with torch.no_grad():
        got = [tm(x) for _ in range(3)]
    tol = model_tol(torch.bfloat16) if init.dtype == torch.bfloat16 else {}  # the output's bf16 add rounds once
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    (written,) = state.written_targets(tm.gm)
    own = state.tensor_at(tm.gm, written)
    assert own.dtype == init.dtype
    torch.testing.assert_close(own, want_state)


def test_a_temporary_written_in_place_joins_the_elementwise_region():
    """`y = a * b; y.add_(c)`: nothing else reads y, so the region kernel takes the add_ (no in-place launch)."""
    m = _Form(lambda s, x: None, torch.zeros(1)).eval()
    m.forward = lambda x: (lambda y: y.add_(1.5).mul_(x))(x * 2)
    want = m(torch.arange(4.0))
    tm = translator.translate(m, (torch.arange(4.0),), backend="reference")
    assert not any(n.target is ELEMENTWISE_ for n in tm.gm.graph.nodes)
    assert tm.report.counters.get("fused_elementwise_ops", 0) == 3 and not _compute_in_pytorch(tm.report)
    torch.testing.assert_close(tm(torch.arange(4.0)), want)


class _InputCounter(torch.nn.Module):
    """The caller's tensors are the state (HF's StaticCache tensors under torch.compile arrive this way)."""

    def forward(self, x, n, acc):
        n.add_(x.shape[0])
        acc.mul_(0.5).add_(x)
        return acc.sum() + n


@pytest.mark.parametrize("how", ["translate", "compile"])
def test_a_callers_tensor_is_written_where_it_is(how):
    x = torch.randn(3)
    n0, acc0 = torch.tensor(2), torch.ones(3)
    n, acc = n0.clone(), acc0.clone()
    want = [_InputCounter()(x, n, acc) for _ in range(3)]
    n1, acc1 = n0.clone(), acc0.clone()
    if how == "translate":
        step = translator.translate(_InputCounter(), (x, n0.clone(), acc0.clone()), backend="reference")
        assert sum(1 for nd in step.gm.graph.nodes if nd.target is ELEMENTWISE_) == 3
        assert not _compute_in_pytorch(step.report)
    else:
        step = torch.compile(_InputCounter(), backend="flydsl", options={"backend": "reference"})
    got = [step(x, n1, acc1) for _ in range(3)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.equal(n1, n) and torch.allclose(acc1, acc)
    if how == "compile":
        _assert_compiled_in_place(3)


def test_compile_writes_the_users_counter_buffer():
    fn, init, x, _ = FORMS["ema_mul_add_alpha"]
    want, want_state = _eager(lambda: _Form(fn, init).eval(), x, 3)
    m = _Form(fn, init).eval()
    user = m.s
    cm = torch.compile(m, backend="flydsl", options={"backend": "reference"})
    got = [cm(x) for _ in range(3)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert m.s is user
    torch.testing.assert_close(user, want_state)
    _assert_compiled_in_place(3)


def _assert_compiled_in_place(calls):
    """Every call ran through a translation whose in-place writes are flydsl.elementwise_, nothing computed
    in PyTorch."""
    from translator.frontends import compile_backend

    recs = compile_backend.reports()
    assert recs and sum(r.calls_translated for r in recs) == calls and not any(r.calls_pytorch for r in recs)
    for tm in (tm for r in recs for tm in r.translated):
        assert any(n.target is ELEMENTWISE_ for n in tm.gm.graph.nodes)
        assert not _compute_in_pytorch(tm.report), _compute_in_pytorch(tm.report)


def test_flysim_launches_the_in_place_kernels():
    """int64 counter by a symbolic size, float EMA, fill: each a recorded FlyDSL launch, values eager's."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.tensor(5))
            self.register_buffer("ema", torch.zeros(2, 8))
            self.register_buffer("last", torch.zeros(2, dtype=torch.int32))

        def forward(self, x):
            self.n.add_(x.shape[1])
            self.ema.mul_(0.9).add_(x, alpha=0.1)
            self.last.fill_(3)
            return self.ema + self.n

    x = torch.randn(2, 8)
    eager = M().eval()
    want = [eager(x) for _ in range(2)]
    tm = translator.translate(M().eval(), (x,), backend="flysim")
    got = [tm(x) for _ in range(2)]
    calls = [c for c in tm.last_calls if c.family == "elementwise_"]
    assert len(calls) == 4 and all(len(c.launches) == 1 for c in calls), calls
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    own = {t: state.tensor_at(tm.gm, t) for t in state.written_targets(tm.gm)}
    assert sorted(own) == ["ema", "last", "n"]
    torch.testing.assert_close(own["n"], eager.n)
    torch.testing.assert_close(own["ema"], eager.ema)
    assert torch.equal(own["last"], eager.last)


# --- HF Llama's StaticCache counters ---------------------------------------------------------------

HF_TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)


def _hf_step():
    transformers = pytest.importorskip("transformers")
    from translator.frontends.generation import StaticCacheStep

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**HF_TINY),
                                                        attn_implementation="sdpa").eval()
    return StaticCacheStep(model, 1, 48).eval()


def _counters(step):
    return [layer.cumulative_length for layer in step.step.static_cache.layers]


def _decode(step, ids, n):
    """Prefill, then `n` greedy decode steps; the logits of each call."""
    outs = [step(ids, torch.arange(ids.shape[1]))]
    pos = ids.shape[1]
    for _ in range(n):
        tok = outs[-1][:, -1:].argmax(-1)
        outs.append(step(tok, torch.tensor([pos])))
        pos += 1
    return outs


def test_hf_llama_static_cache_counters_are_in_place_kernels():
    ids = torch.randint(0, HF_TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
    eager = _hf_step()
    with torch.no_grad():
        want = _decode(eager, ids, 8)
    want_counters = [c.clone() for c in _counters(eager)]
    assert [int(c) for c in want_counters] == [16, 16]

    step = _hf_step()
    with torch.no_grad():
        tm = translator.translate(step, (ids, torch.arange(8)), backend="reference")
    assert not _compute_in_pytorch(tm.report), _compute_in_pytorch(tm.report)
    assert tm.report.counters.get("inplace_add_") == 2
    writes = [n for n in tm.gm.graph.nodes if n.target is ELEMENTWISE_]
    assert len(writes) == 2 and all(n.args[0].meta["val"].shape == () for n in writes)
    assert [int(c) for c in _counters(step)] == [0, 0], "translate() advanced the model's counters"
    with torch.no_grad():
        got = _decode(tm, ids, 8)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol())
    counters = [state.tensor_at(tm.gm, t) for t in state.written_targets(tm.gm)
                if state.tensor_at(tm.gm, t).dim() == 0 and state.tensor_at(tm.gm, t).dtype == torch.int64]
    assert sorted(int(c) for c in counters) == [16, 16]


def test_hf_llama_static_cache_counters_under_compile():
    ids = torch.randint(0, HF_TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
    eager = _hf_step()
    with torch.no_grad():
        want = _decode(eager, ids, 8)
    step = _hf_step()
    user = _counters(step)
    cm = torch.compile(step, backend="flydsl", options={"backend": "reference"})
    with torch.no_grad():
        got = _decode(cm, ids, 8)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol())
    assert all(a is b for a, b in zip(_counters(step), user))
    assert [int(c) for c in user] == [16, 16]
    _assert_compiled_in_place(9)


class _CacheAndCounter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 8))
        self.register_buffer("n", torch.tensor(0))

    def forward(self, x, pos):
        self.cache[pos] = x
        self.n.add_(1)
        return self.cache.sum(0) + self.n


def test_flysim_verification_leaves_the_state_as_it_was():
    """The fast forward calls a FlyDSL op's body without the custom op, whose wrapper bumps a written
    tensor's version; a kernel's store does not, so `state.preserved` saw no change and verification's run
    stayed in the translation's state (a KV cache holding the example's rows, a counter one step ahead).
    The fast forward now bumps the version of what each op writes."""
    x, pos = torch.randn(2, 8), torch.tensor([1, 3])
    tm = translator.translate(_CacheAndCounter().eval(), (x, pos), backend="flysim")
    assert tm.report.verification.passed
    assert int(tm.gm.n) == 0 and not tm.gm.cache.any(), "verification left the translation's state advanced"
    eager = _CacheAndCounter().eval()
    torch.testing.assert_close(tm(x, pos), eager(x, pos))
    assert {c.family for c in tm.last_calls if c.launches} >= {"cache_write", "elementwise_"}
    assert int(tm.gm.n) == 1 and torch.equal(tm.gm.cache, eager.cache)


def test_the_kernel_entry_refuses_what_it_cannot_write_in_place():
    """A strided destination or operands that would grow it: KernelInputError naming the problem, nothing written."""
    from translator_kernels.codegen.inplace import elementwise_into
    from translator_kernels.errors import KernelInputError
    from translator_kernels.program import Program

    add = Program(2, (("add", (0, 1), ()),), ((2, "f32"),)).text()
    base = torch.zeros(4, 6)
    with pytest.raises(KernelInputError, match="contiguous"):
        elementwise_into(base[:, 1:3], [torch.ones(())], add)
    with pytest.raises(KernelInputError, match="broadcast to"):
        elementwise_into(torch.zeros(6), [torch.ones(4, 6)], add)
    with pytest.raises(KernelInputError, match="dtype"):
        elementwise_into(torch.zeros(6, dtype=torch.int64), [torch.ones(6)], add)
    assert not base.any()


@pytest.mark.slow  # ~25 s on 2 cores; test_flysim_launches_the_in_place_kernels covers the launches in the default suite
def test_flysim_hf_llama_counters_are_launches():
    ids = torch.randint(0, HF_TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
    eager = _hf_step()
    with torch.no_grad():
        want = _decode(eager, ids, 2)
    tm = translator.translate(_hf_step(), (ids, torch.arange(8)), backend="flysim", verify=False)
    with torch.no_grad():
        got = _decode(tm, ids, 2)
    calls = [c for c in tm.last_calls if c.family == "elementwise_"]
    assert len(calls) == 2 and all(len(c.launches) == 1 for c in calls), calls
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **model_tol())
    counters = [state.tensor_at(tm.gm, t) for t in state.written_targets(tm.gm)
                if state.tensor_at(tm.gm, t).dim() == 0 and state.tensor_at(tm.gm, t).dtype == torch.int64]
    assert sorted(int(c) for c in counters) == [10, 10] == sorted(int(c) for c in _counters(eager))
