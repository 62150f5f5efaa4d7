"""Models split across ranks: what the translator takes, what it rewrites (DTensor), and what it refuses.

Taken (docs/moe.md, "rank by rank"): each rank's module holds its shard as ordinary tensors and its
collectives are torch.distributed's functional collectives (`funcol.all_reduce(out, "sum", group)` in a
forward hook, gpt-fast's tensor parallel; a loop over the rank's experts summed by an all_reduce, expert
parallel). The collectives stay in the rank's graph, on the process group (lowerings/by_design.py).

DTensor tensor parallel (`torch.distributed.tensor.parallel.parallelize_module`): on torch 2.13 neither
capture takes DTensor: torch.export stops at the parallel styles' input hook ("Expected all pytree.tree_leaves
of (args, kwargs) to be graphable types, but found non-fx-graphable type <class
'torch.distributed.tensor._dtensor_spec.DTensorSpec'>", the hook's DTensor.from_local), and fx.symbolic_trace
at the first mm of a plain tensor with a DTensor ("got mixed torch.Tensor and DTensor"). `localize` rewrites
what ColwiseParallel / RowwiseParallel compute on nn.Linear (default layouts, use_local_output, 1-D mesh) into
the taken form, on a copy: local shards as plain parameters, the styles' hooks dropped, a functional
all_reduce after each row-sharded linear (its replicated bias added after the sum). The styles are read
from their hooks: distribute_module's lambdas close over the mesh and a partial of the style's
`_prepare_input_fn(input_layouts, desired_input_layouts)` / `_prepare_output_fn(output_layouts,
use_local_output)`. Any other DTensor (another style or layout, a 2-D mesh, distribute_tensor by hand) is
refused by `check_no_dtensor` with the cause and the fix, which names torch.compile.

Under torch.compile(model, backend="flydsl") any DTensor model is taken as it is (`desugared`, as inductor
does): dynamo's graph reads DTensor parameters (no modules or hooks left to read), so the backend runs it
through AOT autograd (inference), whose subclass flattening traces DTensor's dispatch: the graph it hands over
is over this rank's local shards (and the unused device meshes), DTensor's redistributions in it as functional
collectives (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, each with its wait_tensor where DTensor
put it), the parameters among AOT's static inputs (frozen, as for any compiled graph). AOT's runtime wrapper
unwraps the DTensor inputs and rewraps DTensor outputs at each call. Two things differ from dynamo's own graph:
nn.Linear arrives decomposed, t + mm / addmm between views, each projection reading its own same-shape view of
the input, which `restore_linear` turns back into aten.linear over the input itself (so the sibling merge of q /
k / v and the gated MLP fire as on a localized copy: 8 FlyDSL calls a tutorial block instead of 12), and
F.scaled_dot_product_attention as the op the device picked (`_scaled_dot_product_flash_attention_for_cpu` here),
which `restore_sdpa` turns back into aten SDPA for the attention lowering. A RowwiseParallel bias shows up as
bias / world_size added on each rank before the all_reduce (what DTensor computes), folded once per shape.
Tested: the tutorial's Llama block with SequenceParallel norms (all_gather / reduce_scatter), ColwiseParallel /
RowwiseParallel blocks, and transformers' own TP styles (`apply_tensor_parallelism` with the config's
base_model_tp_plan) on a tiny Llama; not tested: a 2-D mesh (needs 4 ranks: none of the tests builds one).

transformers' own expert parallel (`apply_expert_parallelism`, from_pretrained with DistributedConfig(ep_size=W,
ep_implementation="all_reduce")): the experts modules hold DTensor Shard(0) weights and a forward closing over
AllReduceEP, whose all_reduce is in place inside an autograd Function. `localize` gives the copy the local
shards and `_ExpertParallelSum` (AllReduceEP's routing mask, the class forward, a functional all_reduce); the
MoE pattern takes the sentinel-masked grouped-mm form that follows (docs/moe.md). Compiled directly (no
`localize`), `desugared` hands over the same form with the in-place all_reduce functionalized and the experts'
`chunk` as `split`; the MoE rules take it too (tests/e2e/test_moe_ep_compile.py). Other EP implementations
(tokens exchanged by all_to_all) are refused, naming ep_implementation="all_reduce".
"""

