"""The rewrite context and every FX helper the passes and lowerings share.

Reading a node:
- `val` / `dtype_of` / `shape_of` read the fake tensor in ``node.meta["val"]``; support checks
  read only these and never touch the graph.
- `arg(node, "name")` reads a call's argument by its schema name (aten and flydsl ops alike),
  whether it was passed by position or keyword, else the schema's default; `set_args` writes
  arguments by name and `getitem_of` reads a getitem. Lowerings read arguments only this way
  (tests/unit/test_architecture.py fails on ``.args[`` in a lowering). The `normalize` pass puts
  every aten call in the schema's form (positional parameters by position, keyword-only ones by
  keyword; its docstring says why not keyword form).
- `captured_name` is the name a node had in the captured graph (the report and node-by-node
  verification key on it); `users` leaves out export's dtype asserts, which read no values.
- Node order comes from FX itself (`position`, `before`): no per-pass ``{node: index}`` dicts.

Writing: every graph edit goes through `LowerCtx`, which keeps ``meta["val"]`` correct on each
node it creates. `LowerCtx.emit` is the one place a `flydsl.*` node is born: it writes the
``meta["flydsl"]`` record (family, lowering, the captured nodes it replaces, the anchor whose
value it must reproduce), bumps the lowering's counter and, for an op with several outputs,
adds one getitem per output. `LowerCtx.count` is the one way a pattern bumps a counter (tests
assert them; the report prints them).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch._guards import detect_fake_mode

from .state import is_lazy, materialize, placeholder, prepared

aten = torch.ops.aten
Node = torch.fx.Node

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
              "fp8": torch.bfloat16}  # fp8: linears in fp8 (lowerings.fp8_mode), the rest in bf16
ASSERT = aten._assert_tensor_metadata.default  # export's dtype checks around .to(); not real uses
CASTS = (aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default)


# --- metadata ------------------------------------------------------------------------------

def val(node) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else node


def dtype_of(node):
    return getattr(val(node), "dtype", None)


def shape_of(node):
    v = val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def dims(shape) -> list[str] | None:
    """A shape as printed dims (symbolic sizes compare by their expression)."""
    return None if shape is None else [str(d) for d in shape]


def full_shape(shapes):
    """The broadcast of symbolic shapes compared by their printed dims, or None if they clash."""
    r = max(len(s) for s in shapes)
    out = ["1"] * r
    for s in shapes:
        s = ["1"] * (r - len(s)) + [str(d) for d in s]
        for i, d in enumerate(s):
            if d != "1":
                if out[i] not in ("1", d):
                    return None
                out[i] = d
    return out


def same_shape(a, b) -> bool:
    sa, sb = shape_of(a), shape_of(b)
    return sa is not None and sb is not None and dims(sa) == dims(sb)


def static_int(d):
    """The int value of a dim that is fixed (an int, or a SymInt export specialized), else None."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt) and not d.node.expr.free_symbols:
        return int(d)
    return None


def is_static(*ds) -> bool:
    return all(static_int(d) is not None for d in ds)


def size_hint(d) -> int:
    """A dim's size: its value when fixed, else the example input's (a dynamic dim's hint)."""
    s = static_int(d)
    return s if s is not None else int(d.node.hint)


def dtype_reason(node, what: str = "input") -> str | None:
    """None for fp32 / bf16 / fp16 tensors, else the reason."""
    dt = dtype_of(node)
    if dt is None:
        return f"{what} is not a tensor with known metadata"
    if dt not in FLOAT_DTYPES:
        return f"{what} dtype {str(dt).replace('torch.', '')} is not supported (kernels take float32, bfloat16, float16)"
    return None


# --- arguments by schema -------------------------------------------------------------------

_MISSING = object()


def _schema(target):
    return target._schema.arguments if isinstance(target, torch._ops.OpOverload) else None


