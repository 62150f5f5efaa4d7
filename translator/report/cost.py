"""Our per-op cost model: FLOPs and HBM bytes of every captured node, and a roofline time.

torch.utils.flop_counter counts only matmul, convolution and attention, so a model made of
elementwise ops, norms, softmax and reductions shows 0 FLOPs there. We count every op:

- matmul / conv / attention: torch's FlopCounter (2 per multiply-add), plus SDPA's two
  products where CPU torch runs SDPA's math path, which the counter does not see;
- pointwise ops (aten's `pointwise` tag): 1 FLOP per output element, a transcendental
  included, as peer coverage reports count them;
- reductions and scans: 1 per input element (var / std: 3; logsumexp: 3);
- softmax / log_softmax: 5 per element (max, subtract, exp, sum, divide);
- layer / group / batch / instance norm: 7 per element; rms_norm: 4;
- losses: 3 per input element (difference, transform, reduce);
- views (an output that aliases an input, per the op's schema) and shape arithmetic: 0.

Bytes are the op-by-op traffic model: every non-view op reads each tensor input once and
writes each output once (no cache between ops), as eager PyTorch runs. A fused FlyDSL op is
counted from its own inputs and outputs, so the intermediates it keeps on chip are not.

`kernel_time` is a roofline MODEL, not a measurement: max(bytes / HBM bandwidth, FLOPs /
peak) on MI300X (gfx942) and MI355X (gfx950), vendor dense peaks; bench/roofline.py uses
the same table.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from translator_kernels.arch import FLOAT_NAMES, GPUS as ARCH_GPUS

aten = torch.ops.aten

# the roofline's view of translator_kernels.arch.GPUS (the one table of hardware facts)
GPUS = {a: dict(name=g.gpu, bw=g.hbm_bytes_per_s, peak={dt: g.peak_flops(dt) for dt in FLOAT_NAMES.values()})
        for a, g in ARCH_GPUS.items()}
NEED_WAVES = {"memory": 4, "compute": 2}
_DT = FLOAT_NAMES

# FLOPs per element for ops that are neither pointwise-tagged nor counted by FlopCounter
PER_ELEMENT = {
    "softmax": 5, "_softmax": 5, "log_softmax": 5, "_log_softmax": 5, "safe_softmax": 5, "_safe_softmax": 5,
    "layer_norm": 7, "native_layer_norm": 7, "group_norm": 7, "native_group_norm": 7, "batch_norm": 7,
    "_native_batch_norm_legit_no_training": 7, "instance_norm": 7, "rms_norm": 4, "_fused_rms_norm": 4,
    "var": 3, "std": 3, "var_mean": 3, "std_mean": 3, "logsumexp": 3, "norm": 2, "linalg_vector_norm": 2,
    "cumsum": 1, "cumprod": 1, "cummax": 1, "cummin": 1, "logcumsumexp": 3,
    "mse_loss": 3, "l1_loss": 3, "smooth_l1_loss": 3, "huber_loss": 3, "kl_div": 3, "cross_entropy_loss": 3,
    "nll_loss": 1, "nll_loss_forward": 1, "binary_cross_entropy": 3, "binary_cross_entropy_with_logits": 3,
    "hinge_embedding_loss": 3, "triplet_margin_loss": 3, "soft_margin_loss": 3, "cosine_similarity": 3,
}
# shape-only ops that copy data or return scalars (no arithmetic, no alias annotation)
NO_ARITHMETIC = {
    "clone", "contiguous", "_to_copy", "to", "copy", "cat", "stack", "repeat", "index_select", "gather",
    "embedding", "arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "scalar_tensor", "tril", "triu", "sym_size", "lift_fresh_copy", "dropout", "constant_pad_nd", "pad",
    "flip", "roll", "index", "scatter", "masked_fill", "fill", "new_zeros", "new_ones", "new_full", "new_empty",
    "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_guards_fn", "type_as",
}


def tensors(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in tensors(x)]
    return []


def numel(t) -> int:
    """Element count; a symbolic (dynamic) size counts at its example value. `int()` of a SymInt
    would specialize the captured graph's dynamic dims, so the hint is read instead."""
    n = t.numel()
    if not isinstance(n, torch.SymInt):
        return int(n)
    hint = n.node.hint
    return 0 if hint is None else int(hint)  # None: a data-dependent size (`x[x > 0]`), unknown before a run



def nbytes(t) -> int:
    return numel(t) * t.element_size()


def short_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target)).split(".")[0]


