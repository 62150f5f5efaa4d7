"""torch.compile backend "flydsl": each graph dynamo hands over goes through translate().

    model = torch.compile(model, backend="flydsl", options={"backend": "reference"})

Dynamo gives the backend an FX graph whose parameters and buffers arrive as graph inputs
(`inline_inbuilt_nn_modules`). translate() needs weights as constants (a linear's weight is
preshuffled once), so the inputs whose dynamo source is a module parameter or buffer are
frozen: copied when dynamo hands the graph over (the first call), held by a small wrapper
module as its own parameters, and only the user's inputs are passed at run time. A graph that
runs as dynamo gave it (translate() could not take it) reads the same copies. So an in-place
update of the model's weights afterwards changes nothing in the compiled model: as with other
inference backends (Torch-TensorRT), weights are frozen at compile time; retrain, then compile
again. The copies cost one more copy of the weights in memory.

Dynamo reuses one graph for every module instance that runs the same code: after a graph break
inside a block, the resumed graph is called once per layer of the stack (or per expert of a
loop), each time with that instance's parameters. So the frozen weights are a set per call,
matched by identity against the tensors dynamo passes, and each set has its own translations.
Before this, the first instance's weights were frozen and served every later one (every layer
computed with layer 0's weights, silently). Past MAX_WEIGHT_SETS sets, calls run dynamo's graph
in PyTorch on the weights they pass, and the record says so.

State is not frozen. An input the graph writes in place (a KV cache written with
`cache[:, :, pos] = k`, running statistics: found by running the graph once on fake tensors
and comparing version counters) is the user's own buffer, as with dynamo's eager backend: the
wrapper holds that very tensor (translator.state.share keeps translate() from copying it), so
every graph dynamo hands over (prefill and decode are two graphs under dynamic=False) and every
translation of it writes the one storage the user holds. A buffer object the user replaces
later is re-bound before the call (state.rebind). Before this, each translation wrote a private
copy: decode read a cache that prefill never wrote (wrong tokens, silently). When the fake run
fails, every buffer is held as the user's own (none frozen). A tensor the caller passes and the
graph writes (HF's StaticCache tensors arrive as inputs) is passed to the translation at each
call and written where it is; translate()'s internal runs get copies. A written parameter is
refused (the frozen copy would take the write).

Per graph: translate() lowers what it can and leaves the rest in PyTorch with a reason, as
it does for a whole model. A graph that translate() cannot take at all (capture fails, an
input kind it does not serve) runs as dynamo gave it, and the reason is recorded. Graph
breaks simply give several graphs. A graph is translated on its first call, with the real
inputs and outside dynamo's tracing context (whose shape guards, written against dynamo's
sources, would otherwise leak into torch.export). Calls with shapes that the translation specialized are
translated again for the new shapes (a few per graph, like dynamo's recompiles). An int that only passes
through (a cache's step counter: bumped and returned, or added to a tensor) is no key (generation_scalars.py).

DTensor (tensor parallel with `parallelize_module`, or transformers' TP plans): a graph with DTensor inputs
goes through AOT autograd's subclass flattening first (translator/distributed.py `desugared`), and the graph
over the rank's local shards, its collectives functional, is what is translated; its parameters come as AOT's
static inputs (frozen here) and its device meshes as inputs no node reads. Other tensor subclasses (torchao's
quantized weights) go to translate() as they are.

Never in silence: each GraphRecord counts the calls that ran through a translation and those
that ran in PyTorch (with the reason), and notes dynamo's compile id, recompile reason (a guard
that failed) and the graph breaks dynamo counted while compiling it. When dynamo stops compiling
a function (its `recompile_limit`), later calls of it that match no compiled graph run in eager
PyTorch without reaching any backend: a handler on dynamo's own log line records that on the
function's records (`dynamo_fallback`, with dynamo's reason) and warns once; those calls cannot
be counted from here. `reports()` lists the records; `summary()` says it in lines.

Options (torch.compile(..., options={...})): arch, backend, precision, verify, strict,
fallback_on_mismatch, dynamic_shapes — as for translate().
"""

from __future__ import annotations

import logging
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from ..errors import InputError, ShapeError, TranslatorError
from ..distributed import desugared, is_dtensor
from .generation_scalars import PassThrough, int_guard_hint