from __future__ import annotations

import sys
import warnings

import torch

from .errors import InputError
from .graph import dims, shape_of

DTENSOR_FIX = (
    "shard the model with plain tensors instead: on each rank keep the local shard of each weight as an "
    "ordinary nn.Parameter (ColwiseParallel's rows of w1 / w3 / q / k / v, RowwiseParallel's columns of w2 / o: "
    "`param.to_local()` gives them) and add the row-sharded outputs over the ranks with "
    "torch.distributed._functional_collectives.all_reduce(out, 'sum', group) in a forward hook (gpt-fast's tensor "
    "parallel; models/_static_cache_decoder.shard does this); the all_reduce stays in each rank's graph, on the "
    "process group")


def is_dtensor(t) -> bool:
    mod = sys.modules.get("torch.distributed.tensor")  # a model holding DTensors has imported it
    return mod is not None and isinstance(t, mod.DTensor)


def check_no_dtensor(model: torch.nn.Module, inputs=()) -> None:
    """InputError naming the fix when a parameter, buffer or input is a DTensor (parallelize_module)."""
    named = [*model.named_parameters(), *model.named_buffers(), *((f"input {i}", x) for i, x in enumerate(inputs))]
    found = [n for n, t in named if is_dtensor(t)]
    if found:
        placements = getattr(dict(named)[found[0]], "placements", "")
        raise InputError(
            f"{found[0]} (and {len(found) - 1} more) is a DTensor {placements} (torch.distributed.tensor."
            f"parallel.parallelize_module): torch.export cannot capture DTensor in this torch (its parallel styles' "
            f"DTensor.from_local hooks are not graphable), so the rank's graph cannot be translated. Fix: "
            f"{DTENSOR_FIX}. translate() does this itself for ColwiseParallel / RowwiseParallel linears (default "
            f"layouts, 1-D mesh); for any other DTensor use, compile the model instead: torch.compile(model, "
            f"backend='flydsl') takes DTensor as it is (AOT autograd flattens it into this rank's local shards, "
            f"DTensor's redistributions as functional collectives)")


def _style_hooks(mod):
    """[(hooks dict, key, (style class name, hook kind, layout args), mesh)] of the hooks a parallel style's
    distribute_module put on `mod`: each closes over the mesh and a partial of the style's
    `_prepare_input_fn(input_layouts, desired_input_layouts)` / `_prepare_output_fn(output_layouts,
    use_local_output)`."""
    found = []
    for hooks in (mod._forward_pre_hooks, mod._forward_hooks):
        for key, fn in list(hooks.items()):
            cells = _cells(fn)
            part = next((c.cell_contents for n, c in cells.items() if n in ("input_fn", "output_fn")), None)
            qual = getattr(getattr(part, "func", None), "__qualname__", "").split(".")
            if "device_mesh" in cells and len(qual) == 2 and qual[1] in ("_prepare_input_fn", "_prepare_output_fn"):
                found.append((hooks, key, (qual[0], qual[1], tuple(part.args)), cells["device_mesh"].cell_contents))
    return found


def _local_style(found) -> str | None:
    """"col" / "row" for ColwiseParallel / RowwiseParallel with their default layouts (the hooks of one
    module, _style_hooks), else None."""
    from torch.distributed.tensor import Replicate, Shard

    styles = {f[2][0] for f in found}
    args = {f[2][1]: f[2][2] for f in found}
    if len(styles) != 1 or set(args) != {"_prepare_input_fn", "_prepare_output_fn"}:
        return None
    (style,), (inp, _), (out, use_local) = styles, args["_prepare_input_fn"], args["_prepare_output_fn"]
    if not use_local:
        return None
    if style == "ColwiseParallel" and inp == (Replicate(),) and out == (Shard(-1),):
        return "col"
    if style == "RowwiseParallel" and inp == (Shard(-1),) and out == (Replicate(),):
        return "row"
    return None