def is_view(target) -> bool:
    """An op whose output aliases its input (schema `Tensor(a) -> Tensor(a)`), or shape arithmetic."""
    name = short_name(target)
    if isinstance(target, torch._ops.OpOverload):
        return name.startswith("sym_") or any(r.alias_info is not None and not r.alias_info.is_write
                                              for r in target._schema.returns)
    return name.startswith("sym_") or getattr(target, "__module__", "") in ("_operator", "operator", "math",
                                                                          "torch.sym") or name == "getitem"


def model_flops(target, args, out) -> int:
    """Our count for ops FlopCounter does not see (0 for views and data movement)."""
    if is_view(target):
        return 0
    name = short_name(target)
    if name in NO_ARITHMETIC:
        return 0
    ins = tensors(args)
    if name in PER_ELEMENT:
        return PER_ELEMENT[name] * (max(numel(t) for t in ins) if ins else 0)
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        return sum(numel(t) for t in tensors(out))
    if torch.Tag.reduction in tags or name.startswith(("sum", "mean", "amax", "amin", "max", "min", "prod",
                                                           "argmax", "argmin", "any", "all")):
        return numel(ins[0]) if ins else 0
    return 0


def node_bytes(node, env=None) -> int:
    """HBM bytes of one node under the op-by-op model (0 for views and shape arithmetic). env: the
    real values of a run (node -> value), read instead of the fake ones: a data-dependent size
    (`x[x > 0]`) has no example value in the metadata, and counts 0 without a run."""
    out = tensors(env[node] if env and node in env else node.meta.get("val"))
    if node.op != "call_function" or is_view(node.target) or not out:
        return 0
    seen, total = set(), 0
    for a in node.all_input_nodes:
        for t in tensors(env[a] if env and a in env else a.meta.get("val")):
            if id(t) not in seen:
                seen.add(id(t))
                total += nbytes(t)
    return total + sum(nbytes(t) for t in out)


def node_flops(node) -> int:
    """Our model's FLOPs for a node from its fake values (for nodes created by the passes)."""
    if node.op != "call_function":
        return 0
    args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    try:
        return model_flops(node.target, args, node.meta.get("val"))
    except Exception:  # noqa: BLE001 — a node whose values are not tensors costs nothing here
        return 0


def measure(gm: torch.fx.GraphModule, flat_inputs) -> dict:
    """{captured node name: (FLOPs, bytes)} on the example inputs, per the model above."""
    costs = {}

    class Count(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op != "call_function":
                return super().run_node(n)
            with FlopCounterMode(display=False) as fc:
                v = super().run_node(n)
            f = fc.get_total_flops()
            if not f and n.target is aten.scaled_dot_product_attention.default:
                f = _sdpa_flops(self.env[n.args[0]], self.env[n.args[1]], self.env[n.args[2]])
            if not f:
                args = [self.env.get(a, a) if isinstance(a, torch.fx.Node) else a for a in n.args]
                f = model_flops(n.target, args, v)
            self.env[n] = v  # node_bytes reads the real values (exact for data-dependent sizes)
            costs[n.meta.get("orig_name", n.name)] = (int(f), node_bytes(n, self.env))
            return v

    with torch.no_grad():
        Count(gm).run(*flat_inputs)
    return costs


def measure_flops(gm: torch.fx.GraphModule, flat_inputs) -> dict:
    """{captured node name: FLOPs} per our model (see `measure`)."""
    return {k: f for k, (f, _b) in measure(gm, flat_inputs).items()}


def _sdpa_flops(q, k, v) -> int:
    """Q·Kᵀ and P·V (2 FLOPs a multiply-add each): what flop_counter counts for the fused SDPA
    kernels, which it does not see when CPU torch runs SDPA's math path."""
    b = q.shape[:-2].numel()
    return 2 * b * q.shape[-2] * k.shape[-2] * q.shape[-1] + 2 * b * q.shape[-2] * k.shape[-2] * v.shape[-1]


def dtype_key(dtype) -> str:
    return _DT.get(dtype, "f32")


def kernel_time(flops: float, nbytes_: float, dtype: str, arch: str, waves: int | None = None) -> dict:
    """Modeled time of one kernel (seconds) and what bounds it (a MODEL, not a measurement)."""
    g = GPUS[arch]
    t_mem, t_cmp = nbytes_ / g["bw"], flops / g["peak"][dtype]
    bound = "compute" if t_cmp > t_mem else "memory"
    eff = 1.0 if waves is None else min(1.0, waves / NEED_WAVES[bound])
    return dict(gpu=g["name"], t_mem=t_mem, t_compute=t_cmp, bound=bound, efficiency=eff,
                t=max(t_mem, t_cmp) / eff)
