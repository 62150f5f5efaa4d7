"""Per-call replays: a host entry's Python planning runs once per call signature, not per call.

A kernel adapter does the same host work on every call with the same argument shapes: checks,
tile choice, builder lookups, specialization keys, argument lists, output allocation. `replayed(fn)`
runs that work once per *signature* and replays only what must happen per call.

Signature (what the adapter's decisions may depend on): per tensor argument its dtype, shape,
strides, device, data-pointer alignment (mod 64: vectorized kernels pick their width from it)
and which earlier argument it is the same object as; every other argument by type and value
(lists and tuples element-wise); and the launch target (`launch._context()`: backend, arch,
COMPILE_ONLY, FlyDSL toolchain). A new batch size is a new signature, so it builds a new replay;
the launch key holds no run-time dims, so that replay compiles nothing.

When: the first call with a signature runs `fn` as before and notes the signature; the second
builds the replay; later ones replay it. Building costs ~1-2 ms (recording, then compiling the
generated source: ~10-20 adapter calls), so a signature met once (a decode loop's growing KV
length) never pays it. Both tables are bounded (MAX_REPLAYS).

Building a replay: the call runs `fn` for real, with a TorchDispatchMode
recording every aten op it runs and `launch.call` recording each launch (launcher, specialization
key, compiled callable, arguments). The recording becomes a straight-line Python function
(generated source, like FlyDSL's own argument packers):
  - an op whose result is a view of its input (view, reshape, unsqueeze, expand, slice ...)
    is no call at all: the tensor a launch or the result needs is one `as_strided` of its root
    (an argument, or a buffer the replay allocates), with the recorded geometry; a view with the
    root's own geometry is the root itself. A schema's `Tensor(a)` result only *may* alias: the
    result must share its input's storage to be taken for a view. Below autograd (a custom op's
    body, inference mode) the mode sees reshape, contiguous, movedim, to ... undecomposed, and a
    reshape or contiguous that copied is an op like any other (replayed on the same geometry, it
    copies again);
  - any other op that a launch or the result depends on is replayed with the same arguments:
    `empty` (outputs, workspaces), and casts, pads or copies where the adapter made them, through
    the torch function or Tensor method of the same schema where `_FAST_OPS` names one (an
    OpOverload called from Python costs ~4x more), else the aten overload (ops nothing depends
    on are dropped);
  - a launch calls the compiled callable the recording found, with the same non-tensor
    arguments, on the current stream; the launch module's modes (record_device_calls,
    compile_only, collect) and launch_log behave as they do for `launch.call`;
  - a Python side effect an adapter declares with `replay_effect(f, *args)` is repeated, and a tensor
    it takes with `replay_value(f, *args)` is taken again (split-K's per-launch ticket counters).
A replayed call is: signature -> one dict lookup -> that function.

What makes a call unplannable (it then runs `fn` as before, every time): a tensor subclass or a
tensor that needs autograd among the arguments, an active torch dispatch mode (fake tensors,
FlopCounter), an unhashable argument, an aten op that returns a Python value (reading tensor data
on the host: control flow could depend on it), or a nested call inside a replay being recorded
(the outer replay records it). A replay keeps the decisions its adapter made from global state
other than the arguments and the launch target: whoever changes such state calls
`clear_replays()` (gemm.tiles.register_config does, so a registered or autotuned tile reaches the
next call).

Threads: replays are immutable once built and the recording state is per thread; two threads
that build the same replay keep the first.

Faults: a call that raises (a kernel error, a Ctrl-C) leaves nothing behind. A replay is stored only
after its recording returned and its code was generated; the recording state is set inside the
try that clears it; a replay holds no state of its own, and a per-launch resource it takes
(`replay_value`) is given back only by the steps after a launch that returned (split-K counters).
tests/kernels/test_interrupts.py interrupts the host path at every line, test_splitk_faults.py
and tests/e2e/test_fault_injection.py fault kernels mid-launch.
"""

from __future__ import annotations

import functools
import math
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from translator_kernels import launch as _launch