log = logging.getLogger(__name__)

NAME = "flydsl"
MAX_VARIANTS = 8  # translations kept per graph and weight set for differently shaped calls
MAX_WEIGHT_SETS = 64  # weight sets translated per graph (module instances sharing its code)
# a graph break on a data-dependent output size (torch.where(mask), nonzero: the experts loop of an MoE
# layer) splits a loop that the MoE pattern takes whole under translate(): dynamo can keep such ops in the
# graph when asked (torch.export does by default)
DYNAMIC_OUTPUT_HINT = ("set torch._dynamo.config.capture_dynamic_output_shape_ops = True to keep such an op (a "
                       "loop over experts with torch.where(top_idx == e)) in one graph, where it is translated whole")
OPTIONS = ("arch", "backend", "precision", "verify", "strict", "fallback_on_mismatch", "dynamic_shapes")


@dataclass
class GraphRecord:
    """One graph dynamo compiled with this backend: its translations, or why it runs as given."""

    name: str
    translated: list = field(default_factory=list)  # TranslatedModule per input signature
    fallback_reason: str | None = None
    calls_translated: int = 0  # calls that ran through a translation
    calls_pytorch: int = 0  # calls that ran dynamo's graph in PyTorch (fallback_reason says why)
    compile_id: str = ""  # dynamo's "frame/compile" id: a compile number above 0 is a recompile
    recompile_reason: str | None = None  # the guard that failed, as dynamo gives it
    graph_breaks: list = field(default_factory=list)  # dynamo's graph-break reasons new while compiling this
    state: list = field(default_factory=list)  # the dynamo inputs written in place: the user's own buffers
    dynamo_fallback: str | None = None  # dynamo stopped compiling this function: later calls may run eager
    weight_sets_reason: str | None = None  # calls with weights beyond MAX_WEIGHT_SETS ran in PyTorch
    desugared: bool = False  # DTensor inputs: the graph translated is AOT autograd's over the local shards
    sdpa_restored: int = 0  # in that graph, device SDPA ops given back as aten.scaled_dot_product_attention
    linears_restored: int = 0  # ... and AOT's t + mm / addmm given back as aten.linear (restore_linear)

    @property
    def report(self):
        return self.translated[-1].report if self.translated else None

    def line(self) -> str:
        where = f"{self.calls_translated} call(s) translated, {self.calls_pytorch} in PyTorch"
        out = f"{self.name} [{self.compile_id}]: {len(self.translated)} translation(s); {where}"
        if self.fallback_reason:
            out += f" ({self.fallback_reason})"
        if self.weight_sets_reason:
            out += f" ({self.weight_sets_reason})"
        if self.desugared:
            out += "; DTensor: translated over this rank's local shards (AOT autograd's flattening)"
        if self.recompile_reason:
            out += f"; recompiled because {self.recompile_reason}"
        if self.graph_breaks:
            out += f"; graph breaks: {'; '.join(self.graph_breaks)}"
            if any(b.startswith("Dynamic shape operator") for b in self.graph_breaks):
                out += f" ({DYNAMIC_OUTPUT_HINT})"
        if self.dynamo_fallback:
            out += f"; {self.dynamo_fallback}"
        return out


_RECORDS: list[GraphRecord] = []
_WARNED: set = set()  # frame ids whose dynamo fallback was warned about


def reports() -> list[GraphRecord]:
    """Every graph compiled with backend="flydsl" in this process, oldest first."""
    return list(_RECORDS)


compile_reports = reports  # the public name: translator.compile_reports()


def summary() -> str:
    """One line per compiled graph: its translations, calls translated and in PyTorch, and why."""
    return "\n".join(r.line() for r in _RECORDS)


def reset() -> None:
    """Start the records over. Dynamo's graph-break counters are process-wide and outlive both this and
    torch._dynamo.reset(): they are taken as seen, so the next compile reports only its own breaks."""
    _RECORDS.clear()
    _WARNED.clear()
    _BREAKS_SEEN.clear()
    _BREAKS_SEEN.update(_dynamo_context()[1])


