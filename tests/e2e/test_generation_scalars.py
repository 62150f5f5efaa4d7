"""An int that a generation cache carries from step to step passes through dynamo's graph: it is not a
translation key (translator/frontends/generation_scalars.py). Before, the backend translated the decode
graph again for each value and past MAX_VARIANTS ran the calls in PyTorch (Mistral's sliding-window
cache: 8 decode steps translated, the rest in PyTorch)."""

from __future__ import annotations

import pytest
import torch

from translator.frontends import compile_backend
from translator.frontends.generation_scalars import PassThrough, int_guard_hint

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py


class Step:
    """A plain object with a Python int bumped each call, as transformers' StaticSlidingWindowLayer does."""

    def __init__(self):
        self.n = 0


class Bump(torch.nn.Module):
    def __init__(self, reads_n: str):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.pos = torch.nn.Embedding(64, 16)
        self.reads_n = reads_n

    def forward(self, x, step):
        y = self.lin(x)
        if self.reads_n == "positions":  # HF's forward without position_ids: arange(S) + the cache's length
            y = y + self.pos(torch.arange(x.shape[0]) + step.n)
        if self.reads_n == "slice":  # a size: it stays a key
            y = y[:, : 16 - step.n % 4]
        step.n += 1
        return y


def _run(reads_n: str, calls: int):
    torch.manual_seed(0)
    model = Bump(reads_n).eval()
    xs = [torch.randn(2, 16) for _ in range(calls)]
    want_step, got_step = Step(), Step()
    want = [model(x, want_step) for x in xs]
    compiled = torch.compile(model, backend="flydsl", dynamic=True, options={"backend": "reference"})
    with torch.no_grad():
        got = [compiled(x, got_step) for x in xs]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert got_step.n == want_step.n == calls
    return compile_backend.reports()


@pytest.mark.parametrize("reads_n", ["", "positions"])
def test_a_counter_int_is_no_translation_key(reads_n):
    """Only bumped, or also added to a tensor (a 0-d tensor input of the translation, read at each call)."""
    calls = compile_backend.MAX_VARIANTS + 4
    recs = _run(reads_n, calls=calls)
    through = [r for r in recs if r.calls_translated > 1]
    assert len(through) == 1, compile_backend.summary()
    # one translation serves every value of the int; none ran in PyTorch
    assert len(through[0].translated) == 1 and not any(r.calls_pytorch or r.fallback_reason for r in recs), \
        compile_backend.summary()


def test_an_int_read_by_a_tensor_op_stays_a_key():
    recs = _run("slice", calls=6)
    assert sum(len(r.translated) for r in recs) >= 4, compile_backend.summary()  # n % 4 takes 4 values


def test_pass_through_finds_only_ints_that_feed_int_outputs():
    g = torch.fx.Graph()
    x, n, m = g.placeholder("x"), g.placeholder("n"), g.placeholder("m")
    import operator

    n1 = g.call_function(operator.add, (n, 1))
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, m))
    g.output((n1, y, m))
    p = PassThrough(torch.fx.GraphModule(torch.nn.Module(), g), [torch.ones(2), 5, 3])
    assert p.inputs == {1} and set(p.outputs) == {0}
    assert p.patch((99, "y", 3), [None, 7, 3]) == (8, "y", 3)
    assert not p.operands and p.graph(p_gm := torch.fx.GraphModule(torch.nn.Module(), g)) is p_gm


def test_int_guard_hint_names_the_int_and_the_fix():
    hint = int_guard_hint("0/7: kwargs['cache'].layers[0].cumulative_length_int == 12 # is_full = ...")
    assert "cumulative_length_int" in hint and "torch.compiler.config.dynamic_sources" in hint
    assert int_guard_hint("0/0: len(kwargs) == 6 # if old_name in kwargs") is None
