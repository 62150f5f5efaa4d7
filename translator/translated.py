"""The translated module: what translate() returns, and what its call does.

`TranslatedModule` wraps the torch.fx.GraphModule whose hot ops are `torch.ops.flydsl.*`. A call
checks the inputs against what the translation serves (count, dtypes, static sizes; once per input
signature), refuses inputs that require grad (the FlyDSL ops have no backward), runs the graph under
the module's backend (translator.runtime) and keeps what ran: the launch records, the op calls with
their nodes (the report observes new ones), the generated kernels.

Threads: a call on the flysim or rocm backend holds runtime.EXECUTION_LOCK (re-entrant) for the
whole call, so the `last_*` attributes describe one call; it is taken and noted in one line and
given back in `finally` (translator_kernels.launch.locked says why not `with lock:`).

State: the translated module shares the user's model's weights, like torch.compile's
OptimizedModule (translator.state, translator.weights): `tm.state_dict()` is the model's state
dict (its keys, order and tensors, as `model.state_dict()` gives them), except that a buffer the
graph writes (a step counter, running statistics) comes from the translated module's own copy;
`tm.load_state_dict(sd)` loads into the model (strict or not, `assign` as torch's), into those
own copies, and the next forward rebuilds the prepared weights (preshuffled GEMM weights, folded
shape regions) from the new values. So loading into `tm` changes the user's model too, as loading
into an OptimizedModule does: that is what sharing means. A graph captured by
torch.fx.symbolic_trace (from a private copy of the model) and a module loaded by translator.load
share nothing: their state dict is the graph module's own (keys `gm.*`).

Copies: `copy.deepcopy(tm)` is an independent translation (the model copied with it, its own state,
prepared weights that follow the copied weights); pickling (`torch.save(tm)`) is refused with the
documented path, `translator.save` / `translator.load` (a .pt2 archive, nothing pickled).

This module builds nothing: translator.api makes the module and hands it the translator
(`_share(model, captured, translate)`) that `specialize` calls again.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools

import torch
import torch.utils._pytree as pytree

from . import runtime, state, weights
from .errors import DeviceError, DtypeError, GradError, InputError, ShapeError
from .graph import static_int
from .report import Report
from .report.rows import is_flydsl
from .runtime import fastpath
from .state import materialize, rebind, refresh_prepared, tensor_at, written_targets


class TranslatedModule(torch.nn.Module):
    """A translated model: a torch.fx.GraphModule whose hot ops are `torch.ops.flydsl.*`.

    Calling it runs the graph with the FlyDSL ops on `self.backend` (rocm | flysim |
    reference); `.report` says what runs where; `.code` is the graph as readable Python.
    """

    def __init__(self, gm, backend: str, arch: str, report: Report, input_spec):
        super().__init__()
        self.gm = gm
        self.backend = backend
        self.arch = arch
        self.report = report
        self._input_spec = input_spec  # per input: None, or [(dim, static size or None)]
        self._input_dtypes = [n.meta["val"].dtype if isinstance(n.meta.get("val"), torch.Tensor) else None
                              for n in gm.graph.nodes if n.op == "placeholder"]
        self.last_launches: list = []  # the launch records of the last call (flysim: LaunchRecord)
        self.last_calls: list = []  # runtime.ops.OpCall per FlyDSL op call of the last call, node set
        self.last_generated_kernels: set = set()
        # the FlyDSL nodes in call order, named as the report knows them (a loaded graph may rename nodes)
        names = [n.name for n in gm.graph.nodes if is_flydsl(n)]
        self._flydsl_nodes = list(report.ops) if len(report.ops) == len(names) else names
        self.fast_path = True  # run FlyDSL nodes without the custom-op layers (runtime.fastpath); same results
        self.training = False  # an eval-mode forward (see train())

    def __deepcopy__(self, memo):
        """An independent translation: the model deep-copied with it (the copy shares the copied model's
        weights as this one shares the model's), its own state (buffers the graph writes), prepared
        weights that follow the copied weights, and a report and launch history of its own."""
        cls = type(self)
        new = memo[id(self)] = cls.__new__(cls)
        d = self.__dict__
        fresh = {"last_launches": [], "last_calls": [], "last_generated_kernels": set(), "_observed": None}

        def copy_all():
            for key, value in d.items():
                new.__dict__[key] = fresh[key] if key in fresh else copy.deepcopy(value, memo)


        with _tree_specs_shared(self.gm, memo):
            state.deep_copy(self.gm, memo, copy_all)
        model = new.__dict__.get("_model")
        if model is not None:
            weights.track(new.gm, model)
        return new

    def __copy__(self):
        """A shallow copy, as for any module: the same graph module, weights and state."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __reduce_ex__(self, protocol):
        raise InputError(
            "a translated module is not pickled (torch.save(tm) / pickle.dumps(tm)): its graph holds "
            "torch.export's code objects and the translation's prepared kernel weights; save it with "
            "translator.save(tm, 'model.pt2') and read it back with translator.load('model.pt2') (or "
            "torch.save(tm.state_dict(), ...) for the weights alone); copy.deepcopy(tm) gives an independent copy")

    def _apply(self, fn, recurse=True):
        """`.to()`, `.float()`...: applied to the whole model whose weights this module shares (as an
        OptimizedModule's `.to()` moves its model), so the model never ends up half converted (before:
        only the weights the graph reads directly). The next forward looks at every weight
        (translator.weights): new objects (overwrite_module_params_on_conversion) are resolved by name,
        and a dtype or device other than the translation's is a clear error until converted back."""
        model = self.__dict__.get("_model")
        if model is not None:
            model._apply(fn, recurse)
        materialize(self.gm)  # prepared weights left lazy (state.settle): a placeholder has nothing to convert
        out = super()._apply(fn, recurse)
        weights.changed(self.gm)
        return out

    def refresh_weights(self) -> int:
        """Re-read every weight of the model and rebuild the prepared copies (preshuffled GEMM weights...)
        from it: after writes that no version counter sees (`p.data.copy_(w)`, a write through `.data`).
        Returns how many prepared copies were rebuilt. Other changes are seen by the next forward."""
        weights.follow(self.gm, force=True)
        return refresh_prepared(self.gm, force=True)

    def requires_grad_(self, requires_grad: bool = True):
        """On the whole shared model too (before: only the weights the graph reads directly). The
        translated forward has no backward; without grad on its weights it takes the fast path
        outside torch.no_grad() as well (runtime.fastpath.usable)."""
        model = self.__dict__.get("_model")
        if model is not None:
            model.requires_grad_(requires_grad)
        return super().requires_grad_(requires_grad)

    def train(self, mode: bool = True):
        """`tm.eval()` sets the flag (the translation is an eval-mode forward already; torch.export's
        graph module itself refuses train() and eval() with NotImplementedError); `tm.train()` is
        refused with the fix. The model's own mode is never changed."""
        if mode:
            raise InputError(
                "a translated module computes the eval-mode forward it was translated for (dropout off, batch "
                "norm on its running statistics) and has no backward: train the original model (the translated "
                "module shares its weights and follows their updates) and call the translated module for inference")
        self.training = False
        return self

    def _share(self, model: torch.nn.Module, captured: torch.nn.Module, translate) -> None:
        """Make `model` (the user's) the owner of this module's state (the module docstring's State).
        `captured` is the module torch.export captured (model itself, or the HF adapter around it);
        `translate` is translator.api.translate, which `specialize` calls."""
        names: dict = {}
        for name, t in _named_tensors(model):
            names.setdefault(id(t), []).append(name)
        in_captured = dict(_named_tensors(captured))
        d = self.__dict__  # plain attributes: the model is no submodule (its weights would be listed twice)
        d["_model"] = model
        d["_translate"] = translate
        d["_owned"] = [(key, target) for target in written_targets(self.gm)
                       for key in names.get(id(in_captured.get(target)), ())]
        self.register_load_state_dict_post_hook(_drop_graph_keys)

    def specialize(self, *example_inputs, dynamic_shapes=None, **options) -> "TranslatedModule":
        """A translation of the same model for other input shapes (a decode step beside a prefill
        translated with fixed shapes) that writes THIS module's state: each buffer its graph writes is
        this module's one copy (docs/state.md). Options default to this translation's arch and backend."""
        model = self.__dict__.get("_model")
        if model is None:
            raise InputError("this translated module holds no model to translate again (it was loaded by "
                             "translator.load or captured from a private copy): translate the model itself")
        options = {"arch": self.arch, "backend": self.backend, **options}
        other = self._translate(model, example_inputs, dynamic_shapes=dynamic_shapes, **options)
        mine = set(written_targets(self.gm))
        for target in written_targets(other.gm):
            if target in mine:
                rebind(other, tensor_at(other.gm, target), tensor_at(self.gm, target))
        return other

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The model's state dict (see the module docstring's State): its keys, order and tensors,
        a buffer the graph writes taken from this module's own copy."""
        model = self.__dict__.get("_model")
        if model is None:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        out = model.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        prefix = args[1] if len(args) > 1 else prefix  # torch's deprecated positional form
        for key, target in self._owned:
            if prefix + key in out:
                own = tensor_at(self.gm, target)
                out[prefix + key] = own if keep_vars else own.detach()
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """`load_state_dict` (also as a submodule of a larger model): into the model, and into this
        module's own copies of the buffers the graph writes (copied, never aliased, with assign=True
        too: the model's buffer and the translated module's stay separate)."""
        model = self.__dict__.get("_model")
        if model is None:
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        self.__dict__["_load_prefix"] = prefix  # for _drop_graph_keys, which torch calls without it
        sd = _under(state_dict, prefix)
        try:
            got = model.load_state_dict(sd, strict=False, assign=local_metadata.get("assign_to_params_buffers", False))
        except RuntimeError as e:  # size mismatches: torch's own lines, under this module's prefix
            error_msgs.extend(line.strip() for line in str(e).splitlines()[1:] if line.strip())
            return
        missing_keys.extend(prefix + k for k in got.missing_keys)
        unexpected_keys.extend(prefix + k for k in got.unexpected_keys)
        if strict and any(k.startswith("gm.") for k in got.unexpected_keys):
            error_msgs.append("keys under 'gm.' name the translated graph's own tensors (tm.gm.state_dict(), or a "
                              "translated module's state dict from before it gave the model's keys); load a state "
                              "dict with the model's keys, as model.state_dict() and tm.state_dict() give them")
        with torch.no_grad():
            for key, target in self._owned:
                own, new = tensor_at(self.gm, target), sd.get(key)
                if isinstance(new, torch.Tensor) and new.shape == own.shape:
                    own.copy_(new)

    @property
    def code(self) -> str:
        return self.gm.code

    def forward(self, *args):
        self._check(args)
        if torch.is_grad_enabled() and any(type(a) is torch.Tensor and a.requires_grad for a in args):
            raise GradError("a translated model is for inference: its FlyDSL ops have no backward, and an input "
                            "requires grad; call it under torch.no_grad() or torch.inference_mode() (or pass "
                            "x.detach()), and train the original model")
        from translator_kernels.codegen.emit import record_kernels

        # no autograd graph: nothing could run backward through the FlyDSL ops (traced by torch.export
        # or dynamo, the graph keeps its ops at top level instead of under a set_grad_enabled region)
        no_grad = contextlib.nullcontext() if torch.compiler.is_compiling() else torch.no_grad()
        held = False
        try:  # the lock is re-entrant: held here too, the last_* attributes describe one whole call;
            # acquired in one line and released in `finally`, as in runtime.use_backend (a Ctrl-C on a
            # `with lock:` line can skip its __exit__)
            held = runtime.EXECUTION_LOCK.acquire() if self.backend != "reference" else False
            # one `with` for three contexts, in this order: the line event CPython runs on the `with` line
            # before the exits comes inside the handlers of all but the innermost, so an interrupt there
            # skips only record_kernels' exit, a generator closed (its `finally` run) as the unwinding
            # drops it; a class context (no_grad) placed last would stay entered (tests/kernels/test_interrupts.py)
            with no_grad, runtime.use_backend(self.backend, self.arch) as st, record_kernels() as used:
                out = self._run(args)
            d = self.__dict__  # plain attributes: nn.Module.__setattr__'s parameter checks cost ~3 us each
            d["last_launches"] = list(st.launches)
            d["last_generated_kernels"] = used  # generated kernels this call ran (for --emit-kernels)
            if len(st.calls) == len(self._flydsl_nodes):  # the graph calls its FlyDSL ops once each, in order
                for c, node in zip(st.calls, self._flydsl_nodes):
                    c.node = node
                seen = (self.report, [c.launches for c in st.calls])
                if seen != d.get("_observed"):  # replayed plans append the very same records: nothing new
                    self.report.observe(st.calls)
                    d["_observed"] = seen
            d["last_calls"] = st.calls
        finally:
            if held:
                runtime.EXECUTION_LOCK.release()
        return out

    def _run(self, args):
        weights.follow(self.gm)  # parameter objects replaced after translate(), found by name
        refresh_prepared(self.gm)  # prepared weights follow parameter updates made after translate()
        fast = self.fast_path and fastpath.usable(self.gm, args)
        try:
            return fastpath.fast_forward(self.gm)(self.gm, *args) if fast else self.gm(*args)
        except AssertionError as e:  # torch.export's input guards: a limit the model itself sets
            if not str(e).startswith("Guard failed"):
                raise
            raise ShapeError(
                f"the inputs break a limit the model sets on its shapes ({str(e).removeprefix('Guard failed: ')}, "
                "named by forward's arguments; e.g. a sequence longer than a position table or mask buffer): "
                "call it within that limit, or enlarge that buffer in the model and translate again") from e

    def _check(self, args):
        """The inputs' count, dtypes, devices and static sizes; once per input signature (a
        signature that passed is remembered: ~1 us instead of the checks)."""
        if type(args[0] if args else None) is torch.Tensor:
            key = tuple((a.dtype, a.shape, a.device) if type(a) is torch.Tensor else type(a) for a in args)
            passed = self.__dict__.setdefault("_passed_inputs", set())
            if key not in passed:
                self._check_inputs(args)
                if len(passed) >= 256:
                    passed.clear()
                passed.add(key)
            return
        self._check_inputs(args)

    def _check_inputs(self, args):
        if len(args) != len(self._input_spec):
            raise ShapeError(f"the translated model takes {len(self._input_spec)} inputs, got {len(args)}")
        for i, (a, spec) in enumerate(zip(args, self._input_spec)):
            if spec is None:
                continue
            if not isinstance(a, torch.Tensor):
                raise ShapeError(f"input {i} must be a tensor, got {type(a).__name__}")
            want = self._input_dtypes[i] if i < len(self._input_dtypes) else None
            if want is not None and a.dtype != want:
                again = f", or translate again with {str(a.dtype)[6:]} example inputs" if a.is_floating_point() else ""
                raise DtypeError(
                    f"input {i} is {str(a.dtype)[6:]}, but this model was translated for {str(want)[6:]} inputs "
                    f"(its FlyDSL kernels are specialized per dtype): call it with x.to(torch.{str(want)[6:]}){again}")
            if a.device.type == "meta":
                raise DeviceError(f"input {i} is on the meta device (it has no data to compute on): "
                                 "call the translated model with real tensors")
            if a.dim() != len(spec):
                raise ShapeError(f"input {i} has {a.dim()} dims, the model was translated for {len(spec)}")
            for d, size in enumerate(spec):
                if size is not None and a.shape[d] != size:
                    raise ShapeError(
                        f"input {i} dim {d} is {a.shape[d]}, but this translation serves only {size} there "
                        f"(torch.export specialized that dim while capturing); translate again with an example "
                        f"input of the size you need")


