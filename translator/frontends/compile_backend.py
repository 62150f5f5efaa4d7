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

Per graph: translate() lowers what it can and leaves the rest in PyTorch with a reason, as
it does for a whole model. A graph that translate() cannot take at all (capture fails, an
input kind it does not serve) runs as dynamo gave it, and the reason is recorded. Graph
breaks simply give several graphs. A graph is translated on its first call, with the real
inputs and outside dynamo's tracing context (whose shape guards, written against dynamo's
sources, would otherwise leak into torch.export). Calls with shapes that the translation specialized are
translated again for the new shapes (a few per graph, like dynamo's recompiles).

Options (torch.compile(..., options={...})): arch, backend, precision, verify, strict,
fallback_on_mismatch, dynamic_shapes — as for translate(). `reports()` lists what each
compiled graph became.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch

from ..errors import InputError, ShapeError, TranslatorError

log = logging.getLogger(__name__)

NAME = "flydsl"
MAX_VARIANTS = 8  # translations kept per graph for differently shaped calls
OPTIONS = ("arch", "backend", "precision", "verify", "strict", "fallback_on_mismatch", "dynamic_shapes")


@dataclass
class GraphRecord:
    """One graph dynamo compiled with this backend: its translations, or why it runs as given."""

    name: str
    translated: list = field(default_factory=list)  # TranslatedModule per input signature
    fallback_reason: str | None = None

    @property
    def report(self):
        return self.translated[-1].report if self.translated else None


_RECORDS: list[GraphRecord] = []


def reports() -> list[GraphRecord]:
    """Every graph compiled with backend="flydsl" in this process, oldest first."""
    return list(_RECORDS)


def reset() -> None:
    _RECORDS.clear()


def _is_frozen(gm, i, value) -> bool:
    """Input i is a module parameter or buffer (dynamo's source for it says so)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ga = ph[i].meta.get("grapharg") if i < len(ph) else None
    src = getattr(ga, "source", None)
    name = src.name if src is not None and isinstance(getattr(src, "name", None), str) else str(src or "")
    return "_buffers[" in name or "_parameters[" in name


class _Frozen(torch.nn.Module):
    """The dynamo graph with its parameter / buffer inputs held as constants and the sizes
    dynamo passes as ints fixed to one value; forward takes the remaining (tensor) inputs."""

    def __init__(self, gm, args, kinds: list[str], frozen: dict):
        super().__init__()
        self.graph_module = gm
        self._slots = []  # per graph input: ("user", k) | ("const", attribute name) | ("int", value)
        n_user = 0
        for i, (x, kind) in enumerate(zip(args, kinds)):
            if kind == "const":
                name = f"const_{i}"
                if isinstance(x, torch.nn.Parameter):
                    self.register_parameter(name, torch.nn.Parameter(frozen[i], requires_grad=False))
                else:
                    self.register_buffer(name, frozen[i])
                self._slots.append(("const", name))
            elif kind == "scalar":
                self._slots.append(("int", x))
            else:
                self._slots.append(("user", n_user))
                n_user += 1

    def forward(self, *user):
        args = [user[v] if kind == "user" else getattr(self, v) if kind == "const" else v for kind, v in self._slots]
        return self.graph_module(*args)


def _options(options) -> dict:
    opts = dict(options or {})
    bad = sorted(set(opts) - set(OPTIONS))
    if bad:
        raise InputError(f"torch.compile(backend='flydsl') does not know the option(s) {', '.join(bad)}; "
                         f"it takes {', '.join(OPTIONS)} (as translate() does)")
    return opts


def flydsl_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_):
    """The dynamo backend: returns a callable that runs the translated graph."""
    from ..api import translate

    opts = _options(options)
    # dynamo already generalizes shapes across calls (and passes sizes as ints); translate each
    # graph for the shapes it is called with
    opts.setdefault("dynamic_shapes", None)
    rec = GraphRecord(name=f"graph{len(_RECORDS)}")
    _RECORDS.append(rec)
    example_inputs = [_concrete(x) for x in example_inputs]
    kinds = ["scalar" if not isinstance(x, torch.Tensor) else "const" if _is_frozen(gm, i, x) else "user"
             for i, x in enumerate(example_inputs)]
    variants: list = []  # [(the int inputs, TranslatedModule)]
    # the weights as they are now: private copies, so later in-place updates of the model do not leak in
    frozen = {i: x.detach().clone() for i, (x, k) in enumerate(zip(example_inputs, kinds)) if k == "const"}

    def as_given(args):
        """Run dynamo's graph in PyTorch, on the frozen weights."""
        return gm(*(frozen[i] if i in frozen else a for i, a in enumerate(args)))

    def split(args):
        return ([a for a, k in zip(args, kinds) if k == "user"], tuple(a for a, k in zip(args, kinds) if k == "scalar"))

    def translate_for(args):
        if len(variants) >= MAX_VARIANTS:
            if not rec.fallback_reason:
                warnings.warn(f"flydsl backend: {rec.name} was translated for {MAX_VARIANTS} input signatures; "
                              "further ones run in PyTorch as dynamo captured them", stacklevel=3)
            rec.fallback_reason = f"more than {MAX_VARIANTS} input signatures: the rest run in PyTorch"
            return None
        user, ints = split(args)
        tm = translate(_Frozen(gm, args, kinds, frozen), tuple(user), name=rec.name, **opts)
        variants.append((ints, tm))
        rec.translated.append(tm)
        log.info("%s", tm.report.headline())
        return tm

    def run(*args):
        if rec.fallback_reason and not variants:
            return as_given(args)
        user, ints = split(args)
        for s, tm in variants:  # ints are baked into a translation: match them exactly
            if s != ints:
                continue
            try:
                return tm(*user)
            except ShapeError:  # a dim the capture specialized
                continue
        try:
            tm = translate_for([_concrete(a) for a in args])
        except TranslatorError as e:
            if opts.get("strict") or variants:
                raise
            _fallback(rec, f"{type(e).__name__}: {e}")
            tm = None
        return as_given(args) if tm is None else tm(*user)

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
