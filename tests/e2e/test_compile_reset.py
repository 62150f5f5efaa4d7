"""compile_backend.reset() starts the records over without touching dynamo's own state: a compile after
it reports what that compile did, not the graph breaks of earlier compiles in the process (dynamo's
counters are process-wide and neither reset clears them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import translator  # noqa: F401  (registers the backend)
from translator.frontends import compile_backend


class WithBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h)


class NoBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)

    def forward(self, x):
        return torch.relu(self.a(x))


def _compile(cls, x):
    torch.manual_seed(0)
    with torch.no_grad():
        torch.compile(cls().eval(), backend="flydsl", options={"backend": "reference"})(x)
    return compile_backend.reports()


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_compile_after_reset_reports_only_its_own_graph_breaks():
    x = torch.randn(4, 32)
    first = _compile(WithBreak, x)
    assert any("graph_break" in b for r in first for b in r.graph_breaks), [r.line() for r in first]
    compile_backend.reset()
    torch._dynamo.reset()  # what a user does to compile afresh; dynamo's counters survive both resets
    recs = _compile(NoBreak, x)
    assert len(recs) == 1 and recs[0].graph_breaks == [], recs[0].line()  # was: WithBreak's break, again
    compile_backend.reset()
    torch._dynamo.reset()
    again = _compile(WithBreak, x)
    assert [r.graph_breaks for r in again] == [r.graph_breaks for r in first], (  # was "(x2)"
        [r.line() for r in again], [r.line() for r in first])
