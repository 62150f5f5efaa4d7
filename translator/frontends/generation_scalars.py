"""Ints that only pass through a dynamo graph: computed at each call, never a translation key.

The torch.compile backend bakes every int dynamo passes into the translation (a size fixes shapes
and strides) and keys the translation on its value: a call with another value is translated again,
up to MAX_VARIANTS per graph, then runs in PyTorch. Right for sizes; wrong for an int that a
generation cache carries from step to step. transformers' sliding-window static cache layer
(Mistral, Gemma-2/3, Qwen2 with use_sliding_window) keeps `cumulative_length_int`, a Python int it
bumps in `update`; under dynamic=True (or dynamo's automatic dynamic, after the first decode
recompile) dynamo passes it to the decode graph as a SymInt, and the graph's only use of it is

    add_3 = l_kwargs_cache_layers_0_cumulative_length_int + 1
    return (add_3, logits)

the new value dynamo writes back to the cache object. Every decode step had a new value: a new
translation each step, and past 8 steps PyTorch (12 tokens: 8 translated, 3 in PyTorch).

`PassThrough` finds such inputs: an int placeholder whose every use is either Python int arithmetic
(`operator.*`, `torch.sym_*`), or tensor arithmetic that reads it as a scalar operand. Int arithmetic
ending in graph outputs is recomputed per call; a value of it that a tensor op reads (HF's
sliding-window mask offset `max(length - window + 1, 0)`, then `arange(S_max) + offset`) is baked
into the translation, which is keyed on that value instead of the input's (0 until the window is
full: one translation, and the mask stays provably causal, attention_cache.py). The second is HF's forward called without position_ids (a custom loop,
`model(ids, cache=cache)`): `position_ids = arange(S) + cache.get_seq_length()`, the layer's int.
The translation is keyed without such an int: its tensor uses read a 0-d int64 tensor made from the
call's value (an input of the translation: the positions are computed on the device at each call; on a
GPU that is one small host-to-device copy per step, as eager's `arange + int` has),
and the graph outputs made of int arithmetic are recomputed from the call's ints (the value baked
into the translation is replaced). An int that reaches any other tensor op (a slice bound, a view
size, `arange`'s end) stays a key, as before.

With dynamic=False dynamo specializes every int: the layer's int is a guard
(`cumulative_length_int == 6`) and each decode step recompiles in dynamo, before any backend runs.
That is dynamo doing what dynamic=False asks; the narrowest fix is to tell dynamo that this one
int varies: `torch.compiler.config.dynamic_sources = r".*\\.cumulative_length_int"` (dominant over
dynamic=False; `int_guard_hint`, which the backend's recompile-limit warning quotes).
"""

from __future__ import annotations

import math
import operator
import re

import torch

_INT_OPS = {getattr(operator, n) for n in ("add", "sub", "mul", "floordiv", "mod", "neg", "pos", "eq", "ne", "lt",
                                              "le", "gt", "ge", "truediv", "abs", "pow")}
_INT_OPS |= {max, min, abs, math.floor, math.ceil}
_INT_OPS |= {getattr(torch, n) for n in ("sym_max", "sym_min", "sym_not", "sym_int", "sym_float") if hasattr(torch, n)}

_INT_GUARD = re.compile(r"[\w\]]\.(\w+) == -?\d+(?:\s|$)")


def int_guard_hint(reason: str | None) -> str | None:
    """What to tell a user whose recompile reason is an int attribute's value guard
    (`kwargs['cache'].layers[0].cumulative_length_int == 6`), or None."""
    m = _INT_GUARD.search(str(reason or ""))
    if not m:
        return None
    return (f"dynamo specializes the int attribute {m.group(1)}, which changes every call (dynamic=False does so; "
            f"transformers' sliding-window cache keeps cumulative_length_int): mark that one int dynamic, "
            f"torch.compiler.config.dynamic_sources = r'.*\\.{m.group(1)}' (docs/state.md)")


def _is_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


_TENSOR_ARITH = {operator.add, operator.sub, operator.mul, torch.add, torch.sub, torch.mul}


def _example(n):
    return n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else n


def _scalar_operand(u, ph) -> bool:
    """u is tensor arithmetic that reads int `ph` as a scalar operand of a tensor (`arange(S) + n`)."""
    return (u.op == "call_function" and u.target in _TENSOR_ARITH and not u.kwargs and len(u.args) == 2
            and isinstance(_example(u), torch.Tensor)
            and any(a is ph for a in u.args) and any(isinstance(_example(a), torch.Tensor) for a in u.args))