_REPLAYS: dict = {}  # (fn, no_alias, launch target, device calls recorded, signature) -> generated run function,
#                    or None (unplannable)
_SEEN: dict = {}  # keys met once: the second call with a signature builds its replay
MAX_REPLAYS = 4096  # either table is emptied when it reaches this size (memory stays bounded)
_LOCK = threading.Lock()
_is_alias_of = torch._C._is_alias_of  # the two tensors share one storage (an empty one too)
_local = _launch._local  # the launch module's thread state: `replay_rec` is the recording replay
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_SCALARS = frozenset((int, float, bool, str, type(None)))


class _Unreplayable(Exception):
    pass


def _encode(a, out: list, tensors: list, ids: dict) -> None:
    """Append `a`'s part of a signature to `out`: one tuple per argument (a sequence: its type and
    length, then its items), which tells apart any two different calls."""
    t = type(a)
    if t is _Tensor or t is _Parameter:
        j = ids.get(id(a))
        if j is not None:
            out.append(("same", j))
            return
        if a.requires_grad and torch.is_grad_enabled():
            raise _Unreplayable("autograd")
        ids[id(a)] = len(tensors)
        tensors.append(a)
        out.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 63))
    elif t in _SCALARS:
        if a != a:  # NaN never equals itself: no replay could be found again
            raise _Unreplayable("NaN argument")
        out.append((t, a, math.copysign(1.0, a)) if t is float and a == 0 else (t, a))  # 0.0 == -0.0
    elif t is tuple or t is list:
        out.append((t, len(a)))
        for x in a:
            _encode(x, out, tensors, ids)
    elif isinstance(a, torch.Tensor):
        raise _Unreplayable("tensor subclass")
    else:
        try:
            hash(a)
        except TypeError:
            raise _Unreplayable(f"unhashable {t.__name__}") from None
        out.append((t, a))


def signature(args, kwargs):
    """(signature, tensors in order of first appearance) of a call. Per tensor its dtype, shape,
    strides, device and data-pointer alignment (mod 64); a tensor met again by its position."""
    out, tensors, ids = [], [], {}
    for a in args:
        t = type(a)
        if (t is _Tensor or t is _Parameter) and id(a) not in ids and not a.requires_grad:
            ids[id(a)] = len(tensors)
            tensors.append(a)
            out.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 63))
        elif t is int or t is bool or t is str or a is None:
            out.append((t, a))
        elif t is float and a == a:
            out.append((t, a) if a else (t, a, math.copysign(1.0, a)))  # 0.0 == -0.0, but 1 / x tells them apart
        elif t is list and all(type(x) is int for x in a):  # a shape: one item (no other encoding has a tuple there)
            out.append((t, tuple(a)))
        else:
            _encode(a, out, tensors, ids)
    if kwargs:
        for k, v in kwargs.items():
            out.append(k)
            _encode(v, out, tensors, ids)
    return tuple(out), tensors


def replayed(fn=None, *, no_alias: bool = False):
    """Decorator: `fn(*args, **kwargs)` through its per-signature replay (see the module notes).

    no_alias: the result never shares storage with an argument (a result rooted in one is cloned),
    as torch.library custom ops require."""
    if fn is None:
        return functools.partial(replayed, no_alias=no_alias)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return call(fn, args, kwargs, no_alias)

    run.unreplayed = fn
    return run


def call(fn, args, kwargs=None, no_alias=False):
    """`fn(*args, **kwargs)` through its replay, built on the first call with this signature."""
    mode = getattr(_local, "mode", None)  # the launch module's mode: record_device_calls, collect, compile_only
    if getattr(_local, "replay_rec", None) is not None or torch._C._len_torch_dispatch_stack() \
            or (mode is not None and (mode.uses is not None or mode.compile_only)):
        return _direct(fn, args, kwargs, no_alias)
    try:
        sig, tensors = signature(args, kwargs)
    except _Unreplayable:
        return _direct(fn, args, kwargs, no_alias)
    pk = (fn, no_alias, _launch._context(), mode is not None, sig)
    run = _REPLAYS.get(pk, _MISSING)
    if run is _MISSING:
        if pk not in _SEEN:  # first sight: a signature met once (a growing decode length) never pays a build
            if len(_SEEN) >= MAX_REPLAYS:
                _SEEN.clear()
            _SEEN[pk] = None
            return _direct(fn, args, kwargs, no_alias)
        return _build(pk, fn, args, kwargs, tensors, no_alias)
    if run is None:
        return _direct(fn, args, kwargs, no_alias)
    return run(*tensors)


