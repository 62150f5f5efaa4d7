"""The registry: one entry per FlyDSL op family, one rule per graph form lowered to it.

An `OpFamily` is a FlyDSL op as the translated graph sees it (`torch.ops.flydsl.<name>`):
its reference math, the adapter that launches our FlyDSL kernel, sample inputs and
tolerance overrides. A `Rule` says which graph nodes become that op: the stage that applies
it, the targets it looks at, a pure support check and the rewrite. Rules are registered with
the `rule` decorator on the rewrite, next to it:

    @rule(Stage.CANONICAL, aten.linear.default, family="gemm", supported=linear_supported)
    def lower_linear(node, ctx): ...

A support check matches once and hands what it found to the rewrite (Inductor's `Match`,
tinygrad's named bindings): it returns the match (any object that is not a string: a `Match`
of named bindings, or the family's own match record; None when the node itself is all the
rewrite needs), a reason string (quoted verbatim in the report; a `Reason` also names the other
nodes of the form the report shows it on) or a falsy `NO_MATCH` (this is not the form the rule
looks for; nothing to report). `check` turns that into a typed `Verdict` whose `match` the
matching pass hands to the rewrite as `rewrite(node, ctx, match)`. A rewrite never runs the
matcher again (tests/unit/test_architecture.py), and a support check writes nothing anywhere:
reasons for other nodes are returned, not recorded. A rewrite of two parameters (node, ctx) is
for a rule whose check binds nothing. Within a stage, rules that look at the same node are tried by
descending `priority`, then by name: the order never depends on which module was imported
first. A typo in a stage is an AttributeError on `Stage`, not a silently idle rule.

`RegionRule`s describe what may join a fused region (the partition pass groups such nodes and
calls the rule's rewrite once per region); a consumer rule's `claims` names the nodes it will
fold into a FlyDSL node later, so partitioning leaves them out.

Adding an op family is one file in translator/lowerings that registers its family and rules,
plus its import in translator/lowerings/__init__.py (and a kernel in translator_kernels if it
needs a new one). The README's supported-op table is generated from this registry
(translator/report/ops_table.py), and its test fails until it is regenerated.

Population is all or nothing (`populating`, around translator/lowerings/__init__.py's imports): a
Ctrl-C waits for the imports to finish, and where an exception stops them part way, the entries
of the modules that did not finish (each entry remembers the module whose body registered it) are
forgotten, so the next import runs those again on a clean registry (before, a first translate()
interrupted there left "op family registered twice" or ops reported without a lowering in every
later translate of the process).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import signal
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

Node = torch.fx.Node


class Stage(enum.Enum):
    """Which pass applies a rule (see translator.passes.PIPELINE for their order)."""

    DECOMPOSE = "decompose"  # an aten op rewritten into aten ops the later stages lower (losses)
    PATTERN = "pattern"  # a hand-written multi-node form (attention, norms, residual + norm, scans)
    CANONICAL = "canonical"  # one aten op -> one FlyDSL op
    CONSUMER = "consumer"  # what follows or feeds a FlyDSL node folds into it (epilogues, prologues)


class _NoMatch:
    def __repr__(self):
        return "NO_MATCH"

    def __bool__(self):
        return False


NO_MATCH = _NoMatch()  # a support check's answer for "not this form at all"


class Match(types.SimpleNamespace):
    """What a support check found, by name (`Match(a=left, b=right)`): the rewrite reads `m.a`."""


class Reason(str):
    """A reason that the report shows on the node and on `also` (the other nodes of the matched form,
    such as a hand-written norm's statistics), returned by the check for the matching pass to record.
    The report line is `prefix + reason` when a prefix is given, else "<rule name>: <reason>"."""

    def __new__(cls, text: str, also=(), prefix: str | None = None):
        r = super().__new__(cls, text)
        r.also, r.prefix = tuple(also), prefix
        return r


def report_line(r: Rule, reason: str) -> str:
    """How the report quotes rule `r`'s reason."""
    prefix = getattr(reason, "prefix", None)
    return f"{r.name}: {reason}" if prefix is None else prefix + reason


@dataclass(frozen=True)
class Verdict:
    """A support check's answer: supported (with its match), a reason it is not, or no match."""

    supported: bool
    reason: str | None = None
    match: Any = None

    @property
    def matched(self) -> bool:
        return self.supported or self.reason is not None


SUPPORTED = Verdict(True)
NOT_MATCHED = Verdict(False)

# A support check: (node, ctx) -> match | None | reason | NO_MATCH.
SupportCheck = Callable[[Node, Any], Any]


@dataclass
class OpFamily:
    name: str  # "gemm" -> torch.ops.flydsl.gemm
    description: str
    reference: Callable[..., Any]  # ref_<op>(*op_args): plain torch math, never reported as a kernel
    kernel: Callable[..., Any]  # adapter: same signature as the op, launches our FlyDSL kernel
    kernel_entry: str  # "translator_kernels.rows.softmax:softmax": the kernel library entry it calls
    sample_inputs: Callable[[torch.dtype], tuple] | None = None
    # per-dtype (atol, rtol) overrides of translator.tolerances.TOLERANCES, with the reason
    tolerance_overrides: dict[torch.dtype, tuple[float, float, str]] = field(default_factory=dict)

    @property
    def op(self):
        return getattr(torch.ops.flydsl, self.name)


@dataclass
class Rule:
    name: str  # counter name, e.g. "linear"
    family: str
    stage: Stage
    targets: tuple  # aten OpOverloads (or callables) this rule inspects
    supported: SupportCheck
    rewrite: Callable[..., Any]  # (node, ctx, match), or (node, ctx) when the check binds nothing
    priority: int = 0  # higher is tried first among a stage's rules for one node
    doc: str = ""
    claims: Callable[[Node, Any], list] | None = None  # CONSUMER rules: (node, ctx) -> nodes it will fold in

    def apply(self, node: Node, ctx, verdict: Verdict):
        """Run the rewrite on a supported verdict, handing it the check's match."""
        if _takes_match(self.rewrite):
            return self.rewrite(node, ctx, verdict.match)
        return self.rewrite(node, ctx)


def _takes_match(fn) -> bool:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 3


@dataclass
class RegionRule:
    """What may join a fused region of `family`, and the rewrite of one whole region."""

    name: str
    family: str
    targets: frozenset
    supported: Callable[[Node], Optional[str]]  # node -> None | reason
    rewrite: Callable[..., Node]  # (ctx, members in graph order, outputs, anchor) -> fused node
    trivial: Callable[[Node], bool]  # a member that computes nothing (a region of only these is skipped)
    doc: str = ""


FAMILIES: dict[str, OpFamily] = {}
RULES: list[Rule] = []
REGION_RULES: list[RegionRule] = []
# ops kept in PyTorch by design: conv, pooling, batchnorm, resampling, collectives (lowerings/by_design.py)
BY_DESIGN: set = set()
BY_DESIGN_WHY: dict = {}  # op packet -> why, where the report says more than "by design"


_ORIGIN: dict = {}  # id(registered entry) -> the module whose body registered it (see populating)


def _registering_module() -> str | None:
    """The module whose body is executing (the innermost `<module>` frame): a lowering file, also when
    it registers through a helper defined elsewhere."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_name != "<module>":
        f = f.f_back
    return f.f_globals.get("__name__") if f is not None else None


def _drop_orphans() -> None:
    """Forget the entries registered by a module body that did not finish (no longer in sys.modules).
    Plain loops: no nested function runs here (nothing an interrupt could stop half way)."""
    for name in list(FAMILIES):
        origin = _ORIGIN.get(id(FAMILIES[name]))
        if origin is not None and origin not in sys.modules:
            del FAMILIES[name]
    for table in (RULES, REGION_RULES):
        keep = []
        for r in table:
            origin = _ORIGIN.get(id(r))
            if origin is None or origin in sys.modules:
                keep.append(r)
        table[:] = keep


@contextlib.contextmanager
def populating(package: str):
    """Run the imports of `package`'s lowering files, all or nothing. A Ctrl-C waits until they are
    done (`_interrupts_deferred`: a lowering file run twice would define its custom op twice, and a
    new definition makes a new OpOverload where rules compare targets by identity). Where an
    exception stops one part way anyway, Python drops it (and the modules importing it) from
    sys.modules, and what those registered is forgotten here, so the next import runs them again on
    a registry without their entries; the same repair runs on entry, in case an interrupt stopped
    the one below it."""
    with _interrupts_deferred():
        _drop_orphans()
        try:
            yield
        except BaseException:
            _drop_orphans()
            raise


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT arriving in the body is raised (by the handler that was installed) once the body is done."""
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        yield
        return
    got = []
    old = signal.signal(signal.SIGINT, lambda sig, frame: got.append(sig))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got:
            signal.raise_signal(signal.SIGINT)


def register_family(fam: OpFamily) -> OpFamily:
    if fam.name in FAMILIES:
        raise ValueError(f"op family {fam.name!r} registered twice")
    _ORIGIN[id(fam)] = _registering_module()  # before it is published: an interrupt between leaves no orphan
    FAMILIES[fam.name] = fam
    return fam


def register_rule(r: Rule) -> Rule:
    if not isinstance(r.stage, Stage):
        raise TypeError(f"rule {r.name!r}: stage must be a translator.registry.Stage, not {r.stage!r}")
    if r.family not in FAMILIES:
        raise ValueError(f"rule {r.name!r} names unknown family {r.family!r}")
    if any(o.name == r.name and o.stage is r.stage for o in RULES):
        raise ValueError(f"rule {r.name!r} registered twice in stage {r.stage.name}")
    _ORIGIN[id(r)] = _registering_module()
    RULES.append(r)
    return r


def rule(stage: Stage, *targets, family: str, supported: SupportCheck, name: str | None = None,
         priority: int = 0, doc: str = "", claims=None):
    """Decorator: register the decorated rewrite as a rule (its name defaults to the function's
    without a `lower_` prefix)."""
    def deco(fn):
        register_rule(Rule(name or fn.__name__.removeprefix("lower_"), family, stage, tuple(targets), supported,
                           fn, priority, doc or (fn.__doc__ or "").strip().split("\n")[0], claims))
        return fn
    return deco


def register_region(r: RegionRule) -> RegionRule:
    if r.family not in FAMILIES:
        raise ValueError(f"region rule {r.name!r} names unknown family {r.family!r}")
    _ORIGIN[id(r)] = _registering_module()
    REGION_RULES.append(r)
    return r


def rules_for(stage: Stage) -> list[Rule]:
    """The stage's rules in the order they are tried: priority (high first), then name."""
    if not isinstance(stage, Stage):
        raise TypeError(f"stage must be a translator.registry.Stage, not {stage!r}")
    return sorted((r for r in RULES if r.stage is stage), key=lambda r: (-r.priority, r.name))


def check(r: Rule, node: Node, ctx) -> Verdict:
    """Run rule `r`'s support check on `node` as a typed verdict (its match kept for the rewrite)."""
    out = r.supported(node, ctx)
    if out is None:
        return SUPPORTED
    if out is NO_MATCH:
        return NOT_MATCHED
    if isinstance(out, bool):  # `return x is not None` is a bug, not an answer
        pass
    elif isinstance(out, str):
        if out:
            return Verdict(False, out)
    elif out:
        return Verdict(True, None, out)
    raise TypeError(f"support check of rule {r.name!r} returned {out!r}; it must return a match (None when the "
                    "node is all the rewrite needs), a reason string, or translator.registry.NO_MATCH")