class _DynamoLimit(logging.Handler):
    """Catches dynamo's warning that a function hit its recompile limit (the frame then runs in
    eager PyTorch when no compiled graph matches) and records it on that function's graphs."""

    def emit(self, record):
        try:
            if "hit config." not in str(record.msg):
                return
            frame = _compile_id()[0]
            args = record.args if isinstance(record.args, tuple) else ()
            limit = f"{args[0]} ({args[1]})" if len(args) > 1 else "recompile limit"
            why = f"; last reason: {_first(args[3])}" if len(args) > 3 else ""
            hint = int_guard_hint(args[3]) if len(args) > 3 else None
            why += f" ({hint})" if hint else ""
            fn = f" {args[2]}" if len(args) > 2 else ""
            text = (f"dynamo hit its {limit} for{fn}: later calls that match none of its compiled graphs run in "
                    f"eager PyTorch, not through the translation (and are not counted here){why}")
            for r in _RECORDS:
                if r.compile_id.split("/")[0] == frame:
                    r.dynamo_fallback = text
            if frame not in _WARNED:
                _WARNED.add(frame)
                warnings.warn(f"flydsl backend: {text}; raise torch._dynamo.config.recompile_limit or remove the "
                              "cause of the recompiles", stacklevel=2)
        except Exception:  # noqa: BLE001 — a logging handler must never raise
            pass


def _compile_id() -> tuple[str, str]:
    """(frame id, "frame/compile") of the graph dynamo is compiling now, or ("", "")."""
    try:
        cid = torch._guards.CompileContext.current_compile_id()
        return str(cid.frame_id), f"{cid.frame_id}/{cid.frame_compile_id}"
    except Exception:  # noqa: BLE001
        return "", ""


def _dynamo_context() -> tuple[str | None, dict]:
    """The recompile reason of the compile in progress, and dynamo's graph-break counter."""
    reason = None
    try:
        from torch._dynamo.utils import counters, get_metrics_context

        reason = get_metrics_context()._metrics.get("recompile_reason")
        # "unimplemented": breaks dynamo could not resume from, such as one inside a loop, after which
        # it skips the whole frame (that function then runs in eager PyTorch, reaching no backend)
        breaks = {**dict(counters["unimplemented"]), **dict(counters["graph_break"])}
    except Exception:  # noqa: BLE001 — dynamo internals: best effort, the counts stand alone
        breaks = {}
    return reason, breaks


_BREAKS_SEEN: dict = {}  # dynamo's graph-break counter when the backend was last handed a graph


def _break_text(text) -> str:
    """A graph break as the record says it: its first line, and the frame dynamo skipped if it did."""
    skipped = next((ln.split("frame skipped:", 1)[1].strip() for ln in str(text).splitlines()
                    if "frame skipped:" in ln), None)
    first = _first(text)
    return f"{first}; frame skipped, runs in eager PyTorch: {skipped}" if skipped else first