_MISSING = object()


def _direct(fn, args, kwargs, no_alias):
    out = fn(*args, **(kwargs or {}))
    return _unaliased(out, args) if no_alias else out


def _unaliased(out, args):
    """`out` with every tensor that shares storage with an argument tensor cloned."""
    leaves, _ = torch.utils._pytree.tree_flatten(args)
    ptrs = {a.untyped_storage().data_ptr() for a in leaves if isinstance(a, torch.Tensor) and a.numel()}
    if not ptrs:
        return out

    def fix(o):
        if isinstance(o, torch.Tensor) and o.numel() and o.untyped_storage().data_ptr() in ptrs:
            return o.clone()
        return o
    return torch.utils._pytree.tree_map(fix, out)


def _build(pk, fn, args, kwargs, tensors, no_alias):
    rec = _Recorder(tensors)
    entered = False
    try:  # set inside the try: a Ctrl-C right after it must not leave this thread recording into `rec`
        _local.replay_rec = rec
        # entered and noted in one line, left in `finally` (not `with rec:`: CPython 3.11 runs a line event
        # on the `with` line before `__exit__`, outside the with's protection, so a Ctrl-C there would
        # leave the recorder on torch's dispatch stack and no later call would be replayed)
        entered = rec.__enter__() is rec
        out = fn(*args, **(kwargs or {}))
    finally:
        if entered:
            rec.__exit__(None, None, None)
        _local.replay_rec = None
    try:
        run = rec.finish(out, no_alias, getattr(fn, "__qualname__", "fn"), len(tensors))
    except _Unreplayable:
        run = None
    _launch.locked(_LOCK, _keep, pk, run)
    return _unaliased(out, args) if no_alias else out


def _keep(pk, run):
    if len(_REPLAYS) >= MAX_REPLAYS:
        _REPLAYS.clear()
    _REPLAYS.setdefault(pk, run)


def replay_effect(f, *args) -> None:
    """Run `f(*args)` now and on every run of the replay being recorded on this thread, with the
    replay's tensors in place of this call's. `f` may read tensor data (a host-side check of a
    kernel's error flag): what it does is not recorded, only that it is called."""
    rec = getattr(_local, "replay_rec", None)
    if rec is None:
        f(*args)
        return
    rec.effect(f, args)
    with _disable_current_modes():
        f(*args)


def replay_value(f, *args):
    """`f(*args)` now and on every run of the replay being recorded on this thread: its result (a
    tensor) is what the launches and ops of the call that read it see, each replay's own (a resource
    handed out per call, e.g. split-K's ticket counters). What `f` does is not recorded."""
    rec = getattr(_local, "replay_rec", None)
    if rec is None:
        return f(*args)
    with _disable_current_modes():
        out = f(*args)
    rec.value(f, args, out)
    return out


def clear_replays() -> None:
    """Forget every replay (tests; after a change to state that adapters read, e.g. a GEMM config)."""
    _launch.locked(_LOCK, lambda: (_REPLAYS.clear(), _SEEN.clear()))


_launch.CLEAR_HOOKS.append(clear_replays)  # launch.clear() forgets the replays built on its compiled callables


def replay_count() -> int:
    return sum(1 for v in _REPLAYS.values() if v is not None)


# ---- recording ------------------------------------------------------------------------------------------
class _Ref:
    """A tensor of the recording: an argument, an op's fresh result, a constant, or a view of one."""

    __slots__ = ("kind", "name", "t", "base", "geometry", "alias")

    def __init__(self, kind, name, t, base=None, geometry=None):
        self.kind, self.name, self.t, self.base, self.geometry = kind, name, t, base, geometry
        self.alias = None  # an op result that shares its input's storage (a view as another dtype)


