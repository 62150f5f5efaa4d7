"""Runs of the user's model in another floating dtype, without a second copy of its weights.

Verification judges a translation against a more exact run of the same model (docs/verification.md):
fp64 for an fp32 model, fp32 for a bf16 / fp16 one; and, for `precision="bf16"` / `"fp16"` on an
fp32 model, a run in that low precision tells how far plain rounding takes eager. `run_as(model,
inputs, dtype)` makes such a run:

- **Weights cast per module, on the fly.** A forward pre-hook on every module swaps its own
  floating parameters, buffers and plain tensor attributes (not its children's) for copies in
  `dtype`; the forward hook puts the originals back. At any moment only the weights of the
  modules on the call stack exist twice (one decoder layer's, not the model's), so the run costs
  about one layer of weights on top of the model, where a cast copy of the model cost its size in
  the new dtype (2x an fp32 model's bytes in fp64).
- **Convolutions and embeddings as in eager.** A conv or embedding module (`KEPT`) keeps its weights and runs on its input
  rounded to their dtype; its output is cast to `dtype` for what follows. Convolutions stay in
  PyTorch in every translation, so eager and the translation compute them alike, and a more exact
  conv would only cost memory: fp64 convolutions on CPU take im2col paths whose buffers are many
  times the activations. An embedding lookup is exact in any dtype; its table is the largest
  weight of an LLM.
- **Whole model where it must.** A module that reads another module's weights without calling it
  (a tied `F.linear(x, self.embed.weight)`), or a graph module (its `get_attr` nodes read every
  submodule's tensors), needs everything cast before it starts: the run is retried, or for a graph
  module made at once, with every module's tensors swapped for the length of the run (one cast
  copy, freed at the end).
- **Ops without a kernel in the truth's dtype.** `torch._grouped_mm` (HF's MoE experts, through
  `F.grouped_mm`) takes fp32 / bf16 / fp16 only: in an fp64 run `_Promote` computes it group by group
  with `torch.mm` (`_grouped_mm_wide`), so an MoE model has its fp64 truth like any other.
- **State.** A buffer the model writes in place (a KV cache filled with `index_copy_`, a step
  counter) is cast with the run, like every tensor, and written only in its copy: the model's own
  buffers are never touched (the originals go back untouched), so nothing needs restoring. The
  inputs are the caller's private copies, cast. State the forward itself creates with an explicit
  dtype (HF's static cache allocates its key / value tensors in the first forward) is created in
  the truth's dtype (`_Promote`: a dtype argument naming the model's precision names the truth's). A model that writes state held anywhere else (a
  tensor inside a plain Python object) fails in its own run with a dtype mismatch: `run_as` raises
  `CastRunError` naming it, and the caller states why that run was skipped. Graph modules print a
  traceback to stderr when their generated code raises: that print is kept out of a handled case.
"""

from __future__ import annotations

import contextlib
import io

import torch
import torch.utils._pytree as pytree


# modules that run in the model's own dtype in a per-module run: convolutions stay in PyTorch in every
# translation (DESIGN.md), so the translation computes them as eager does and a more exact run of them
# measures nothing the verdict uses; in fp64 CPU convolutions also leave oneDNN for im2col / col2im
# paths whose column buffers are many times the activations (9 GB for KernelBench L2/13 at its size)
# an embedding lookup rounds nothing: casting its whole table to gather a few rows (524 MB in fp64 for a
# 32 k x 2048 vocabulary) would be the run's largest allocation for no exactness
KEPT = (torch.nn.modules.conv._ConvNd, torch.nn.Embedding, torch.nn.EmbeddingBag)


_PAUSED: list = []  # the KEPT modules running now (translate() runs one model at a time: its lock)


class CastRunError(RuntimeError):
    """The model could not run in the other dtype (the message names why)."""


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _swap(mod: torch.nn.Module, dtype: torch.dtype) -> list:
    """Replace `mod`'s own floating tensors by copies in `dtype`; returns what to put back."""
    saved = []
    with torch.no_grad():
        for store in (mod._parameters, mod._buffers):
            for k, t in list(store.items()):
                if _floating(t) and t.dtype != dtype:
                    saved.append((store, k, t))
                    store[k] = t.detach().to(dtype)
        d = mod.__dict__
        for k, t in list(d.items()):
            if _floating(t) and t.dtype != dtype and not k.startswith("__"):
                saved.append((d, k, t))
                d[k] = t.detach().to(dtype)
    return saved


def _restore(saved: list) -> None:
    for store, k, t in reversed(saved):
        store[k] = t


@contextlib.contextmanager
def _per_module(model: torch.nn.Module, dtype: torch.dtype):
    stacks: dict = {}
    handles = []

    def pre(mod, _args):
        stacks.setdefault(id(mod), []).append(_swap(mod, dtype))

    def post(mod, _args, _out):
        _restore(stacks[id(mod)].pop())

    def pre_kept(mod, args):  # the module runs as in eager, on its input rounded to its weights' dtype
        w = next((t for t in mod.parameters(recurse=False) if t.is_floating_point()), None)
        _PAUSED.append(mod)  # _Promote must not widen this cast, nor anything inside the module
        return pytree.tree_map(lambda x: x.to(w.dtype) if w is not None and _floating(x) else x, args)

    def post_kept(_mod, _args, out):
        _PAUSED.pop()
        return pytree.tree_map(lambda x: x.to(dtype) if _floating(x) else x, out)

    try:
        for m in model.modules():
            if isinstance(m, KEPT):
                handles.append(m.register_forward_pre_hook(pre_kept))
                handles.append(m.register_forward_hook(post_kept))
                continue
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()
        for stack in stacks.values():  # a forward that raised before its hook ran
            while stack:
                _restore(stack.pop())
        _PAUSED.clear()