def _first(text) -> str:
    """The first line of one of dynamo's reasons, spaces squeezed (its guard lines carry the source line)."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return " ".join(line.split())[:300]


def _watch_dynamo() -> None:
    lg = logging.getLogger("torch._dynamo.convert_frame")
    if not any(isinstance(h, _DynamoLimit) for h in lg.handlers):
        lg.addHandler(_DynamoLimit(level=logging.WARNING))


def _source_name(gm, i) -> str:
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ga = ph[i].meta.get("grapharg") if i < len(ph) else None
    src = getattr(ga, "source", None)
    return src.name if src is not None and isinstance(getattr(src, "name", None), str) else str(src or "")


def _is_frozen(gm, i, value) -> bool:
    """Input i is a module parameter or buffer (dynamo's source for it says so)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    name = _source_name(gm, i)
    return "_buffers[" in name or "_parameters[" in name


def _written_inputs(gm, args) -> set[int] | None:
    """The tensor inputs dynamo's graph writes in place: the graph is run once on fake copies
    of the inputs (a shape environment lets `.item()` of a 0-d input be a symbol), and an input
    whose version counter moved was written (through any view). None: the run failed."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    before = [f._version if isinstance(f, torch.Tensor) else None for f in fakes]
    try:
        with mode, torch.no_grad():
            gm(*fakes)
    except Exception as e:  # noqa: BLE001 — the caller then holds every buffer as the user's own
        log.info("fake run of the dynamo graph failed (%s: %s): writes unknown", type(e).__name__, e)
        return None
    return {i for i, (f, v) in enumerate(zip(fakes, before)) if v is not None and f._version != v}


class _Frozen(torch.nn.Module):
    """The dynamo graph with its parameter / buffer inputs held as constants and the sizes
    dynamo passes as ints fixed to one value; forward takes the remaining (tensor) inputs.
    State inputs (written in place) are held as the user's own tensors, never copied."""

    def __init__(self, gm, args, kinds: list[str], frozen: dict):
        super().__init__()
        self.graph_module = _floats_baked(gm, {i: float(x) for i, (x, k) in enumerate(zip(args, kinds)) if k == "float"})
        self._slots = []  # per graph input: ("user", k) | ("const", attribute name) | ("int", value)
        n_user = 0
        for i, (x, kind) in enumerate(zip(args, kinds)):
            if kind in ("const", "state"):
                name = f"const_{i}"
                if kind == "const" and isinstance(x, torch.nn.Parameter):
                    self.register_parameter(name, torch.nn.Parameter(frozen[i], requires_grad=False))
                else:
                    self.register_buffer(name, frozen[i] if kind == "const" else x)
                self._slots.append(("const", name))
            elif kind in ("scalar", "float", "unused"):
                self._slots.append(("int", x if kind != "unused" else None))
            else:
                self._slots.append(("user", n_user))
                n_user += 1
        self.eval()  # dynamo traced the model's mode into the graph: no flag of this wrapper changes it

    def forward(self, *user):
        args = [user[v] if kind == "user" else getattr(self, v) if kind == "const" else v for kind, v in self._slots]
        return self.graph_module(*args)


def _unused(gm, i, x) -> bool:
    """Input i is an object no node reads (the device mesh AOT autograd passes with a DTensor's local shard)."""
    if isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return i < len(ph) and not ph[i].users


def _item_only(gm, i, x) -> bool:
    """Input i is a Python float dynamo passes as a 0-d tensor (dynamic=True: an RMSNorm's eps, an
    attention's scaling), read only through `.item()`."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 0 and x.is_floating_point() and x.device.type == "cpu"):
        return False
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"][i]
    return bool(ph.users) and all(u.op == "call_method" and u.target == "item" for u in ph.users)


def _floats_baked(gm, values: dict):
    """A copy of gm whose `.item()` of the float inputs `values` ({input index: value}) are those numbers:
    torch.export cannot guard on an unbacked float (SDPA's scale), and the translation is keyed on them."""
    if not values:
        return gm
    import copy

    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    phs = [n for n in out.graph.nodes if n.op == "placeholder"]
    for i, v in values.items():
        for u in list(phs[i].users):
            u.replace_all_uses_with(v)
            out.graph.erase_node(u)
    out.recompile()
    return out


class _WeightSet:
    """The weight tensors (parameters, unwritten buffers) of one call, frozen: private copies, so
    later in-place updates of the model do not leak in. Matched by identity (weak references, so
    a freed tensor whose id is reused never matches) against the tensors a call passes."""

    def __init__(self, args, const: list[int]):
        self.refs = {i: weakref.ref(args[i]) for i in const}
        self.frozen = {i: args[i].detach().clone() for i in const}
        self.variants: list = []  # [(the int inputs, TranslatedModule)]

    def matches(self, args) -> bool:
        return all(r() is args[i] for i, r in self.refs.items())


def _options(options) -> dict:
    opts = dict(options or {})
    bad = sorted(set(opts) - set(OPTIONS))
    if bad:
        raise InputError(f"torch.compile(backend='flydsl') does not know the option(s) {', '.join(bad)}; "
                         f"it takes {', '.join(OPTIONS)} (as translate() does)")
    from ..api import check_options, choose_backend

    # a wrong value is the user's to fix at once, not a graph to run in eager PyTorch with a warning
    check_options(opts.get("arch", "gfx942"), opts.get("backend", "auto"), opts.get("precision", "fp32"))
    if opts.get("backend") in ("rocm", "flysim"):
        choose_backend(opts["backend"], set())  # no ROCm GPU / no flysim here: its InputError
    return opts


def _kinds(gm, example_inputs, weights: set[int] | None = None) -> list[str]:
    """Per dynamo input: scalar | float (a 0-d tensor only `.item()`ed: baked, keyed like a scalar) | const (a weight, frozen) | state (a module buffer the graph writes:
    the user's own tensor; every buffer when the writes cannot be found) | user (passed at each
    call: a tensor the caller passes, such as HF's StaticCache tensors, is written where it is).
    A written parameter is refused."""
    kinds = [("unused" if _unused(gm, i, x) else "scalar") if not isinstance(x, torch.Tensor) else
             "const" if (i in weights if weights is not None else _is_frozen(gm, i, x)) else
             "float" if _item_only(gm, i, x) else "user" for i, x in enumerate(example_inputs)]
    written = _written_inputs(gm, example_inputs)
    if written is None:  # unknown: no buffer is frozen (a write to a private copy would be lost)
        written = {i for i, (x, k) in enumerate(zip(example_inputs, kinds))
                   if k == "const" and not isinstance(x, torch.nn.Parameter)}
    for i in sorted(written):
        if kinds[i] == "const":
            if isinstance(example_inputs[i], torch.nn.Parameter):
                raise InputError(f"the compiled code writes the parameter {_source_name(gm, i)} in place; the flydsl "
                                 "backend freezes parameters at compile time, so the write would be lost: register "
                                 "that state as a buffer (self.register_buffer) instead of a Parameter")
            kinds[i] = "state"
    return kinds


def flydsl_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_):
    """The dynamo backend: returns a callable that runs the translated graph."""
    opts = _options(options)
    _watch_dynamo()
    # dynamo already generalizes shapes across calls (and passes sizes as ints); translate each
    # graph for the shapes it is called with
    opts.setdefault("dynamic_shapes", None)
    cid = _compile_id()[1]
    reason, breaks = _dynamo_context()
    new_breaks = [f"{k} (x{v - _BREAKS_SEEN.get(k, 0)})" for k, v in breaks.items() if v > _BREAKS_SEEN.get(k, 0)]
    _BREAKS_SEEN.clear()
    _BREAKS_SEEN.update(breaks)
    rec = GraphRecord(name=f"graph{len(_RECORDS)}", compile_id=cid, recompile_reason=_first(reason) if reason else None,
                      graph_breaks=[_break_text(b) for b in new_breaks])
    _RECORDS.append(rec)
    # DTensor parameters: translate the graph over the local shards (other tensor subclasses, torchao's
    # quantized weights, go to translate() as they are: its quantization rules read them)
    if any(is_dtensor(x) for x in example_inputs):
        return desugared(gm, example_inputs, rec, lambda fgm, args, weights: _runner(rec, fgm, args, opts, weights),
                         strict=bool(opts.get("strict")))
    return _runner(rec, gm, example_inputs, opts)


def _runner(rec: GraphRecord, gm, example_inputs, opts: dict, weights: set[int] | None = None):
    """The callable that runs graph `gm` through its translations (`weights`: the inputs to freeze, when
    dynamo's sources for them are gone)."""
    from ..api import translate
    from .. import state

    example_inputs = [_concrete(x) for x in example_inputs]
    kinds = _kinds(gm, example_inputs, weights)
    through = PassThrough(gm, example_inputs)  # ints that only pass through: no key (generation_scalars.py)
    held = {i: x for i, (x, k) in enumerate(zip(example_inputs, kinds)) if k == "state"}  # the user's own buffers
    for t in held.values():
        state.share(t)
    rec.state = [_source_name(gm, i) for i in held]
    const = [i for i, k in enumerate(kinds) if k == "const"]
    sets: list[_WeightSet] = []  # one per set of weight tensors dynamo passed (a reused graph gets others)

    def weights_of(args) -> _WeightSet | None:
        """The weight set these args carry: dynamo reuses one graph for every module instance of
        the same code (the layers of a stack, the experts of a loop, after a graph break), passing
        each instance's parameters. A new set is frozen (copied) here, up to MAX_WEIGHT_SETS."""
        for ws in sets:
            if ws.matches(args):
                return ws
        if len(sets) >= MAX_WEIGHT_SETS:
            return None
        ws = _WeightSet(args, const)
        sets.append(ws)
        return ws

    def as_given(args, ws):
        """Run dynamo's graph in PyTorch, on the frozen weights (and the state it is given); weights
        beyond MAX_WEIGHT_SETS run as passed."""
        rec.calls_pytorch += 1
        frozen = ws.frozen if ws is not None else {}
        return gm(*(frozen[i] if i in frozen else a for i, a in enumerate(args)))

    def split(args):
        return ([a for a, k in zip(args, kinds) if k == "user"] + through.tensors(args),
                tuple(a if k == "scalar" else float(a) for i, (a, k) in enumerate(zip(args, kinds))
                      if k in ("scalar", "float") and i not in through.inputs) + through.key(args))

    def rebind(args):
        """The user replaced a state buffer object: the translations write the new one."""
        for i, old in list(held.items()):
            new = args[i]
            if new is not old:
                state.share(new)
                for ws in sets:
                    for _, tm in ws.variants:
                        state.rebind(tm, old, new)  # its graph module's buffer slots
                held[i] = new

    def translate_for(args, ws):
        if len(ws.variants) >= MAX_VARIANTS:
            if not rec.fallback_reason:
                warnings.warn(f"flydsl backend: {rec.name} was translated for {MAX_VARIANTS} input signatures; "
                              "further ones run in PyTorch as dynamo captured them", stacklevel=3)
            rec.fallback_reason = f"more than {MAX_VARIANTS} input signatures: the rest run in PyTorch"
            return None
        user, ints = split(args)
        frozen = _Frozen(through.graph(gm), [*args, *through.tensors(args)], kinds + ["user"] * len(through.operands),
                         ws.frozen)
        tm = translate(frozen, tuple(user), name=rec.name, **opts)
        ws.variants.append((ints, tm))
        rec.translated.append(tm)
        log.info("%s", tm.report.headline())
        return tm

    def run(*args):
        if held:
            rebind(args)
        ws = weights_of(args)
        if ws is None:
            if not rec.weight_sets_reason:
                rec.weight_sets_reason = (f"called with more than {MAX_WEIGHT_SETS} sets of weights (one graph reused "
                                          "for many module instances): the rest run in PyTorch")
                warnings.warn(f"flydsl backend: {rec.name} {rec.weight_sets_reason}", stacklevel=2)
            return as_given(args, None)
        if rec.fallback_reason and not ws.variants:
            return as_given(args, ws)
        user, ints = split(args)
        for s, tm in ws.variants:  # ints are baked into a translation: match them exactly
            if s != ints:
                continue
            try:
                out = tm(*user)
            except ShapeError:  # a dim the capture specialized
                continue
            rec.calls_translated += 1
            return through.patch(out, args)
        try:
            tm = translate_for([_concrete(a) for a in args], ws)
        except TranslatorError as e:
            if opts.get("strict") or any(w.variants for w in sets):
                raise
            _fallback(rec, f"{type(e).__name__}: {e}")
            tm = None
        if tm is None:
            return as_given(args, ws)
        out = tm(*user)
        rec.calls_translated += 1
        return through.patch(out, args)

    run.record = rec
    return run


def _concrete(x):
    """A size dynamo passes as a SymInt (dynamic shapes) becomes its example value: the translation
    is keyed on it, and a call with another value is translated again."""
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        return int(hint) if hint is not None else x
    return x


def _fallback(rec: GraphRecord, reason: str) -> None:
    rec.fallback_reason = reason
    warnings.warn(f"flydsl backend: {rec.name} runs in PyTorch as dynamo captured it: {reason}", stacklevel=3)


def _register() -> None:
    """Register the name "flydsl" unless our installed entry point will (torch's lookup_backend
    loads it on first use); that check needs no torch._dynamo import, which costs ~1 s."""
    from importlib.metadata import entry_points

    try:
        if any(ep.name == NAME and ep.value.startswith(__name__) for ep in entry_points(group="torch_dynamo_backends")):
            return
    except Exception:  # noqa: BLE001 — broken metadata elsewhere must not stop the import
        pass
    from torch._dynamo.backends import registry

    if NAME not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=flydsl_backend, name=NAME)


_register()