class _Recorder(TorchDispatchMode):
    def __init__(self, tensors):
        super().__init__()
        self.refs: dict = {}  # id(tensor) -> _Ref
        self.keep: list = []  # every recorded tensor stays alive while recording (ids stay unique)
        self.steps: list = []  # ("op", func, args, kwargs, out refs) | ("launch", _Launch, args) | ("effect", f, args)
        #                        | ("value", f, args, result ref)
        self.views: dict = {}  # (id(root), geometry) -> its view _Ref
        self.failed: str | None = None
        for i, t in enumerate(tensors):
            self._track(t, _Ref("in", f"i{i}", t))

    def _track(self, t, ref):
        self.refs[id(t)] = ref
        self.keep.append(t)
        return ref

    def ref(self, t) -> _Ref:
        r = self.refs.get(id(t))
        if r is None:  # made before the call and not an argument: a constant of the replay
            r = self._track(t, _Ref("const", None, t))
        return r

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.failed is None:
            try:
                self._op(func, args, kwargs, out)
            except _Unreplayable as e:
                self.failed = str(e)
        return out

    def _op(self, func, args, kwargs, out):
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(o is None or isinstance(o, torch.Tensor) for o in outs):
            raise _Unreplayable(f"{func} returns a Python value (host read of tensor data)")
        tensor_args = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        returns = func._schema.returns
        alias = returns[0].alias_info if len(returns) == 1 else None
        fresh = []
        for o in outs:
            if o is None or any(o is a for a in tensor_args):
                continue  # in place / out=: the same tensor, already known
            # `Tensor(a)` in a schema says "may alias": reshape, contiguous, to and the other
            # composite ops a mode sees undecomposed below autograd (a custom op's body, inference
            # mode) return a copy when the input's layout asks for one: only a result that does share
            # the input's storage is a view, any other is replayed as the op (which copies again)
            if alias is not None and not alias.is_write and tensor_args and _is_alias_of(o, tensor_args[0]):
                self._view(o, self.ref(tensor_args[0]), func, args, kwargs)
            else:
                fresh.append(o)
        if fresh or func._schema.is_mutable:
            refs = []
            for o in outs:
                if o is None:
                    refs.append((None, False))
                elif id(o) in self.refs:
                    refs.append((self.refs[id(o)], False))
                else:
                    ref = self._track(o, _Ref("op", None, o))
                    src = next((a for a in tensor_args if _is_alias_of(o, a)), None)
                    if src is not None:  # an unannotated alias (_unsafe_view): cloned under no_alias
                        ref.alias = self.ref(src)
                    refs.append((ref, True))
            schema = func._schema.arguments
            written = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write}
            mutated = [self.ref(a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and schema[i].name in written]
            mutated += [self.ref(v) for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k in written]
            self.steps.append(("op", func, args, kwargs, refs, isinstance(out, (tuple, list)), mutated))

    def _view(self, o, src: _Ref, func, args, kwargs):
        base = src.base or src
        if base.kind == "const":
            self._track(o, _Ref("const", None, o))
            return
        if o.dtype != base.t.dtype:  # a view as another dtype (bool as uint8): replayed as the op itself
            ref = self._track(o, _Ref("op", None, o))
            ref.alias = base  # a result rooted in an argument is cloned under no_alias
            self.steps.append(("op", func, args, kwargs, [(ref, True)], False, []))
            return
        geometry = (tuple(o.shape), tuple(o.stride()), o.storage_offset() - base.t.storage_offset())
        if geometry == (tuple(base.t.shape), tuple(base.t.stride()), 0):
            self._track(o, base)
            return
        same = self.views.get((id(base), geometry))  # one variable per distinct view of a root
        if same is None:
            same = self.views[(id(base), geometry)] = _Ref("view", None, o, base, geometry)
        self._track(o, same)

    def launch(self, launcher, k, fn, args):
        step = _launch.replayed_launch(launcher, k, fn, args)
        self.steps.append(("launch", step, [self._operand(a) for a in args]))

    def _operand(self, a):
        return self.ref(a) if isinstance(a, torch.Tensor) else a

    def effect(self, f, args):
        self.steps.append(("effect", f, [self._operand(a) for a in args]))

    def value(self, f, args, out):
        if not isinstance(out, torch.Tensor):
            raise _Unreplayable(f"replay_value({getattr(f, '__name__', f)}) returned {type(out).__name__}, not a tensor")
        # a new variable even when `f` returned a tensor the call held before (a pooled array given
        # back and taken again): later steps read this step's result, earlier ones keep theirs
        self.steps.append(("value", f, [self._operand(a) for a in args], self._track(out, _Ref("op", None, out))))

    # ---- code generation --------------------------------------------------------------------------------
    def finish(self, out, no_alias, name, n_in):
        if self.failed:
            raise _Unreplayable(self.failed)
        leaves, spec = torch.utils._pytree.tree_flatten(out)
        out_refs = [self.ref(o) if isinstance(o, torch.Tensor) else o for o in leaves]
        live = self._liveness(out_refs)
        g = _Codegen(self)
        for step in self.steps:
            if step[0] == "op" and id(step) in live:
                _, func, args, kwargs, refs, multi, _ = step
                names = [g.fresh(r) if new else "_" for r, new in refs]
                target = f"({', '.join(names)},)" if multi else names[0]
                g.emit(f"{target} = {g.op(func, args, kwargs)}")
            elif step[0] == "launch":
                _, ln, args = step
                if isinstance(ln, _launch.PackedLaunch):  # our packer: the tensors' data pointers only
                    vals = [g.pointer(a) for a in args if isinstance(a, _Ref)]
                else:
                    vals = [g.value(a) for a in args]
                g.emit(f"{g.const(ln)}({', '.join(vals)})")
            elif step[0] == "effect":
                _, f, args = step
                g.emit(f"{g.const(f)}({', '.join(g.value(a) for a in args)})")
            elif step[0] == "value":
                _, f, args, r = step
                g.emit(f"{g.fresh(r)} = {g.const(f)}({', '.join(g.value(a) for a in args)})")
        results = []
        for r in out_refs:
            v = g.value(r)
            if no_alias and isinstance(r, _Ref) and _root(r).kind == "in":
                v = f"{v}.clone()"
            results.append(v)
        g.emit(f"return {_literal(out, iter(results)) if _plain(out) else g.unflatten(results, spec)}")
        params = ", ".join(f"i{i}" for i in range(n_in))
        src = (f"def make({', '.join(g.const_names)}):\n    def run({params}):\n"
               + "".join(f"        {line}\n" for line in g.body) + "    return run\n")
        scope: dict = {}
        exec(compile(src, f"<replay of {name}>", "exec"), scope)  # noqa: S102 - our own straight-line code
        run = scope["make"](*g.const_values)
        run.source = src
        return run

    def _liveness(self, out_refs) -> set:
        """ids of the op steps a launch, an effect or the result depends on (walked backwards)."""
        need = {id(r.base or r) for r in out_refs if isinstance(r, _Ref)}
        live = set()
        for step in reversed(self.steps):
            if step[0] == "op":
                _, func, args, kwargs, refs, _, mutated = step
                if not (any(new and id(r) in need for r, new in refs)
                        or any(id(m.base or m) in need or (m.base or m).kind != "op" for m in mutated)):
                    continue
                live.add(id(step))
                leaves = torch.utils._pytree.tree_leaves((args, kwargs))
                need.update(id(self.ref(a).base or self.ref(a)) for a in leaves if isinstance(a, torch.Tensor))
            else:  # a launch, an effect or a value: always kept, and so is what it reads
                need.update(id(a.base or a) for a in step[2] if isinstance(a, _Ref))
        return live


def _root(r: _Ref) -> _Ref:
    """The tensor whose storage `r` uses: a view's base, a dtype view's source, or `r`."""
    while True:
        nxt = r.base or r.alias
        if nxt is None:
            return r
        r = nxt


def _plain(out) -> bool:
    """A result built of tensors, scalars, None, lists and tuples: written as a literal."""
    if type(out) in (list, tuple):
        return all(_plain(o) for o in out)
    return isinstance(out, torch.Tensor) or type(out) in _SCALARS


def _literal(out, results) -> str:
    if type(out) in (list, tuple):
        inner = ", ".join(_literal(o, results) for o in out)
        return f"[{inner}]" if type(out) is list else f"({inner},)" if len(out) == 1 else f"({inner})"
    return next(results)


_aten = torch.ops.aten
_DEFAULT_KW = {"layout": torch.strided, "pin_memory": False, "non_blocking": False}
_FAST_OPS = {  # aten overload -> ("torch" function | "method", name, extra keyword arguments)
    _aten.empty.memory_format: ("torch", "empty", ()),
    _aten.empty_strided.default: ("torch", "empty_strided", ()),
    _aten.zeros.default: ("torch", "zeros", ()),
    _aten.full.default: ("torch", "full", ()),
    _aten.constant_pad_nd.default: ("torch", "constant_pad_nd", ()),
    _aten.new_zeros.default: ("method", "new_zeros", ()),
    _aten.new_empty.default: ("method", "new_empty", ()),
    _aten.copy_.default: ("method", "copy_", ()),
    _aten.clone.default: ("method", "clone", ()),
    _aten.zero_.default: ("method", "zero_", ()),
    _aten.fill_.Scalar: ("method", "fill_", ()),
    _aten._to_copy.default: ("method", "to", (("copy", "True"),)),
    _aten.reshape.default: ("method", "reshape", ()),  # reshape / contiguous that copied (see _Recorder._op)
    _aten.contiguous.default: ("method", "contiguous", ()),
}


class _Codegen:
    """Names for the generated function: arguments i<n>, results t<n>, views v<n>, constants c<n>.
    A view is materialized once, just before its first use."""

    def __init__(self, rec):
        self.rec, self.const_names, self.const_values, self.n = rec, [], [], 0
        self._consts: dict = {}
        self.body: list = []
        self.pending: list = []

    def emit(self, line: str):
        self.body.extend(self.pending)
        self.pending.clear()
        self.body.append(line)

    def const(self, obj) -> str:
        k = id(obj)
        if k not in self._consts:
            self._consts[k] = f"c{len(self.const_names)}"
            self.const_names.append(self._consts[k])
            self.const_values.append(obj)
        return self._consts[k]

    def unflatten(self, results, spec) -> str:
        return f"{self.const(torch.utils._pytree.tree_unflatten)}([{', '.join(results)}], {self.const(spec)})"

    def op(self, func, args, kwargs) -> str:
        """The call expression of an aten op: its torch function or method where it has one
        (calling an OpOverload from Python costs ~4x more), else the overload itself."""
        how = _FAST_OPS.get(func)
        if how is not None and all(kwargs.get(k, d) == d for k, d in _DEFAULT_KW.items()):
            kind, name, extra = how
            kw = [f"{k}={self.value(v)}" for k, v in kwargs.items() if k not in _DEFAULT_KW and v is not None]
            kw += [f"{k}={v}" for k, v in extra]
            if kind == "method":
                return f"{self.value(args[0])}.{name}({', '.join([self.value(a) for a in args[1:]] + kw)})"
            return f"{self.const(getattr(torch, name))}({', '.join([self.value(a) for a in args] + kw)})"
        vals = [self.value(a) for a in args] + [f"{k}={self.value(v)}" for k, v in kwargs.items()]
        return f"{self.const(func)}({', '.join(vals)})"

    def pointer(self, r) -> str:
        """The expression of `r`'s data pointer: a view not otherwise needed is never made, its
        pointer is its root's plus the view's byte offset."""
        if r.kind == "view" and r.name is None:
            delta = r.geometry[2] * r.t.element_size()
            return f"{self.value(r.base)}.data_ptr()" + (f" + {delta}" if delta else "")
        return f"{self.value(r)}.data_ptr()"

    def fresh(self, r) -> str:
        if r.name is None:
            r.name, self.n = f"t{self.n}", self.n + 1
        return r.name

    def value(self, v) -> str:
        if isinstance(v, _Ref):
            if v.kind == "const":
                return self.const(v.t)
            if v.kind == "view" and v.name is None:
                size, stride, delta = v.geometry
                base = v.base.name
                # relative to the base's offset at run time, whatever the base is: a dtype view of an
                # input (replayed as the op) shares the input's offset, which differs from call to call
                off = f"{base}.storage_offset() + {delta}" if delta else None  # None: as_strided's default
                v.name, self.n = f"v{self.n}", self.n + 1
                self.pending.append(f"{v.name} = {base}.as_strided({size!r}, {stride!r}"
                                    + (f", {off})" if off is not None else ")"))
            return v.name
        if isinstance(v, torch.Tensor):
            return self.value(self.rec.ref(v))
        if type(v) in (int, bool, str, type(None)) or (type(v) is float and math.isfinite(v)):
            return repr(v)
        if type(v) in (tuple, list):
            inner = ", ".join(self.value(x) for x in v)
            return f"[{inner}]" if type(v) is list else f"({inner},)" if len(v) == 1 else f"({inner})"
        return self.const(v)
