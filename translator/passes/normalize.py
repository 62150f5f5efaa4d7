"""Normalize: every aten call in one argument form, positional parameters by position and
keyword-only parameters by keyword (translator.graph.schema_form).

Capture paths differ in how they pass arguments (``F.rms_norm(x, s, eps=1e-6)`` may arrive with
eps as a keyword and no weight; the symbolic_trace fallback keeps the user's keywords). After
this pass, ``node.args[i]`` and `translator.graph.arg` agree on every aten call, so a rule reads
an argument one way. A skipped middle parameter gets its schema default.
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