def localize(model: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """(model, notes): a model whose DTensor parameters come from ColwiseParallel / RowwiseParallel on
    nn.Linear modules over a 1-D mesh becomes a copy holding each rank's local shards as plain parameters,
    without the styles' hooks, a RowwiseParallel linear's output summed over the mesh by a functional
    all_reduce (its bias, replicated, added after the sum): what the styles compute, in a form torch.export
    captures. Any other DTensor use is refused (check_no_dtensor's error). The user's model is not changed."""
    import copy

    if not isinstance(model, torch.nn.Module) or "torch.distributed.tensor" not in sys.modules or not any(
            is_dtensor(t) for t in (*model.parameters(), *model.buffers())):
        return model, []
    plan = {}
    for name, mod in model.named_modules():
        hooks = _style_hooks(mod)
        own = [t for t in (*mod.parameters(recurse=False), *mod.buffers(recurse=False)) if is_dtensor(t)]
        if not hooks and not own:
            continue
        if _hf_all_reduce_ep(mod) is not None:
            plan[name] = "hf_ep"
            continue
        if getattr(mod, "_is_expert_parallel", False):
            cells = _cells(mod.__dict__.get("forward"))
            impl = type(cells["implementation"].cell_contents).__name__ if "implementation" in cells else "none"
            raise InputError(f"{name}: transformers expert parallel with the {impl} implementation over "
                             f"{getattr(getattr(mod, 'gate_up_proj', None), 'device_mesh', 'its mesh')}: translate() "
                             f"takes HF's all-reduce form (each rank runs its experts on the whole batch, an all_reduce "
                             f"sums them). Fix: DistributedConfig(..., ep_implementation=\"all_reduce\") with ep_size == "
                             f"tp_size, on a 1-D mesh")
        kind = _local_style(hooks)
        if kind is None or type(mod) is not torch.nn.Linear or hooks[0][3].ndim != 1:
            check_no_dtensor(model)  # raises, naming the parameter and the fix
        plan[name] = kind
    local = copy.deepcopy(model)
    for name, kind in plan.items():
        mod = local.get_submodule(name)
        if kind == "hf_ep":
            _localize_hf_ep(mod, _hf_all_reduce_ep(model.get_submodule(name)))
            continue
        mesh = _style_hooks(mod)[0][3]
        for hooks, key, _, _ in _style_hooks(mod):
            del hooks[key]
        for pname, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, pname, torch.nn.Parameter(p.to_local().detach().clone(), requires_grad=False))
        if kind == "row":
            bias = mod.bias
            mod.bias = None
            mod.register_forward_hook(_RowwiseSum(mesh.get_group(), bias))
    check_no_dtensor(local)
    n_ep = sum(k == "hf_ep" for k in plan.values())
    notes = [f"DTensor tensor parallel ({len(plan) - n_ep} ColwiseParallel / RowwiseParallel linears): translated as "
             "this rank's local shards with a functional all_reduce after each RowwiseParallel linear (what "
             "the styles compute)"] if len(plan) > n_ep else []
    if n_ep:
        notes.append(f"HF expert parallel ({n_ep} experts modules, ep_implementation all_reduce): translated as this "
                     "rank's experts (local shards) on the routes to them, the others masked, and a functional "
                     "all_reduce of the experts' output (what HF's AllReduceEP computes)")
    return local, notes


