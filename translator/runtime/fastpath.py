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
from torch.export._unlift import GuardsFn

from translator_kernels.launch import locked

from . import ops

_FAST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # gm -> (gm's code when built, fast forward)
_LOCK = threading.Lock()
_CALLERS: dict = {}  # family name -> flydsl_<name>


def caller(name: str):
    """The plain function a fast graph's node calls for `torch.ops.flydsl.<name>`."""
    fn = _CALLERS.get(name)
    if fn is None:
        schema = getattr(torch.ops.flydsl, name).default._schema
        written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

        def fn(*args):
            out = ops.dispatch(name, *args)
            for i in written:  # the custom op bumps a written tensor's version; a kernel's store does not
                t = args[i]  # (state.preserved restores what changed); an optional one may be None
                ts = [x for x in t if isinstance(x, torch.Tensor)] if isinstance(t, (list, tuple)) else \
                    [t] if isinstance(t, torch.Tensor) else []
                if ts:
                    torch.autograd.graph.increment_version(ts)
            return out

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
            aten.add.Tensor: "add", aten.mul.Tensor: "mul", aten.sub.Tensor: "sub", aten.div.Tensor: "div",
            aten.split.Tensor: "split"}


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
    for node in list(graph.nodes):
        if _is_flydsl(node):
            node.args, node.kwargs = schema_args(node.target, node.args, node.kwargs), {}
            node.target = caller(node.target._opname)
        elif node.op == "call_function" and node.target in _METHODS and isinstance(node.args[0], torch.fx.Node):
            node.op, node.target = "call_method", _METHODS[node.target]
        elif node.op == "call_module" and isinstance(_resolve(gm, node.target), GuardsFn) and not node.kwargs:
            with graph.inserting_before(node):  # export's input guards: their function, without Module.__call__
                node.args = (graph.get_attr(node.target), *node.args)
            node.op, node.target = "call_method", "forward"
    _plain_io(graph)
    code = graph.python_code(root_module="self")
    src = _hoisted_attrs(code.src, graph, gm)
    scope = dict(code.globals)
    exec(compile(src, f"<flydsl fast forward of {type(gm).__name__}>", "exec"), scope)  # noqa: S102 — FX's own codegen
    forward = scope["forward"]
    forward.source = src
    return forward


def _resolve(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _plain_io(graph) -> None:
    """An exported graph flattens its inputs and unflattens its output through pytree specs on every
    call (~6 us); where those are a plain tuple of inputs and one tensor or a tuple of them, the
    forward takes and returns them as they are."""
    info = getattr(graph._codegen, "pytree_info", None)
    if info is None or info.in_spec is None or info.out_spec is None:
        return
    n = len(graph.find_nodes(op="placeholder"))
    out = graph.output_node()
    flat = out.args[0]
    if info.in_spec not in (pytree.tree_structure(((0,) * n, {})), pytree.tree_structure((0,) * n)) \
            or not isinstance(flat, (tuple, list)) or [p.name for p in graph.find_nodes(op="placeholder")] \
            != list(info.orig_args[-n:] if n else []):
        return
    if info.out_spec == pytree.tree_structure(0) and len(flat) == 1:
        out.args = (flat[0],)
    elif info.out_spec == pytree.tree_structure((0,) * len(flat)):
        out.args = (tuple(flat),)
    else:
        return
    graph._codegen = torch.fx.graph.CodeGen()


def _attr_expr(gm, target: str) -> str | None:
    """`self.<target>` as plain dict reads (`_modules`, `_parameters`, `_buffers`, or the instance
    dict), skipping nn.Module.__getattr__ (~4 us a dotted parameter read, 0.3 as dict reads)."""
    obj, expr = gm, "self"
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part in vars(obj):
            expr, obj = f"{expr}.__dict__[{part!r}]", vars(obj)[part]
            continue
        for table in ("_parameters", "_buffers", "_modules"):
            d = vars(obj).get(table)
            if d is not None and part in d and (table == "_modules" or i == len(parts) - 1):
                expr, obj = f"{expr}.{table}[{part!r}]", d[part]
                break
        else:
            return None
    return expr


def _hoisted_attrs(src: str, graph, gm) -> str:
    """`src` with every get_attr line moved into one read at the top, through `_attr_expr`'s dict
    reads, falling back to FX's own attribute reads if the module's layout changed since the build
    (reads have no side effects, so trying again is safe). `src` itself where it is not as expected."""
    nodes = graph.find_nodes(op="get_attr")
    if not nodes:
        return src
    lines, names, fast, slow = src.split("\n"), [], [], []
    for node in nodes:
        fx_read = torch.fx.graph._format_target("self", node.target)
        expr = _attr_expr(gm, node.target)
        line = f"    {node.name} = {fx_read}"
        if expr is None or line not in lines:
            return src
        lines.remove(line)
        names.append(node.name)
        fast.append(expr)
        slow.append(fx_read)
    head = next((i for i, ln in enumerate(lines) if ln.startswith("def forward(")), None)
    if head is None or not lines[head].endswith(":"):
        return src
    while lines[head + 1].lstrip().endswith("self._in_spec)"):  # the pytree input binding stays first
        head += 1
    lines.insert(head + 1, f"    try:\n        {', '.join(names)}, = {', '.join(fast)},\n"
                           f"    except (KeyError, AttributeError):\n        {', '.join(names)}, = {', '.join(slow)},")
    return "\n".join(lines)


def fast_forward(gm: torch.fx.GraphModule):
    """The fast forward of `gm` (call it as `fast_forward(gm)(gm, *args)`), built on first use and
    again after `gm.recompile()`."""
    code = gm.code
    hit = _FAST.get(gm)
    if hit is None or hit[0] is not code:
        hit = locked(_LOCK, _built, gm, code)  # not `with _LOCK:` (see locked)
    return hit[1]


def _built(gm, code):
    hit = _FAST.get(gm)
    if hit is None or hit[0] is not code:
        hit = _FAST[gm] = (code, build(gm))
    return hit


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
