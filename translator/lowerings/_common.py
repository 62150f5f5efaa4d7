"""Helpers shared by the lowering files: reading fake-tensor metadata, building nodes.

Support checks read only `node.meta["val"]` (fake tensors) and never touch the graph.
Rewrites go through `LowerCtx`, which keeps `meta["val"]` correct on every node it
creates and records which captured nodes each FlyDSL node replaces (for the report
and for node-by-node verification).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch._guards import detect_fake_mode

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def val(node) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def kw_arg(node, name: str, pos: int, default=None):
    """An aten call's argument given by keyword `name` or at position `pos`, else `default`."""
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[pos] if len(node.args) > pos else default


def dtype_of(node):
    v = val(node)
    return getattr(v, "dtype", None)


def shape_of(node):
    v = val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def static_int(d):
    """The int value of a dim that is fixed (an int, or a SymInt export specialized), else None."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt) and not d.node.expr.free_symbols:
        return int(d)
    return None


def is_static(*dims) -> bool:
    return all(static_int(d) is not None for d in dims)


def dtype_reason(node, what: str = "input") -> str | None:
    """None for fp32 / bf16 / fp16 tensors, else the reason."""
    dt = dtype_of(node)
    if dt is None:
        return f"{what} is not a tensor with known metadata"
    if dt not in FLOAT_DTYPES:
        return f"{what} dtype {str(dt).replace('torch.', '')} is not supported (kernels take float32, bfloat16, float16)"
    return None


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

    # --- metadata -------------------------------------------------------------------
    def infer(self, node: torch.fx.Node) -> torch.fx.Node:
        """Compute node.meta['val'] by running its target on the fake inputs."""
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = node.target(*args, **kwargs)
        return node

    def constant(self, node) -> torch.Tensor | None:
        """The real tensor behind a get_attr node (a parameter or buffer), else None."""
        if isinstance(node, torch.fx.Node) and node.op == "get_attr":
            obj = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    return None
            return obj if isinstance(obj, torch.Tensor) else None
        return None

    def add_constant(self, tensor: torch.Tensor, hint: str, before: torch.fx.Node) -> torch.fx.Node:
        """Register a translate-time tensor (e.g. a preshuffled weight) and return its get_attr node."""
        self._n_attr += 1
        name = f"_flydsl_{hint}_{self._n_attr}"
        self.gm.register_buffer(name, tensor.detach())
        with self.gm.graph.inserting_before(before):
            node = self.gm.graph.get_attr(name)
        with self.fake_mode:  # a fresh fake of the same layout (from_tensor would fake the view's base too)
            node.meta["val"] = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                                   device=tensor.device)
        return node

    # --- precision policy -------------------------------------------------------------
    @property
    def compute_dtype(self):
        return PRECISIONS[self.precision]

    def cast_in(self, x: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
        """Under precision bf16/fp16, cast an fp32 activation to the compute dtype."""
        if self.precision == "fp32" or x is None or dtype_of(x) != torch.float32:
            return x
        with self.gm.graph.inserting_before(before):
            c = self.gm.graph.call_function(aten._to_copy.default, (x,), {"dtype": self.compute_dtype})
        return self.infer(c)

    def cast_const(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or self.precision == "fp32" or t.dtype != torch.float32:
            return t
        return t.to(self.compute_dtype)

    # --- the rewrite --------------------------------------------------------------------
    def replace(self, root: torch.fx.Node, family: str, lowering: str, args: tuple,
                sources: list[torch.fx.Node], out_dtype=None) -> torch.fx.Node:
        """Insert `flydsl.<family>(*args)` before `root`, make it take `root`'s uses, drop `sources`."""
        from ..registry import FAMILIES

        op = FAMILIES[family].op.default
        g = self.gm.graph
        with g.inserting_before(root):
            new = g.call_function(op, args)
        self.infer(new)
        new.meta["flydsl"] = {
            "family": family,
            "lowering": lowering,
            "sources": [s.meta.get("orig_name", s.name) for s in sources],
            "anchor": root.meta.get("orig_name", root.name),
        }
        new.meta["orig_name"] = None
        result = new
        want = out_dtype or dtype_of(root)
        if dtype_of(new) != want:
            with g.inserting_after(new):
                result = g.call_function(aten._to_copy.default, (new,), {"dtype": want})
            self.infer(result)
        root.replace_all_uses_with(result)
        for s in sorted(sources, key=_position, reverse=True):  # users before what they read
            if not s.users:
                g.erase_node(s)
        self.counters[lowering] = self.counters.get(lowering, 0) + 1
        return new

    def not_lowered(self, node: torch.fx.Node, reason: str) -> None:
        name = node.meta.get("orig_name", node.name)
        self.reasons.setdefault(name, reason)


def _position(node: torch.fx.Node):
    """Sort key of a node's place in its graph (FX keeps one per node); erased nodes sort first."""
    return (-1,) if getattr(node, "_erased", False) else node._sort_key


def single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None