def _named_tensors(module):
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def _under(state_dict, prefix: str):
    """The entries of `state_dict` under `prefix`, without it (its version metadata too)."""
    from collections import OrderedDict

    out = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items() if k.startswith(prefix))
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        root = prefix[:-1]
        out._metadata = type(meta)(("" if k == root else k[len(prefix):], v) for k, v in meta.items()
                                   if not prefix or k == root or k.startswith(prefix))
    return out


def _drop_graph_keys(tm, incompatible) -> None:
    """torch's load also walks tm's graph module, which gets no keys (the model's are loaded in
    TranslatedModule._load_from_state_dict): its tensors are no missing keys."""
    graph = tm.__dict__.get("_load_prefix", "") + "gm."
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not k.startswith(graph)]


def input_spec(gm):
    """Per graph input: None (not a tensor), or its sizes with None for a dynamic dim."""
    spec = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        spec.append([static_int(s) for s in v.shape] if isinstance(v, torch.Tensor) else None)
    return spec



@contextlib.contextmanager
def _tree_specs_shared(gm: torch.fx.GraphModule, memo: dict):
    """Within: a deep copy of gm shares its pytree specs (torch.export's in / out specs, on each graph module
    and in its graph's code generator). A TreeSpec is frozen, so sharing is exact; copying one built a fresh
    `LeafSpec`, whose constructor torch deprecates: every `copy.deepcopy(tm)` printed a FutureWarning. The
    module's specs go through `memo`; fx's Graph.__deepcopy__ copies its code generator without the memo, so
    the generator is given a `__deepcopy__` of its own (a shallow copy) for the length of the copy."""
    given = []
    for m in gm.modules():
        if not isinstance(m, torch.fx.GraphModule):
            continue
        for spec in (getattr(m, "_in_spec", None), getattr(m, "_out_spec", None)):
            if isinstance(spec, pytree.TreeSpec):
                memo[id(spec)] = spec
        cg = m.graph._codegen
        if getattr(cg, "pytree_info", None) is not None and "__deepcopy__" not in vars(cg):
            cg.__deepcopy__ = functools.partial(_shallow_codegen, cg)
            given.append(cg)
    try:
        yield
    finally:
        for cg in given:
            del vars(cg)["__deepcopy__"]


def _shallow_codegen(cg, _memo=None):
    new = copy.copy(cg)
    vars(new).pop("__deepcopy__", None)
    return new