def arg(node: Node, name: str, default=_MISSING):
    """Argument `name` of call `node`: by keyword, else by its schema position, else `default`,
    else the schema's default (None when it has none).

    Rules often serve several overloads of one op (div.Tensor and div.Tensor_mode): a name
    another overload has reads as its default here; a name no overload has raises KeyError."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = _schema(node.target)
    if schema is None:
        raise KeyError(f"{node.target} has no schema; read its arguments by position")
    for i, a in enumerate(schema):
        if a.name == name:
            if not a.kwarg_only and i < len(node.args):
                return node.args[i]
            if default is not _MISSING:
                return default
            return a.default_value if a.has_default_value() else None
    if not _packet_has(node.target, name):
        raise KeyError(f"{node.target} has no argument {name!r} (schema: {[a.name for a in schema]})")
    return None if default is _MISSING else default


def set_args(node: Node, **named) -> None:
    """Give call `node` new values for the named arguments (by schema name; a positional parameter
    stays positional, a skipped one before it gets its default)."""
    schema = _schema(node.target)
    if schema is None:
        raise KeyError(f"{node.target} has no schema; set its arguments by position")
    args, kwargs = list(node.args), dict(node.kwargs)
    for name, v in named.items():
        i = next((i for i, a in enumerate(schema) if a.name == name), None)
        if i is None:
            raise KeyError(f"{node.target} has no argument {name!r} (schema: {[a.name for a in schema]})")
        if schema[i].kwarg_only or name in kwargs:
            kwargs[name] = v
            continue
        args += [a.default_value if a.has_default_value() else None for a in schema[len(args):i + 1]]
        args[i] = v
    node.args, node.kwargs = tuple(args), kwargs


def operand(node: Node):
    """The first argument of call `node`, by its schema name (``self``, ``input``, ...)."""
    schema = _schema(node.target)
    if schema is None:
        raise KeyError(f"{node.target} has no schema; read its arguments by position")
    return arg(node, schema[0].name)


def getitem_of(n):
    """(source node, index) when `n` is ``operator.getitem(source, index)``, else None."""
    if isinstance(n, Node) and n.op == "call_function" and n.target is operator.getitem:
        return n.args[0], n.args[1]
    return None


def _packet_has(target, name: str) -> bool:
    packet = target._overloadpacket
    return any(a.name == name for o in packet.overloads() for a in getattr(packet, o)._schema.arguments)


def schema_form(target, args: tuple, kwargs: dict):
    """(args, kwargs) of an aten call with positional parameters by position and keyword-only
    ones by keyword; None when nothing changes (or the target has no schema)."""
    schema = _schema(target)
    if schema is None or not kwargs:
        return None
    positional = [a for a in schema if not a.kwarg_only]
    moved = [i for i, a in enumerate(positional) if a.name in kwargs]
    if not moved:
        return None
    new_args = list(args)
    kw = dict(kwargs)
    for i in range(len(args), max(moved) + 1):
        a = positional[i]
        if a.name in kw:
            new_args.append(kw.pop(a.name))
        elif a.has_default_value():
            new_args.append(a.default_value)
        else:
            return None  # a required argument is missing: not a call we can rewrite
    return tuple(new_args), kw


# --- the graph -----------------------------------------------------------------------------

def captured_name(n: Node) -> str:
    """The node's name in the captured graph (nodes the passes created have none: their own name)."""
    return n.meta.get("orig_name") or n.name


def _name(n) -> str:
    return captured_name(n) if isinstance(n, Node) else n


def is_call(n, *targets) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def users(n: Node) -> list[Node]:
    """Users that read n's value: not export's dtype asserts."""
    return [u for u in n.users if u.target is not ASSERT]


def asserts(n: Node) -> list[Node]:
    return [u for u in n.users if u.target is ASSERT]


def single_user(n: Node) -> Node | None:
    us = list(n.users)
    return us[0] if len(us) == 1 else None


def erased(n: Node) -> bool:
    return getattr(n, "_erased", False)


def position(n: Node):
    """Sort key of a node's place in its graph (FX keeps one per node); erased nodes sort first."""
    return (-1,) if erased(n) else n._sort_key


def in_order(nodes) -> list[Node]:
    return sorted(nodes, key=position)


def before(x, g) -> bool:
    """x is computed before g in g's graph (so g may read it)."""
    if not isinstance(x, Node) or x is g or x.graph is not g.graph or erased(x) or erased(g):
        return False
    return x < g  # FX orders the nodes of one graph by Node._sort_key


# ops whose tensor inputs matter only through their shape, dtype and device
META_ONLY = {aten.new_ones.default, aten.new_zeros.default, aten.new_full.default, aten.new_empty.default,
             aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default,
             aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int}


