"""Capture: nn.Module + example inputs -> torch.fx.GraphModule with fake-tensor metadata.

`torch.export.export` without core-aten decomposition keeps aten.linear,
aten.scaled_dot_product_attention, aten.layer_norm, aten.softmax, aten.matmul, aten.gelu as
single nodes. Every input dim is first offered as dynamic (`Dim.AUTO`): export keeps the
dims the model allows to vary (batch, sequence) symbolic and specializes the rest; if that
fails the capture is retried with static shapes, then with `torch.fx.symbolic_trace`
(whose nodes get metadata from a ShapeProp run). Each step that fails is recorded.

A capture with dynamic dims can still fail later, in a pass: some op's fake implementation cannot
run on symbolic sizes (HF RWKV's `ZeroPad2d((0, 0, 1, -1))` time shift, a constant_pad_nd that
crops: "Cannot call storage_offset() on tensor with symbolic sizes/strides"). `lower_with_retry`
then captures again with static shapes, runs the passes once more and says so in the capture
notes (the translation serves the example shapes only). An unexpected error of a static capture's
passes is a translator bug: an InternalError naming it, never a bare RuntimeError.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging

from dataclasses import dataclass, field

import torch
from torch.export import Dim

from .errors import CaptureError, DeviceError, EmptyInputError, InputError, InternalError, TranslatorError
from .graph import static_int
from .state import own_mutable_state


@dataclass
class Captured:
    gm: torch.fx.GraphModule
    method: str  # "torch.export (dynamic dims)" | "torch.export (static)" | "torch.fx.symbolic_trace"
    notes: list = field(default_factory=list)
    dynamic_dims: list = field(default_factory=list)  # [(input index, dim)] captured as dynamic


def check_inputs(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (list, tuple)):
        raise InputError(
            f"example_inputs must be a tuple or list of tensors, got {type(example_inputs).__name__}; "
            "pass e.g. (torch.randn(2, 16),)"
        )
    for i, x in enumerate(example_inputs):
        if not isinstance(x, (torch.Tensor, int, float, bool)) and x is not None:
            raise InputError(
                f"example input {i} is a {type(x).__name__}; only tensors and Python scalars are supported "
                "as positional inputs"
            )
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            raise DeviceError(
                f"example input {i} is on the meta device (shape {list(x.shape)}, no data): translate() runs the "
                f"model on its example inputs to verify the translation, so pass real tensors, e.g. "
                f"torch.randn({', '.join(map(str, x.shape))}, dtype={x.dtype})")
        if isinstance(x, torch.Tensor) and x.numel() == 0 and x.dim():
            d = list(x.shape).index(0)
            raise EmptyInputError(
                f"example input {i} has size 0 in dim {d} (shape {list(x.shape)}): torch.export fixes a size-0 dim, "
                f"so the translation would serve only empty inputs, and no kernel can be checked on no data; give "
                f"an example with at least 2 there (batch and sequence dims stay dynamic, so other sizes work)")
    return tuple(example_inputs)


def check_model(model: torch.nn.Module) -> None:
    """A model whose weights are not materialized (meta device) cannot run: say how to load them. DTensor
    weights (parallelize_module) cannot be captured: say how to shard instead (translator.distributed)."""
    from .distributed import check_no_dtensor

    check_no_dtensor(model)
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    if meta:
        raise DeviceError(
            f"the model's {meta[0]} (and {len(meta) - 1} more) is on the meta device, without data: load its "
            "weights first (model.to_empty(device='cpu') then model.load_state_dict(...), or build it on the CPU)")


def default_dynamic_dims(x: torch.Tensor) -> list[int]:
    """Which dims of an example input to offer as dynamic: batch and sequence.

    dim 0 always (batch); token ids [B, T] (integer) also dim 1; float activations of rank >= 3
    ([B, T, C], [B, H, T, D], [B, C, H, W]) also dim -2 (sequence / rows). Feature, head and
    head_dim sizes stay static, so kernels specialize on them. torch.export keeps a dim
    static anyway when the model constrains it (or when its example size is 0 or 1).
    """
    if x.dim() == 0:
        return []
    dims = {0}
    if x.dim() == 2 and not x.is_floating_point():
        dims.add(1)
    if x.dim() >= 3:
        dims.add(x.dim() - 2)
    return sorted(d for d in dims if x.shape[d] > 1)  # export fixes sizes 0 and 1 anyway


def capture(model: torch.nn.Module, inputs: tuple, dynamic_shapes="auto") -> Captured:
    """`dynamic_shapes`: "auto" (batch / sequence dims, see default_dynamic_dims), None (all
    static), or a torch.export dynamic_shapes spec passed through as given."""
    notes = []
    if isinstance(dynamic_shapes, str) and dynamic_shapes == "auto":
        dyn = _bind_to_signature(model, tuple({d: Dim.AUTO for d in default_dynamic_dims(x)}
                                              if isinstance(x, torch.Tensor) else None for x in inputs))
    else:
        dyn = dynamic_shapes
    attempts = [("torch.export (dynamic dims)", dyn), ("torch.export (static)", None)] if dyn is not None else \
        [("torch.export (static)", None)]
    for label, shapes in attempts:
        try:
            # under no_grad: inference graphs, and @torch.no_grad() helpers (HF rotary embeddings)
            # are inlined instead of kept as a set_grad_enabled higher-order op
            with _quiet_export(), torch.no_grad():
                ep = torch.export.export(model, inputs, dynamic_shapes=shapes, strict=False)
            gm = ep.module()  # holds the user's own tensors: the ones the graph writes are copied
            own_mutable_state(gm)
            _tag(gm)
            dims = _dynamic_dims(gm)
            return Captured(gm, label, notes, dims)
        except Exception as e:  # noqa: BLE001 — every failure is recorded and the next method tried
            notes.append(f"{label} failed: {type(e).__name__}: {_first_line(e)}")
    try:
        # symbolic_trace's GraphModule holds the traced model's own submodules: trace a private
        # copy, so that no later pass (cleanup deletes the parameters no node reads) can touch
        # the user's model
        gm = torch.fx.symbolic_trace(copy.deepcopy(model))
        _linear_modules_to_aten(gm)
        from torch.fx.passes.shape_prop import ShapeProp
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        ShapeProp(gm, fake_mode=mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                                  for x in inputs])
        for n in gm.graph.nodes:
            tm = n.meta.get("tensor_meta")
            if tm is not None and "val" not in n.meta:
                with mode:  # fake tensors, as torch.export's metadata: passes find the fake mode there
                    n.meta["val"] = torch.empty_strided(tm.shape, tm.stride, dtype=tm.dtype)
        _tag(gm)
        return Captured(gm, "torch.fx.symbolic_trace", notes, [])
    except Exception as e:  # noqa: BLE001
        notes.append(f"torch.fx.symbolic_trace failed: {type(e).__name__}: {_first_line(e)}")
    hint = MOE_LOOP_HINT if any("data-dependent" in n for n in notes) else ""
    raise CaptureError("could not capture the model:\n  " + "\n  ".join(notes) + hint)


MOE_LOOP_HINT = (  # the common cause: an experts loop that skips empty experts (translator/lowerings/moe.py)
    "\nThe model branches on a data-dependent value, such as `if tok.numel() == 0: continue` in a loop over "
    "experts after `tok, slot = torch.where(top_idx == e)`. Remove the branch: `out.index_add_(0, tok, "
    "expert(x[tok]) * w[tok, slot, None])` adds nothing for an empty `tok`, and without the branch the "
    "translator takes the whole loop as one MoE layer (flydsl.moe_experts, docs/moe.md). Any other such branch: "
    "compute both sides and pick with torch.where. A transformers MoE model: keep its experts on "
    "`config._experts_implementation = \"grouped_mm\"` (transformers 5's default), which is matched as well.")


def lower_with_retry(model, inputs: tuple, cap: Captured, lower):
    """(capture, lower(capture)): `lower` runs the passes on a capture; an unexpected error on a
    capture with dynamic dims is retried once on a static capture (noted), else an InternalError."""
    try:
        return cap, lower(cap)
    except TranslatorError:
        raise
    except Exception as e:  # noqa: BLE001 — a pass failing on symbolic sizes: static shapes are the fix
        cause = f"{type(e).__name__}: {_first_line(e)}"
        if not cap.dynamic_dims:
            raise InternalError(f"translating the model failed inside the translator's passes ({cause}); this is a "
                                f"translator bug: please report it with the model") from e
    static = capture(model, inputs, None)
    static.notes[:0] = cap.notes + [
        f"the capture with dynamic dims failed in the passes ({cause}); captured again with static shapes: this "
        f"translation serves only the example inputs' shapes (translate again for other shapes)"]
    try:
        return static, lower(static)
    except TranslatorError:
        raise
    except Exception as e:  # noqa: BLE001
        raise InternalError(f"translating the model failed inside the translator's passes, with dynamic dims and "
                            f"with static shapes ({type(e).__name__}: {_first_line(e)}); this is a translator bug: "
                            f"please report it with the model") from e


def _linear_modules_to_aten(gm: torch.fx.GraphModule) -> int:
    """symbolic_trace keeps `nn.Linear` as a `call_module` node, which no lowering matches:
    rewrite each into `aten.linear(x, weight, bias)` reading the (copied) module's parameters,
    the form torch.export gives, so the fallback capture lowers linears too."""
    aten = torch.ops.aten
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_module" or type(gm.get_submodule(n.target)) is not torch.nn.Linear or n.kwargs:
            continue
        lin = gm.get_submodule(n.target)
        with gm.graph.inserting_before(n):
            w = gm.graph.get_attr(f"{n.target}.weight")
            b = gm.graph.get_attr(f"{n.target}.bias") if lin.bias is not None else None
            new = gm.graph.call_function(aten.linear.default, (n.args[0], w, b))
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done


def _bind_to_signature(model, specs: tuple) -> tuple:
    """torch.export matches dynamic_shapes to forward's parameters: a `forward(self, *args)` (the HF
    wrapper, translator.adapters.hf) takes the specs of the inputs it collects as one tuple. Without
    this, export refused the per-input specs and every HF model was captured with static shapes (one
    batch size and sequence length)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return specs
    out = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return (*out, specs[len(out):])
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or len(out) == len(specs):
            break
        out.append(specs[len(out)])
    return specs


@contextlib.contextmanager
def _quiet_export():
    """torch.export logs a warning for every dim it specializes; the report states the dims."""
    loggers = [logging.getLogger(n) for n in ("torch._export", "torch.export", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _tag(gm):
    """Remember every node's captured name: the report and verification key on it."""
    for n in gm.graph.nodes:
        n.meta["orig_name"] = n.name


def _dynamic_dims(gm):
    out = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            out += [(i, d) for d, s in enumerate(v.shape) if static_int(s) is None]
    return out


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""
