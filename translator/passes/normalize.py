"""Normalize: every aten call in one argument form, the schema's own: positional parameters by
position, keyword-only parameters by keyword (translator.graph.schema_form).

Capture paths differ in how they pass arguments (``F.rms_norm(x, s, eps=1e-6)`` may arrive with
eps as a keyword and no weight; the symbolic_trace fallback keeps the user's keywords). After
this pass every aten call has that one form. A skipped middle parameter gets its schema default.

Rules never depend on the form: lowerings read every argument by its schema name with
`translator.graph.arg` (and write with `translator.graph.set_args`); tests/unit/test_architecture.py
fails on ``.args[`` indexing in a lowering.

Why the schema form and not keyword form (every argument in ``node.kwargs``, ``node.args``
empty), which was the first plan:

- Nodes created after this pass are written positionally: `LowerCtx.insert` / `cast`, the loss
  decompositions, functionalize's out-of-place ops, torch's own rewrites. Keyword form would hold
  only until the first rewrite; the schema form is what those writers produce, so it holds for
  the whole pipeline and a second normalization is never needed.
- FX writes a graph as Python source. An argument named like a Python keyword cannot be written
  as a keyword: ``aten.uniform(self = x, from = 0.0, to = 1.0)`` fails to recompile with a
  SyntaxError (checked with torch 2.13), so keyword form would need exceptions anyway.
- Code that reads graphs besides our rules (the report's cost model, the fast path's
  `schema_args`, torch's FX utilities) and people reading a translated module's code expect
  aten calls written the way torch writes them.
"""

from __future__ import annotations

import torch

from ..graph import schema_form


def normalize(ctx) -> int:
    count = 0
    for n in ctx.gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        new = schema_form(n.target, n.args, n.kwargs)
        if new is not None:
            n.args, n.kwargs = new
            count += 1
    return count
