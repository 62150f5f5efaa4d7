"""The fast way to run a translated graph: FlyDSL nodes call `dispatch` directly.

The translated graph keeps its `torch.ops.flydsl.*` nodes: torch.export, save / load,
verification's localization and torch.compile read them. But every call of such a custom op
walks torch.library's layers (dispatcher, schema parsing, the custom_op wrapper, alias and
autograd checks) before it reaches its body, `runtime.ops.dispatch(name, *args)`: about
60 us per op on a loaded 2-core host, as much as the kernel adapter itself.

`fast_forward(gm)` is the forward FX generates for a copy of the same graph, run with `gm` as
its `self`: it reads gm's own parameters, buffers and submodules (nothing is copied; a buffer
the graph writes is written in gm, and a tensor replaced in gm is seen). In it each FlyDSL
node calls a plain function `flydsl_<name>`
whose body is the custom op's body, `dispatch("<name>", *args)`, with the node's arguments
normalized once to the op schema's positional order (defaults filled in). So the call does
exactly what the custom op's body does: the backend is chosen at call time (`dispatch` reads
the active `runtime.use_backend`), and each call appends the same `OpCall` with the same
launch records, which `TranslatedModule.forward` assigns to graph nodes in order.

When the fast forward must not be used (`usable`), `TranslatedModule` runs the custom-op graph:
  - under torch.compile / export tracing, or with a torch function or dispatch mode active
    (fake tensors, proxies, FlopCounter): those see and need the custom ops;
  - with an input that is a tensor subclass (FakeTensor, DTensor, ...);
  - when autograd would record: the custom ops have no backward, and torch.library makes a
    backward through them an error, which the fast forward would turn into silently missing
    gradients (outputs of a kernel carry no grad_fn).
A few view and arithmetic aten nodes (view, transpose, contiguous, sym_size ...: `_METHODS`) are
called as the Tensor method of the same schema, which skips the OpOverload's Python argument
parsing. The fast forward is rebuilt when the graph is recompiled (its code object changes) and lives
as long as the graph module (a weak-keyed cache, so nothing is pickled or deep-copied with it).
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.utils._pytree as pytree

from . import ops

_FAST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # gm -> (gm's code when built, fast forward)
_LOCK = threading.Lock()
_CALLERS: dict = {}  # family name -> flydsl_<name>


def caller(name: str):
    """The plain function a fast graph's node calls for `torch.ops.flydsl.<name>`."""
    fn = _CALLERS.get(name)
    if fn is None:
        def fn(*args):
            return ops.dispatch(name, *args)

        fn.__name__ = fn.__qualname__ = f"flydsl_{name}"
        _CALLERS[name] = fn
    return fn


def schema_args(target, args, kwargs) -> tuple:
    """A call's arguments in the op schema's positional order, defaults filled in."""
    out = []
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            raise TypeError(f"{target}: argument {a.name!r} is missing from the graph node")
    return tuple(out)


aten = torch.ops.aten
# aten overloads the fast forward calls as the Tensor method of the same schema: an OpOverload
# called from Python parses its arguments against the schema (~2-3 us more per call, measured)
_METHODS = {aten.view.default: "view", aten.transpose.int: "transpose", aten.permute.default: "permute",
            aten.reshape.default: "reshape", aten.contiguous.default: "contiguous", aten.sym_size.int: "size",
            aten.unsqueeze.default: "unsqueeze", aten.squeeze.dim: "squeeze", aten.expand.default: "expand",
            aten.t.default: "t", aten.select.int: "select", aten.clone.default: "clone",
            aten.add.Tensor: "add", aten.mul.Tensor: "mul", aten.sub.Tensor: "sub", aten.div.Tensor: "div"}


def _is_flydsl(node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace == "flydsl"


def build(gm: torch.fx.GraphModule):
    """The forward function (first argument: the graph module) of a copy of `gm.graph` whose
    FlyDSL nodes call `caller(name)`. It reads parameters, buffers and submodules through its
    first argument, so it follows `gm` when they are replaced (`.to()`, `load_state_dict(assign=True)`)."""
    graph = torch.fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = gm.graph._codegen  # the pytree in / out specs of an exported graph
    value, old_output = graph.graph_copy(gm.graph, {}, return_output_node=True)
    graph.output(value, old_output.type)
    for node in graph.nodes:
        if _is_flydsl(node):
            node.args, node.kwargs = schema_args(node.target, node.args, node.kwargs), {}
            node.target = caller(node.target._opname)
        elif node.op == "call_function" and node.target in _METHODS and isinstance(node.args[0], torch.fx.Node):
            node.op, node.target = "call_method", _METHODS[node.target]
    code = graph.python_code(root_module="self")
    scope = dict(code.globals)
    exec(compile(code.src, f"<flydsl fast forward of {type(gm).__name__}>", "exec"), scope)  # noqa: S102 — FX's own codegen
    forward = scope["forward"]
    forward.source = code.src
    return forward


def fast_forward(gm: torch.fx.GraphModule):
    """The fast forward of `gm` (call it as `fast_forward(gm)(gm, *args)`), built on first use and
    again after `gm.recompile()`."""
    code = gm.code
    hit = _FAST.get(gm)
    if hit is None or hit[0] is not code:
        with _LOCK:
            hit = _FAST.get(gm)
            if hit is None or hit[0] is not code:
                hit = _FAST[gm] = (code, build(gm))
    return hit[1]


def usable(gm: torch.fx.GraphModule, args) -> bool:
    """True when the fast forward of `gm` on `args` does what `gm(*args)` does (see above)."""
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() \
            or torch._C._len_torch_dispatch_stack():
        return False
    leaves = args if all(isinstance(a, torch.Tensor) for a in args) else pytree.tree_leaves(args)
    grad = torch.is_grad_enabled()
    for a in leaves:
        if isinstance(a, torch.Tensor) and (type(a) is not torch.Tensor or (grad and a.requires_grad)):
            return False
    return not grad or not any(p.requires_grad for p in gm.parameters())