def _hf_all_reduce_ep(mod):
    """HF's expert-parallel implementation on experts module `mod` when it is transformers' AllReduceEP (or AutoEP
    running it) over a 1-D mesh with the experts' parameters Shard(0), else None. transformers'
    `apply_expert_parallelism` (from_pretrained with DistributedConfig(ep_size=W, ep_implementation="all_reduce"))
    replaces the module's forward by a closure over the implementation, which holds the mesh."""
    from torch.distributed.tensor import Shard

    cells = _cells(mod.__dict__.get("forward"))
    if not getattr(mod, "_is_expert_parallel", False):
        return None
    impl = cells["implementation"].cell_contents if "implementation" in cells else None
    if type(impl).__name__ == "AutoEP":
        impl = getattr(impl, "all_reduce", None)
    if type(impl).__name__ != "AllReduceEP" or not type(impl).__module__.startswith("transformers.") or \
            impl.ep_mesh.ndim != 1 or impl.num_local_experts != getattr(mod, "num_experts", None):
        return None
    own = [p for p in mod.parameters(recurse=False) if is_dtensor(p)]
    return impl if own and all(tuple(p.placements) == (Shard(0),) for p in own) else None


def _cells(fn) -> dict:
    """The closure of function `fn` by free variable name ({} for anything else)."""
    return dict(zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()), getattr(fn, "__closure__", None) or ()))


def _localize_hf_ep(mod, impl) -> None:
    """The experts module `mod` (a copy) holds its local experts as plain parameters and runs HF's class forward
    (its experts implementation, e.g. grouped_mm) inside _ExpertParallelSum, which routes, masks and sums as
    AllReduceEP does, with a functional all_reduce."""
    for pname, p in list(mod.named_parameters(recurse=False)):
        if is_dtensor(p):
            setattr(mod, pname, torch.nn.Parameter(p.to_local().detach().clone(), requires_grad=False))
    del mod.forward  # HF's ep_forward closure (over the user's module): the class forward again
    mod.forward = _ExpertParallelSum(mod, impl.ep_mesh.get_local_rank(), impl.ep_mesh.get_group())


