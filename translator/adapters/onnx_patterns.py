"""ONNX forms the importer puts back together before the graph reaches torch.export.

**Attention (the exporters' SDPA decomposition).** Both torch.onnx exporters write
`F.scaled_dot_product_attention` at opsets below 23 as

    MatMul(Mul(Q, √s), Mul(Kᵀ, √s)) [+ mask] -> Softmax(axis=-1) -> MatMul(·, V)

(the scale split over both operands for range). Imported op by op, torch.export sees two scaled
operands of a bmm, a form the translator's attention matchers do not take, so the PyTorch model
became flydsl.attention and its export did not (bundled llama_block, both exporters). The chain is
rewritten into one `SDPA` node, imported as `F.scaled_dot_product_attention(Q, K, V,
attn_mask=mask, scale=√s·√s)`, which the attention lowering then serves as it serves the PyTorch
model. Only that exact form is taken: both Muls by one constant scalar, every intermediate value
read once (by the next node of the chain), Softmax over the last axis, an additive mask; where the
head count or head size turns out symbolic at capture (the attention kernel needs them static), the
node runs the chain as exported, which is what it was before. Manual
attention written as `(q @ kᵀ) * scale` imports as those aten ops and is matched downstream.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F


def _number(v):
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    return float(v) if isinstance(v, (int, float)) else None


def _sdpa(n, q, kt, v, mask=None, s1=None, s2=None):
    a, b = (n.attrs["scales"][0] or _number(s1)), (n.attrs["scales"][1] or _number(s2))
    static = all(type(d) is int for d in (*q.shape[1:2], *q.shape[-1:], *kt.shape[-2:-1]))
    if a is None or b is None or not static:  # a scale that came out a tensor, or heads / head size symbolic
        # (a dynamic image dim read through the exporter's size arithmetic): the chain as exported
        w = (q * s1) @ (kt * s2)
        return torch.softmax(w if mask is None else w + mask, dim=-1) @ v
    return F.scaled_dot_product_attention(q, kt.transpose(-2, -1), v, attn_mask=mask, scale=a * b)


PATTERN_OPS = {"SDPA": _sdpa}  # node kinds made here (never an ONNX op type: those are onnx_ops.OPS)


SIZE_MATH = {"Shape", "Cast", "Sqrt", "Div", "Mul", "Add", "Sub", "Slice", "Gather", "Squeeze", "Unsqueeze",
             "Reciprocal", "Neg", "Abs"}  # ops that keep a value computed from sizes a Python number (onnx_ops)


def fuse_attention(nodes: list, scalar, outputs, make_node, is_const) -> tuple[list, int]:
    """`nodes` with each SDPA decomposition replaced by one SDPA node (see the module docstring);
    `scalar(name)` is a constant value's Python float or None, `is_const(name)` whether it is a
    constant. A scale computed from the inputs' sizes (the TorchScript exporter's 1 / sqrt(float(d)))
    is taken too: it is a Python number when the graph runs. Returns (nodes, rewrites)."""
    producer = {o: n for n in nodes for o in n.outputs}
    uses = Counter(i for n in nodes for i in n.inputs) + Counter(outputs)
    memo: dict = {}

    def from_sizes(name) -> bool:
        if name not in memo:
            p = producer.get(name)
            memo[name] = is_const(name) if p is None else p.op_type == "Shape" or (
                p.op_type in SIZE_MATH and all(i == "" or from_sizes(i) for i in p.inputs))
        return memo[name]

    def only(name, op):  # the node of type `op` producing `name`, if `name` is read once (by the chain)
        p = producer.get(name)
        return p if p is not None and p.op_type == op and uses[name] == 1 else None

    def scaled(name):  # Mul(x, c) with a constant or size-computed scalar c -> (x, c's name, its value or None, node)
        m = only(name, "Mul")
        if m is None:
            return None
        for a, b in (m.inputs, m.inputs[::-1]):
            c = scalar(b)
            if (c is not None or (producer.get(b) is not None and from_sizes(b))) and not from_sizes(a):
                return a, b, c, m
        return None

    def same_scale(q, k) -> bool:  # one constant twice, or one size-computed value (or two ops alike on one)
        if q[2] is not None or k[2] is not None:
            return q[2] == k[2]
        pq, pk = producer[q[1]], producer[k[1]]
        return q[1] == k[1] or (pq.op_type == pk.op_type and pq.inputs == pk.inputs and pq.attrs == pk.attrs)

    gone, fused = set(), {}
    for pv in nodes:
        if pv.op_type != "MatMul" or id(pv) in gone:
            continue
        sm = only(pv.inputs[0], "Softmax")
        if sm is None or sm.attrs.get("axis", -1) != -1:
            continue
        scores, mask, add = sm.inputs[0], "", only(sm.inputs[0], "Add")
        if add is not None:
            a, b = add.inputs
            scores, mask = (a, b) if only(a, "MatMul") is not None else (b, a)
        mm = only(scores, "MatMul")
        if mm is None:
            continue
        q, k = scaled(mm.inputs[0]), scaled(mm.inputs[1])
        if q is None or k is None or not same_scale(q, k):
            continue
        chain = [q[3], k[3], mm, sm] + ([add] if add is not None else [])
        gone.update(id(n) for n in chain)
        fused[id(pv)] = make_node("SDPA", pv.name, [q[0], k[0], pv.inputs[1], mask, q[1], k[1]], pv.outputs,
                                  {"scales": (q[2], k[2])})
    out = [fused.get(id(n), n) for n in nodes if id(n) not in gone]
    return out, len(fused)