@contextlib.contextmanager
def _whole(model: torch.nn.Module, dtype: torch.dtype):
    saved = []
    try:
        for m in model.modules():
            saved.append(_swap(m, dtype))
        yield
    finally:
        for s in reversed(saved):
            _restore(s)


class _Promote(torch.overrides.TorchFunctionMode):
    """Within a truth run: a dtype argument naming the model's precision (`torch.zeros(..., dtype=
    torch.float32)`, `x.to(torch.bfloat16)`) names the truth's dtype instead, so state the model
    creates in its forward (HF's static cache allocates its key / value tensors there) is as exact as
    the rest of the run and can take what the run writes into it."""

    def __init__(self, narrow: tuple, dtype: torch.dtype):
        super().__init__()
        self.narrow, self.dtype = narrow, dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _PAUSED:  # inside a module kept in the model's dtype
            return func(*args, **(kwargs or {}))

        def up(x):
            return self.dtype if isinstance(x, torch.dtype) and x in self.narrow else x

        args = tuple(up(a) for a in args)
        kwargs = {k: up(v) for k, v in (kwargs or {}).items()}
        if func in _GROUPED_MM and self.dtype not in _GROUPED_MM_DTYPES:
            return _grouped_mm_wide(*args, **kwargs)
        return func(*args, **kwargs)


# the dtypes torch's own grouped GEMM takes (CPU and GPU): an fp64 truth of an MoE model (HF's experts call
# F.grouped_mm, i.e. torch._grouped_mm) computes it group by group with torch.mm instead
_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_GROUPED_MM = (torch._grouped_mm, torch.ops.aten._grouped_mm.default)  # a graph module calls the aten op


def _grouped_mm_wide(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm's math in any dtype, for the forms MoE forwards use: `mat_a` [M, K] with its rows
    in groups ending at `offs` times `mat_b` [G, K, N] (rows past `offs[-1]` give zeros), and [G, M, K] times
    [G, K, N] without `offs` (a batched GEMM). Other forms go to torch's op, whose error then names them."""
    if bias is None and mat_b.dim() == 3 and (mat_a.dim(), offs is None) in ((2, False), (3, True)):
        if mat_a.dim() == 3:
            out = torch.bmm(mat_a, mat_b)
        else:
            out = mat_a.new_zeros(mat_a.shape[0], mat_b.shape[2])
            start = 0
            for g, end in enumerate(offs.tolist()):
                out[start:end] = mat_a[start:end] @ mat_b[g]
                start = end
        return out if out_dtype is None else out.to(out_dtype)
    return torch._grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)


def _promoting(dtype: torch.dtype):
    """_Promote for a run in a wider dtype than the model's (fp64 over fp32, fp32 over bf16 / fp16); none
    for a run in a narrower one (a bf16 run of an fp32 model keeps the fp32 the model asks for)."""
    narrow = {torch.float64: (torch.float32, torch.bfloat16, torch.float16),
              torch.float32: (torch.bfloat16, torch.float16)}.get(dtype)
    return _Promote(narrow, dtype) if narrow else contextlib.nullcontext()


def _has_graph_module(model) -> bool:
    return any(isinstance(m, torch.fx.GraphModule) for m in model.modules())


def cast_inputs(inputs, dtype: torch.dtype):
    return pytree.tree_map(lambda x: x.detach().to(dtype) if _floating(x) else x, inputs)


def run_as(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype):
    """`model(*inputs)` with every floating weight, buffer and input in `dtype` (see the module
    docstring); the model is left exactly as it was. Raises CastRunError when it cannot run so."""
    modes = ([] if _has_graph_module(model) else [_per_module]) + [_whole]
    first = None
    for mode in modes:
        quiet = io.StringIO()
        try:
            with torch.no_grad(), mode(model, dtype), _promoting(dtype), contextlib.redirect_stderr(quiet):
                return model(*cast_inputs(inputs, dtype))
        except Exception as e:  # noqa: BLE001 — retried whole, then reported by the caller with its cause
            first = first or e
    msg = str(first).strip().splitlines()
    raise CastRunError(f"{type(first).__name__}: {msg[0][:300] if msg else ''}") from first


def wants_truth(output_dtypes, precision: str) -> torch.dtype | None:
    """The dtype of the truth run for these outputs: fp64 for fp32 outputs under precision fp32,
    fp32 where anything is low precision (fp32 is 2^16 times finer than bf16: exact enough, and it
    runs at fp32 speed)."""
    low = precision in ("bf16", "fp16") or any(d in (torch.bfloat16, torch.float16) for d in output_dtypes)
    return torch.float32 if low else torch.float64
