"""Models split across ranks: what the translator takes, and the one form it refuses.

Taken (docs/moe.md, "rank by rank"): each rank's module holds its shard as ordinary tensors and its
collectives are torch.distributed's functional collectives (`funcol.all_reduce(out, "sum", group)` in a
forward hook, gpt-fast's tensor parallel; a loop over the rank's experts summed by an all_reduce, expert
parallel). The collectives stay in the rank's graph, on the process group (lowerings/by_design.py).

Refused: DTensor parameters (`torch.distributed.tensor.parallel.parallelize_module` with ColwiseParallel /
RowwiseParallel). On torch 2.13 neither capture takes them: torch.export stops at the parallel styles'
input hook ("Expected all pytree.tree_leaves of (args, kwargs) to be graphable types, but found
non-fx-graphable type <class 'torch.distributed.tensor._dtensor_spec.DTensorSpec'>", the hook's
DTensor.from_local), and fx.symbolic_trace at the first mm of a plain tensor with a DTensor ("got mixed
torch.Tensor and DTensor"). Under torch.compile dynamo does trace DTensor, but the graph it hands over
reads DTensor parameters, which translate() captures with torch.export again (same error). Rather than
three capture failures, `check_no_dtensor` names the cause and the fix: hold the local shards as plain
parameters and sum with a functional all_reduce (what ColwiseParallel / RowwiseParallel compute:
column-sharded weights need no collective, a row-sharded linear's output is all_reduced), as
models/_static_cache_decoder.shard does. Under torch.compile the graph then runs as dynamo gave it, in
PyTorch, and its record carries this reason.
"""

from __future__ import annotations

import sys

import torch

from .errors import InputError

DTENSOR_FIX = (
    "shard the model with plain tensors instead: on each rank keep the local shard of each weight as an "
    "ordinary nn.Parameter (ColwiseParallel's rows of w1 / w3 / q / k / v, RowwiseParallel's columns of w2 / o: "
    "`param.to_local()` gives them) and add the row-sharded outputs over the ranks with "
    "torch.distributed._functional_collectives.all_reduce(out, 'sum', group) in a forward hook (gpt-fast's tensor "
    "parallel; models/_static_cache_decoder.shard does this); the all_reduce stays in each rank's graph, on the "
    "process group")


def _is_dtensor(t) -> bool:
    mod = sys.modules.get("torch.distributed.tensor")  # a model holding DTensors has imported it
    return mod is not None and isinstance(t, mod.DTensor)


def check_no_dtensor(model: torch.nn.Module, inputs=()) -> None:
    """InputError naming the fix when a parameter, buffer or input is a DTensor (parallelize_module)."""
    named = [*model.named_parameters(), *model.named_buffers(), *((f"input {i}", x) for i, x in enumerate(inputs))]
    found = [n for n, t in named if _is_dtensor(t)]
    if found:
        placements = getattr(dict(named)[found[0]], "placements", "")
        raise InputError(
            f"{found[0]} (and {len(found) - 1} more) is a DTensor {placements} (torch.distributed.tensor."
            f"parallel.parallelize_module): torch.export cannot capture DTensor in this torch (its parallel styles' "
            f"DTensor.from_local hooks are not graphable), so the rank's graph cannot be translated. Fix: "
            f"{DTENSOR_FIX}")