def is_pure(node) -> bool:
    """A call with no side effect and no randomness (same inputs, same value)."""
    t = node.target
    if node.op != "call_function":
        return False
    if t in (operator.getitem,) or getattr(t, "__module__", "") in ("_operator", "operator", "math", "torch.sym"):
        return True
    if not isinstance(t, torch._ops.OpOverload) or t.namespace not in ("aten", "flydsl"):
        return False  # unknown callables
    if torch.Tag.nondeterministic_seeded in t.tags or t._schema.is_mutable:
        return False
    return True


def stable_toposort(graph: torch.fx.Graph) -> None:
    """Reorder `graph` topologically, moving as few nodes as possible (ties keep graph order)."""
    dg = nx.DiGraph()
    for n in graph.nodes:
        dg.add_node(n)
        for i in n.all_input_nodes:
            dg.add_edge(i, n)
    new = list(nx.lexicographical_topological_sort(dg, key=position))
    if new == list(graph.nodes):
        return
    prev = None
    for n in new:
        if n.op == "placeholder" or prev is None:
            prev = n
            continue
        if n.prev is not prev:
            prev.append(n)
        prev = n


# --- the rewrite context -------------------------------------------------------------------

@dataclass
class LowerCtx:
    gm: torch.fx.GraphModule
    arch: str
    precision: str  # "fp32" | "bf16" | "fp16"
    deny: dict = field(default_factory=dict)  # captured node name -> reason it must stay in PyTorch
    counters: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)  # captured node name -> why it was not lowered
    _n_attr: int = 0

    _fake: Any = field(default=None, repr=False, compare=False)  # (graph, fake mode) found last

    @property
    def graph(self) -> torch.fx.Graph:
        return self.gm.graph

    @property
    def fake_mode(self):
        """The fake mode of the captured graph's metadata (found once per graph, then reused)."""
        g = self.gm.graph
        if self._fake is not None and self._fake[0] is g:
            return self._fake[1]
        for n in g.nodes:  # every fake tensor of one export shares its mode: the first one tells
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                mode = detect_fake_mode([v])
                if mode is not None:
                    self._fake = (g, mode)
                    return mode
        return detect_fake_mode([])

    # --- bookkeeping --------------------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        """Bump the counter `name` (one per rewrite a pattern made)."""
        self.counters[name] = self.counters.get(name, 0) + n

    def not_lowered(self, node: Node, reason: str) -> None:
        self.reasons.setdefault(captured_name(node), reason)

    def denied(self, nodes) -> str | None:
        """The reason one of `nodes` is pinned to PyTorch (by the user or verification), else None."""
        for n in nodes:
            if captured_name(n) in self.deny:
                return self.deny[captured_name(n)]
        return None

    # --- metadata -------------------------------------------------------------------------
    def infer(self, node: Node) -> Node:
        """Compute node.meta['val'] by running its target on the fake inputs."""
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = node.target(*args, **kwargs)
        return node

    def constant(self, node) -> torch.Tensor | None:
        """The real tensor behind a get_attr node (a parameter or buffer), else None."""
        if isinstance(node, Node) and node.op == "get_attr":
            obj = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    return None
            if is_lazy(obj):  # a pass reads a prepared copy left unmade (state.settle): make that one
                materialize(self.gm, node.target)
                return self.constant(node)
            if is_traceable_wrapper_subclass(obj):  # torchao's MXTensor / Float8Tensor: no plain data to prepare
                return None
            return obj if isinstance(obj, torch.Tensor) else None
        return None

    def add_constant(self, tensor: torch.Tensor | None, hint: str, before: Node, *, derive=None, sources=(),
                     natural=None) -> Node:
        """Register a translate-time tensor (e.g. a preshuffled weight) and return its get_attr node.
        With `derive`: the tensor is `derive(*sources)` of parameters, rebuilt when one of them
        changes after translation (translator.state.prepared). `tensor` None (with `derive` and
        `natural`): a lazy prepared copy, made after the passes only where it is needed (state.settle)."""
        self._n_attr += 1
        name = f"_flydsl_{hint}_{self._n_attr}"
        entry = prepared(self.gm, name, derive, sources, natural) if derive is not None else None
        if tensor is None:
            tensor = placeholder(entry)
        self.gm.register_buffer(name, tensor.detach() if not is_lazy(tensor) else tensor)
        with self.gm.graph.inserting_before(before):
            node = self.gm.graph.get_attr(name)
        with self.fake_mode:  # a fresh fake of the same layout (from_tensor would fake the view's base too)
            node.meta["val"] = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                                   device=sources[0].device if is_lazy(tensor) else tensor.device)
        return node

    # --- inserting nodes -------------------------------------------------------------------
    def _at(self, before, after):
        return self.gm.graph.inserting_after(after) if after is not None else self.gm.graph.inserting_before(before)

    def insert(self, target, *args, before: Node | None = None, after: Node | None = None, **kwargs) -> Node:
        """Insert ``target(*args, **kwargs)`` before `before` (or after `after`), with its metadata."""
        with self._at(before, after):
            n = self.gm.graph.call_function(target, args, kwargs)
        return self.infer(n)

    def cast(self, x: Node, dtype, before: Node) -> Node:
        """x cast to `dtype` (x itself when it has that dtype)."""
        if x is None or dtype_of(x) == dtype:
            return x
        return self.insert(aten._to_copy.default, x, before=before, dtype=dtype)

    # --- precision policy -------------------------------------------------------------------
    @property
    def compute_dtype(self):
        return PRECISIONS[self.precision]

    def cast_in(self, x: Node, before: Node) -> Node:
        """Under precision bf16/fp16, cast an fp32 activation to the compute dtype."""
        if self.precision == "fp32" or x is None or dtype_of(x) != torch.float32:
            return x
        return self.cast(x, self.compute_dtype, before)

    def cast_const(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or self.precision == "fp32" or t.dtype != torch.float32:
            return t
        return t.to(self.compute_dtype)

    # --- the rewrite ------------------------------------------------------------------------
    def emit(self, family: str, args: tuple, *, lowering: str, sources, anchor: Node | str,
             before: Node | None = None, after: Node | None = None, split: bool = True, output_anchors=()):
        """Insert ``flydsl.<family>(*args)`` and record what it replaces; counts `lowering`.

        sources: the nodes it absorbs (their captured names go to the report); anchor: the node
        (or captured name) whose value it reproduces (node-by-node verification compares the two). An op with several
        outputs returns (node, [getitem per output]) unless split=False; output_anchors: the node
        each output reproduces, when verification should compare the outputs one by one."""
        new = self.insert(getattr(torch.ops.flydsl, family).default, *args, before=before, after=after)
        new.meta["flydsl"] = {"family": family, "lowering": lowering,
                              "sources": [captured_name(s) for s in sources], "anchor": _name(anchor)}
        new.meta["orig_name"] = None
        self.count(lowering)
        if not split or not isinstance(new.meta["val"], (list, tuple)):
            return new
        outs, prev = [], new
        for j, v in enumerate(new.meta["val"]):
            with self.gm.graph.inserting_after(prev):
                gi = self.gm.graph.call_function(operator.getitem, (new, j))
            gi.meta["val"] = v
            gi.meta["orig_name"] = None
            if j < len(output_anchors):
                gi.meta["flydsl"] = dict(new.meta["flydsl"], sources=[], anchor=_name(output_anchors[j]))
            outs.append(gi)
            prev = gi
        return new, outs

    def absorb(self, into: Node, nodes, *, anchor: Node | None = None, prepend: bool = False) -> None:
        """Record that flydsl node `into` now also computes `nodes` (captured nodes, or flydsl nodes
        folded into it, whose sources it takes over); `anchor`: the node it now reproduces."""
        info = into.meta["flydsl"]
        names = [s for n in nodes for s in (n.meta["flydsl"]["sources"] if "flydsl" in n.meta else [captured_name(n)])]
        info["sources"] = names + list(info["sources"]) if prepend else list(info["sources"]) + names
        if anchor is not None:
            info["anchor"] = captured_name(anchor)

    def erase_unused(self, nodes) -> None:
        """Erase those of `nodes` nothing reads any more (users before what they read)."""
        for s in sorted(nodes, key=position, reverse=True):
            if not erased(s) and not s.users:
                self.gm.graph.erase_node(s)

    def replace(self, root: Node, family: str, lowering: str, args: tuple, sources: list[Node],
                out_dtype=None) -> Node:
        """Insert `flydsl.<family>(*args)` before `root`, make it take `root`'s uses, drop `sources`."""
        new = self.emit(family, args, lowering=lowering, sources=sources, anchor=root, before=root)
        result = self.cast(new, out_dtype or dtype_of(root), root)
        root.replace_all_uses_with(result)
        self.erase_unused(sources)
        return new