class _ExpertParallelSum:
    """HF AllReduceEP's forward, traceable: global expert ids -> local ids (other ranks' experts get the sentinel
    id num_experts and weight 0), the experts' own forward, the outputs summed over the group."""

    def __init__(self, mod, rank: int, group):
        self.forward, self.rank, self.group = type(mod).forward.__get__(mod), rank, group

    def __call__(self, hidden_states, top_k_index, top_k_weights):
        from torch.distributed import _functional_collectives as funcol

        n = self.forward.__self__.num_experts
        off_rank = (top_k_index // n) != self.rank
        local_index = torch.where(off_rank, n, top_k_index % n)
        out = self.forward(hidden_states, local_index, top_k_weights.masked_fill(off_rank, 0.0))
        return funcol.all_reduce(out, "sum", self.group).to(hidden_states.dtype)


class _RowwiseSum:
    """Forward hook: the partial products of a row-sharded linear summed over the group, then its bias."""

    def __init__(self, group, bias):
        self.group, self.bias = group, bias

    def __call__(self, _mod, _inp, out):
        from torch.distributed import _functional_collectives as funcol

        out = funcol.all_reduce(out, "sum", self.group)
        return out if self.bias is None else out + self.bias


def desugared(gm, example_inputs, rec, make_runner, strict: bool = False):
    """dynamo's graph `gm` over DTensor inputs, run through AOT autograd (inference, as inductor does): its
    subclass flattening hands `inference` the graph over the local shards, DTensor's redistributions in it as
    functional collectives, and unwraps / rewraps the DTensors at each call. `make_runner(graph, real inputs,
    weight input indices)` serves that graph on its first call (AOT's static inputs: the parameters and
    buffers, frozen). When AOT autograd cannot take the graph, it runs as dynamo gave it, the reason on `rec`
    (strict: that InputError is raised)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import TracingContext

    def inference(fgm, _fake_inputs):
        meta = getattr(TracingContext.try_get(), "fw_metadata", None)
        weights = set(getattr(meta, "static_input_indices", None) or ())
        rec.desugared, rec.sdpa_restored = True, restore_sdpa(fgm)
        rec.linears_restored = restore_linear(fgm, weights)
        drop_same_layout_copies(fgm)
        runner = None

        def run(*args):
            nonlocal runner
            if runner is None:  # translated on the first call, with the real local shards
                runner = make_runner(fgm, list(args), weights)
            return runner(*args)

        return run

    try:
        with torch.no_grad():  # an inference graph (the translation serves no backward)
            return aot_autograd(fw_compiler=inference, inference_compiler=inference,
                                keep_inference_input_mutations=True)(gm, example_inputs)
    except Exception as e:  # noqa: BLE001 — dynamo's graph still runs, in PyTorch, and says why
        first = (str(e).strip().splitlines() or [""])[0][:300]
        rec.fallback_reason = (f"InputError: AOT autograd could not flatten this graph's DTensor inputs into local "
                               f"shards ({type(e).__name__}: {first}); it runs in PyTorch. Fix: compile "
                               f"`translator.distributed.localize(model)[0]` (ColwiseParallel / RowwiseParallel "
                               f"linears on a 1-D mesh)")
        if strict:
            raise InputError(rec.fallback_reason.removeprefix("InputError: ")) from e
        warnings.warn(f"flydsl backend: {rec.name} runs in PyTorch as dynamo captured it: {rec.fallback_reason}",
                      stacklevel=3)

        def as_given(*args):
            rec.calls_pytorch += 1
            return gm(*args)

        return as_given


# AOT autograd lowers F.scaled_dot_product_attention to the backend op the device picks; its output 0 is SDPA's
_SDPA_FORMS = {  # op name -> positions of (dropout_p, is_causal) in its args, and its attn_mask argument
    "_scaled_dot_product_flash_attention_for_cpu": (3, 4, "attn_mask"),
    "_scaled_dot_product_flash_attention": (3, 4, None),
    "_scaled_dot_product_efficient_attention": (5, 6, 3),
}


def restore_sdpa(gm) -> int:
    """aten.scaled_dot_product_attention again in place of the device-specific op AOT autograd traced it to
    (`_scaled_dot_product_flash_attention_for_cpu` on CPU, flash / efficient on a GPU) where only the attention
    output (item 0) is read: the attention lowering takes SDPA. Returns how many were restored."""
    import operator

    aten = torch.ops.aten
    n_done = 0
    for n in list(gm.graph.nodes):
        name = getattr(getattr(n.target, "_overloadpacket", None), "__name__", "")
        form = _SDPA_FORMS.get(name)
        if n.op != "call_function" or form is None or n.target._overloadname != "default":
            continue  # (flash's "quantized" overload takes fp8 descales: not SDPA's math)
        if not all(u.target is operator.getitem and u.args[1] == 0 for u in n.users):
            continue
        schema = n.target._schema.arguments
        args = {a.name: (n.args[i] if i < len(n.args) else n.kwargs.get(a.name, a.default_value))
                for i, a in enumerate(schema)}
        drop, causal, mask = form
        if args.get("return_debug_mask"):
            continue
        q, k = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in n.args[:2])
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
            continue
        kwargs = {"attn_mask": args[schema[mask].name] if isinstance(mask, int) else args.get(mask) if mask else None,
                  "dropout_p": args[schema[drop].name], "is_causal": args[schema[causal].name],
                  "scale": args.get("scale"), "enable_gqa": q.shape[-3] != k.shape[-3]}  # the device ops take GQA as is
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(aten.scaled_dot_product_attention.default, tuple(n.args[:3]), kwargs)
        new.meta = {k: v for k, v in n.meta.items() if k != "val"}
        if "val" in n.meta:
            new.meta["val"] = n.meta["val"][0]
        for u in list(n.users):
            u.replace_all_uses_with(new)
            gm.graph.erase_node(u)
        gm.graph.erase_node(n)
        n_done += 1
    if n_done:
        gm.recompile()
    return n_done


_VIEWS = ("view", "_unsafe_view", "reshape")


def _view_of(n):
    """The input of a view / _unsafe_view / reshape node `n`, else None."""
    name = getattr(getattr(n.target, "_overloadpacket", None), "__name__", "")
    return n.args[0] if n.op == "call_function" and name in _VIEWS and isinstance(n.args[0], torch.fx.Node) else None


def _dims(n) -> list[str] | None:
    return dims(shape_of(n)) if isinstance(n, torch.fx.Node) else None


def restore_linear(gm, weights=()) -> int:
    """aten.linear again where AOT autograd decomposed nn.Linear: ``mm(x2, t(W))`` / ``addmm(b, x2, t(W))``
    of a weight input W (placeholder index in `weights`, AOT's static inputs), and around it, for an input of
    more than 2 dims, ``x2 = view(x, [M, K])`` and ``view / _unsafe_view(.., [*x.shape[:-1], N])`` (what
    linear's own decomposition writes). Each projection's input also comes as its own same-shape ``view`` of x
    (DTensor's to_local); those are x. Every GEMM rule (the sibling merge in lowerings/qkv.py, the gated MLP,
    the fp8 forms, epilogues) matches aten.linear: one form, restored here once, instead of a second pattern
    per rule. Returns how many linears were restored."""
    aten = torch.ops.aten
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    wnodes = {phs[i] for i in weights if i < len(phs)}
    n_done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in (aten.mm.default, aten.addmm.default) or n.kwargs:
            continue
        bias, a, wt = (None, *n.args) if n.target is aten.mm.default else n.args[:3]
        if n.target is aten.addmm.default and (len(n.args) > 3 or _dims(bias) is None or len(_dims(bias)) != 1):
            continue  # beta / alpha given, or not a per-column bias
        if not (isinstance(wt, torch.fx.Node) and wt.op == "call_function" and wt.target is aten.t.default
                and wt.args[0] in wnodes and len(_dims(wt.args[0]) or ()) == 2):
            continue
        x, out, chain = a, n, [a]
        x3, wd = _view_of(a), _dims(wt.args[0])
        users = list(n.users)
        if x3 is not None and len(users) == 1 and _view_of(users[0]) is n:
            xd, od = _dims(x3), _dims(users[0])
            if xd and od and len(xd) > 2 and xd[:-1] == od[:-1] and xd[-1] == wd[1] and od[-1] == wd[0]:
                x, out = x3, users[0]
        while _view_of(x) is not None and _dims(x) == _dims(_view_of(x)):  # a same-shape view is its input
            chain.append(x)
            x = _view_of(x)
        with gm.graph.inserting_before(out):
            new = gm.graph.call_function(aten.linear.default, (x, wt.args[0]) + ((bias,) if bias is not None else ()))
        new.meta = dict(out.meta)
        out.replace_all_uses_with(new)
        for dead in dict.fromkeys((out, n, wt, *chain)):  # (a view chain read by nothing else)
            if not dead.users and dead.op == "call_function" and dead is not x:
                gm.graph.erase_node(dead)
        n_done += 1
    if n_done:
        gm.recompile()
    return n_done


def drop_same_layout_copies(gm) -> int:
    """`aten.copy(dst, src)` whose src has dst's shape, strides, dtype and device is src: functionalization
    writes an in-place collective on a local output (transformers' RowwiseParallel: `dist.all_reduce(out)`) as
    all_reduce, wait_tensor, then this copy back into `out`'s layout, a copy that moves bytes and computes
    nothing. Returns how many were dropped."""
    aten = torch.ops.aten
    n_done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.copy.default or len(n.args) != 2 or n.kwargs:
            continue
        dst, src = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in n.args)
        if not (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor)) or \
                (dst.shape, dst.stride(), dst.dtype, dst.device) != (src.shape, src.stride(), src.dtype, src.device):
            continue
        n.replace_all_uses_with(n.args[1])
        gm.graph.erase_node(n)
        n_done += 1
    if n_done:
        gm.recompile()
    return n_done