class PassThrough:
    """The int inputs of a dynamo graph that reach only int arithmetic feeding its outputs, or tensor
    arithmetic as a scalar operand, and how to serve them without baking their value."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        pure: set = {ph for ph, x in zip(phs, example_inputs) if _is_int(x)}
        for n in gm.graph.nodes:  # int arithmetic over ints (topological order)
            if (n.op == "call_function" and n.target in _INT_OPS and not n.kwargs
                    and all(a in pure if isinstance(a, torch.fx.Node) else _is_int(a) for a in n.args)):
                pure.add(n)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        self._index = {ph: i for i, ph in enumerate(phs)}
        # per int input read by tensor arithmetic: those nodes (they read a 0-d tensor instead)
        operands = {i: us for i, ph in enumerate(phs) if ph in pure
                    and (us := [u for u in ph.users if _scalar_operand(u, ph)])}
        # a value of int arithmetic read by anything else (a slice bound, a view size, `arange + offset`): the
        # translation bakes it and is keyed on it, computed from each call's ints
        frontier = [n for n in gm.graph.nodes if n in pure and any(
            u is not out and u not in pure and not (n.op == "placeholder" and u in operands.get(self._index[n], ()))
            for u in n.users)]
        self.inputs = frozenset(i for i, ph in enumerate(phs) if ph in pure and ph.users and ph not in frontier)
        self.operands = operands
        self._devices = {i: next(_example(a).device for a in us[0].args if isinstance(_example(a), torch.Tensor))
                         for i, us in operands.items()}
        # the key: the frontier values that a pass-through input feeds (the others are keyed as inputs)
        self._keys = [n for n in frontier if n.op != "placeholder" and self._reads_inputs(n)]
        results = out.args[0]
        self._flat = isinstance(results, (tuple, list))
        outs = list(results) if self._flat else [results]
        # an output of int arithmetic that reads a pass-through input: the translation's value is stale
        self.outputs = {k: n for k, n in enumerate(outs) if isinstance(n, torch.fx.Node) and n in pure
                        and self._reads_inputs(n)}

    def _reads_inputs(self, n) -> bool:
        if n.op == "placeholder":
            return self._index[n] in self.inputs
        return any(self._reads_inputs(a) for a in n.args if isinstance(a, torch.fx.Node))

    def __bool__(self) -> bool:
        return bool(self.inputs)

    def key(self, args) -> tuple:
        """The values of int arithmetic over pass-through inputs that the translation bakes, for this call
        (Mistral's sliding-window kv offset, `max(length - window + 1, 0)`: 0 until the window is full)."""
        memo: dict = {}
        return tuple(self._eval(n, args, memo) for n in self._keys)

    def graph(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """gm, or a copy whose tensor arithmetic reads each such int as a 0-d int64 tensor, one more
        input per int after gm's own (`tensors` gives them): the translation takes the value at each
        call instead of baking it. A 0-d tensor promotes as a Python int does (`arange + n` stays int64;
        a float tensor stays float)."""
        if not self.operands:
            return gm
        import copy

        g = copy.deepcopy(gm.graph)
        phs = [n for n in g.nodes if n.op == "placeholder"]
        last = phs[-1]
        for i, old in self.operands.items():
            names = {u.name for u in old}
            with g.inserting_after(last):
                last = t = g.placeholder(f"{phs[i].name}_as_tensor")
            t.meta["example_value"] = torch.empty((), dtype=torch.int64, device="meta")
            for u in [u for u in phs[i].users if u.name in names]:
                u.args = tuple(t if a is phs[i] else a for a in u.args)
        return torch.fx.GraphModule(gm, g)

    def tensors(self, args) -> list:
        """The 0-d tensors `graph` appends as inputs, from this call's ints."""
        return [torch.tensor(int(args[i]), dtype=torch.int64, device=self._devices[i]) for i in self.operands]

    def _eval(self, n, args, memo):
        if n not in memo:
            memo[n] = args[self._index[n]] if n.op == "placeholder" else n.target(
                *(self._eval(a, args, memo) if isinstance(a, torch.fx.Node) else a for a in n.args))
        return memo[n]

    def patch(self, out, args):
        """The translation's outputs with the pass-through ones computed from this call's ints."""
        if not self.outputs:
            return out
        memo: dict = {}
        vals = list(out) if self._flat else [out]
        for k, n in self.outputs.items():
            vals[k] = self._eval(n, args, memo)
        return type(out)(vals) if self._flat else vals[0]
