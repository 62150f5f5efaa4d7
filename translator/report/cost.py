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
- grouped GEMMs (aten._grouped_mm, transformers' grouped_mm_fallback: the MoE experts): 2 per
  multiply-add, 2 x output elements x K;
- FFT (_fft_r2c / _fft_c2r / _fft_c2c): 5 x complex elements x log2(transform length);
- recurrent layers (lstm / gru / rnn and their cells): 2 per multiply-add of every weight matrix
  with every token, plus 2 per gate element for the gate arithmetic;
- pooling (avg / max / adaptive, with indices or not): 1 per input element (a sum or compare of each
  window element); resampling: bilinear / trilinear 8, bicubic 32 per output element, nearest 0;
- triu / tril: 1 per element (the index compare that masks it): a masking op, not a layout op;
- element-wise ops aten does not tag pointwise (bitwise, floor_divide, diff, where): 1 per output
  element; sorts (sort, topk, ...): n log2 n compares; scatters that accumulate (index_put with
  accumulate, index_add, scatter_add / reduce): 1 per source element, otherwise 0;
- functional collectives (_c10d_functional all_reduce, all_gather, reduce_scatter, all_to_all,
  broadcast): all_reduce / reduce_scatter 1 per input element, the rest 0; their bytes are counted
  apart (`COLLECTIVES`), so the report says what share of a rank's bytes is communication;
- views (an output that aliases an input, per the op's schema) and shape arithmetic: 0.

`cost_class(target)` names the rule an op falls under; an op under none is "uncosted" (a test
walks every aten op of the model zoo and the HF audit and finds none). A data-dependent size
(`x[x > 0]`, the token count of an expert) is exact in `measure`, which runs the graph on the
example inputs; from fake values alone it is "data-dependent", bounded by the range the capture
recorded for its symbol where there is one (`data_dependent`).

Bytes are the op-by-op traffic model: every non-view op reads each tensor input once and
writes each output once (no cache between ops), as eager PyTorch runs. A fused FlyDSL op is
counted from its own inputs and outputs, so the intermediates it keeps on chip are not.

`kernel_time` is a roofline MODEL, not a measurement: max(bytes / achievable HBM bandwidth,
FLOPs / achievable matrix rate) on MI300X (gfx942) and MI355X (gfx950): the achievable share of
HBM fitted by bench.calibration (translator_kernels.timing, whose calibration error `model_note`
quotes), the matrix rate the vendor's measured Max-Achievable FLOPs where published (MI300X bf16 /
f16 / fp8: arch.Arch.maf_flops), else the dense peak; bench/roofline.py uses the same table.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from translator_kernels.arch import FLOAT_NAMES, GPUS as ARCH_GPUS

aten = torch.ops.aten

# the roofline's view of translator_kernels.arch.GPUS (the one table of hardware facts)
GPUS = {a: dict(name=g.gpu, bw=g.hbm_bytes_per_s, peak={dt: g.achievable_flops(dt) for dt in FLOAT_NAMES.values()})
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
    "_weight_norm": 3, "_weight_norm_interface": 3, "histc": 1, "bincount": 1,
}
# element-wise ops aten does not tag `pointwise`: 1 FLOP per output element, as the tagged ones
POINTWISE_UNTAGGED = {"__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "floor_divide", "diff", "where",
                      "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or",
                      "bitwise_xor", "bitwise_not", "remainder", "fmod", "clamp", "clip", "lerp"}
# comparison sorts: n log2 n compares per sorted slice
SORTING = {"sort", "argsort", "topk", "msort", "kthvalue", "median", "nanmedian", "unique", "_unique2", "mode"}
# scatter with accumulate: 1 per accumulated value (index_put_(accumulate=False) moves data only)
SCATTER_ADD = {"index_put", "index_put_", "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce",
               "scatter_reduce_", "_index_put_impl_"}
# shape-only ops that copy data or return scalars (no arithmetic, no alias annotation)
NO_ARITHMETIC = {
    "clone", "contiguous", "_to_copy", "to", "copy", "cat", "stack", "repeat", "index_select", "gather",
    "embedding", "arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "scalar_tensor", "sym_size", "lift_fresh_copy", "dropout", "constant_pad_nd", "pad",
    "flip", "roll", "index", "scatter", "masked_fill", "fill", "new_zeros", "new_ones", "new_full", "new_empty",
    "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_guards_fn", "type_as",
    "copy_", "fill_", "masked_fill_", "detach_", "meshgrid", "repeat_interleave", "zero_", "index_copy",
    "index_copy_", "index_fill", "index_fill_", "masked_scatter", "scatter_", "new_tensor", "tensor",
}


GROUPED_MM = {"_grouped_mm", "grouped_mm", "grouped_mm_fallback", "_scaled_grouped_mm"}
FFT = {"_fft_r2c", "_fft_c2r", "_fft_c2c", "fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "fft_fftn", "fft_ifftn",
       "fft_rfftn", "fft_irfftn", "fft_fft2", "fft_ifft2", "fft_rfft2", "fft_irfft2", "stft", "istft"}
RNN = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1, "lstm_cell": 4, "gru_cell": 3, "rnn_tanh_cell": 1,
       "rnn_relu_cell": 1, "_thnn_fused_lstm_cell": 4, "_thnn_fused_gru_cell": 3}
MASKING = {"triu", "tril"}
POOLING = {"avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
           "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "adaptive_max_pool1d",
           "adaptive_max_pool2d", "adaptive_max_pool3d", "lp_pool1d", "lp_pool2d", "fractional_max_pool2d"}
RESAMPLING = {"upsample_bilinear2d": 8, "upsample_trilinear3d": 8, "upsample_linear1d": 4, "upsample_bicubic2d": 32,
              "_upsample_bilinear2d_aa": 8, "_upsample_bicubic2d_aa": 32, "grid_sampler_2d": 8, "grid_sampler": 8,
              "upsample_nearest1d": 0, "upsample_nearest2d": 0, "upsample_nearest3d": 0, "_upsample_nearest_exact1d": 0,
              "_upsample_nearest_exact2d": 0, "_upsample_nearest_exact3d": 0}
# functional collectives (torch.distributed._functional_collectives): name -> FLOPs per input element
COLLECTIVES = {"all_reduce": 1, "all_reduce_": 1, "all_reduce_coalesced": 1, "reduce_scatter_tensor": 1,
               "reduce_scatter_tensor_coalesced": 1, "all_gather_into_tensor": 0, "all_gather_into_tensor_coalesced": 0,
               "all_to_all_single": 0, "broadcast": 0, "broadcast_": 0, "wait_tensor": 0}
# composite ops FlopCounter counts through what they decompose into at run time
_COUNTED_COMPOSITES = {"linear", "matmul", "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                       "conv_transpose2d", "conv_transpose3d", "bilinear", "scaled_dot_product_attention", "mv",
                       "dot", "vdot", "addmv", "addbmm", "tensordot", "inner", "outer", "ger", "chain_matmul",
                       "linalg_multi_dot", "_native_multi_head_attention", "addmm", "mm", "bmm", "baddbmm"}


def is_collective(target) -> bool:
    return short_name(target) in COLLECTIVES and "c10d" in getattr(target, "namespace", "") + str(target)


def cost_class(target) -> str:
    """The rule of the module docstring an op is costed by; "uncosted" when none applies."""
    from torch.utils.flop_counter import flop_registry

    name = short_name(target)
    if is_collective(target):
        return "collective"
    if is_view(target):
        return "view"
    if name in GROUPED_MM:
        return "grouped_mm"
    if name in FFT:
        return "fft"
    if name in RNN:
        return "rnn"
    if name in MASKING:
        return "masking"
    if name in POOLING:
        return "pooling"
    if name in POINTWISE_UNTAGGED:
        return "pointwise"
    if name in SORTING:
        return "sorting"
    if name in SCATTER_ADD:
        return "scatter"
    if name in RESAMPLING:
        return "resampling"
    packet = getattr(target, "overloadpacket", None)
    if (packet is not None and packet in flop_registry) or name in _COUNTED_COMPOSITES:
        return "flop_counter"
    if name in PER_ELEMENT:
        return "per_element"
    if name in NO_ARITHMETIC:
        return "no_arithmetic"
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        return "pointwise"
    if torch.Tag.reduction in tags or name.startswith(_REDUCTIONS):
        return "reduction"
    return "uncosted"


_REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin", "any", "all", "nansum",
               "aminmax", "median", "nanmedian", "mode", "count_nonzero")


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
    name = short_name(target)
    ins = tensors(args)
    if is_collective(target):
        return COLLECTIVES[name] * (numel(ins[0]) if ins else 0)
    if is_view(target) or name in NO_ARITHMETIC:
        return 0
    if name in GROUPED_MM:
        return _grouped_mm_flops(ins, tensors(out))
    if name in FFT:
        return _fft_flops(name, ins, tensors(out), args)
    if name in RNN:
        return _rnn_flops(name, ins, RNN[name])
    if name in MASKING:
        return sum(numel(t) for t in tensors(out))
    if name in POOLING:
        return numel(ins[0]) if ins else 0
    if name in POINTWISE_UNTAGGED:
        return sum(numel(t) for t in tensors(out)[:1])
    if name in SORTING:
        return _sort_flops(name, ins, args)
    if name in SCATTER_ADD:
        return _scatter_flops(name, ins, args)
    if name in RESAMPLING:
        return RESAMPLING[name] * sum(numel(t) for t in tensors(out)[:1])
    if name in PER_ELEMENT:
        return PER_ELEMENT[name] * (max(numel(t) for t in ins) if ins else 0)
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        return sum(numel(t) for t in tensors(out))
    if torch.Tag.reduction in tags or name.startswith(_REDUCTIONS):
        return numel(ins[0]) if ins else 0
    return 0


def _sort_flops(name, ins, args) -> int:
    import math

    if not ins or not ins[0].dim():
        return 0
    if name == "topk":  # topk(self, k, dim=-1)
        dim = args[2] if len(args) > 2 else -1
    else:  # sort(self, dim=-1), kthvalue(self, k, dim): the last int argument that can be a dim
        dim = args[1] if len(args) > 1 and isinstance(args[1], int) and name != "kthvalue" else (
            args[2] if len(args) > 2 and isinstance(args[2], int) else -1)
    n = int(ins[0].shape[dim]) if isinstance(dim, int) and ins[0].dim() else numel(ins[0])
    return int(numel(ins[0]) * math.ceil(math.log2(max(n, 2))))


def _scatter_flops(name, ins, args) -> int:
    """index_put(self, indices, values, accumulate): the values when accumulating; index_add /
    scatter_add / scatter_reduce(self, dim, index, src): the source elements."""
    if name.startswith(("index_put", "_index_put")):
        accumulate = len(args) > 3 and bool(args[3])
        vals = args[2] if len(args) > 2 else None
        return numel(vals) if accumulate and isinstance(vals, torch.Tensor) else 0
    src = args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) else (ins[-1] if ins else None)
    return numel(src) if src is not None else 0


def _grouped_mm_flops(ins, outs) -> int:
    """2 x every multiply-add: [S, K] x [G, K, N] (rows grouped by offsets) -> [S, N]; [G, M, K] x
    [G, K, N] -> [G, M, N]; [M, Ktot] x [Ktot, N] grouped along K -> [G, M, N]."""
    if len(ins) < 2 or not outs:
        return 0
    a, b = ins[0], ins[1]
    if a.dim() == 2 and b.dim() == 2:
        return 2 * numel(a) * b.shape[-1]
    return 2 * numel(outs[0]) * a.shape[-1]


def _fft_flops(name, ins, outs, args) -> int:
    """5 N log2 N per complex transform of length N (N log2 N butterflies, 5 real FLOPs each)."""
    if not ins or not outs:
        return 0
    import math

    cplx = next((t for t in ins + outs if t.is_complex()), outs[0])
    real = ins[0] if not ins[0].is_complex() else outs[0]
    if name.startswith("_fft"):  # _fft_r2c(self, dim, normalization, onesided)
        dims = args[1]
    else:  # fft_rfft(self, n, dim, norm), fft_fftn(self, s, dim, norm): dim None = every dim of the n-d forms
        d = args[2] if len(args) > 2 else None
        dims = [d] if isinstance(d, int) else d if d is not None else (
            range(real.dim()) if name.endswith(("n", "2")) else [-1])
    if name.endswith(("2",)) and not isinstance(dims, (list, tuple)):
        dims = [-2, -1]
    n = 1
    for d in dims:
        n *= int(real.shape[d]) if real.dim() else 1
    return int(5 * numel(cplx) * math.log2(max(n, 2)))


def _rnn_flops(name, ins, gates) -> int:
    """Every 2-D weight times every token (2 per multiply-add), plus 2 per gate element."""
    if not ins:
        return 0
    x = ins[0]
    tokens = numel(x) // max(1, int(x.shape[-1])) if x.dim() else 1
    weights = [t for t in ins[1:] if t.dim() == 2 and t.shape[0] % gates == 0 and t.shape[0] >= gates]
    mac = sum(numel(w) for w in weights)
    gate_elems = sum(int(w.shape[0]) for w in weights) // 2 if len(weights) > 1 else sum(int(w.shape[0]) for w in weights)
    return 2 * tokens * mac + 2 * tokens * gate_elems


# ops whose data-dependent output has at most as many elements (rows for nonzero) as their input
_SELECTING = {"index", "masked_select", "nonzero", "argwhere", "unique", "_unique", "_unique2", "unique_consecutive",
              "unique_dim", "nonzero_static"}


def data_dependent(v, node=None) -> str | None:
    """None for a size known before a run; else "data-dependent" with a bound: the range the capture
    recorded for its symbol, or for a selecting op (`x[x > 0]`, nonzero, masked_select, unique) its
    input's element count; "unbounded" when neither applies."""
    syms = []
    for t in tensors(v):
        for s in t.shape:
            if isinstance(s, torch.SymInt) and s.node.hint is None:
                syms.append(s)
    if not syms:
        return None
    cap = None
    if node is not None and short_name(node.target) in _SELECTING:
        sizes = [numel(t) for a in node.all_input_nodes for t in tensors(a.meta.get("val"))]
        cap = max(sizes) if sizes and all(sizes) else None
    bounds = []
    for s in syms:
        expr, upper = s.node.expr, None
        try:
            up = s.node.shape_env.bound_sympy(expr).upper
            upper = int(up) if up.is_finite and int(up) < 2 ** 62 else None
        except Exception:  # noqa: BLE001 - no range recorded
            upper = None
        if cap is not None:
            upper = cap if upper is None else min(upper, cap)
        bounds.append(f"{expr} <= {upper}" if upper is not None else f"{expr} unbounded")
    return "data-dependent (" + ", ".join(dict.fromkeys(bounds)) + ")"


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
    args = torch.fx.node.map_arg(node.args, lambda a: a.meta.get("val"))
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
                args = torch.fx.node.map_arg(n.args, lambda a: self.env.get(a, a))
                try:
                    f = model_flops(n.target, args, v)
                except Exception:  # noqa: BLE001 - an odd argument form costs 0 FLOPs, never a failed report
                    f = 0
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
    """Modeled time of one kernel (seconds) and what bounds it (a MODEL, not a measurement): the
    floors of translator_kernels.timing without its ISA terms, max(bytes / achievable HBM bandwidth,
    FLOPs / achievable matrix rate), the HBM share fitted on measured MI350X kernels, the matrix rate AMD's
    measured Max-Achievable FLOPs where published, else the dense peak (`model_note`).
    `waves` (per SIMD, when known) applies the occupancy penalty of NEED_WAVES."""
    g = GPUS[arch]
    t_mem, t_cmp = nbytes_ / (g["bw"] * ARCH_GPUS[arch].timing["hbm_efficiency"]), flops / g["peak"][dtype]
    bound = "compute" if t_cmp > t_mem else "memory"
    eff = 1.0 if waves is None else min(1.0, waves / NEED_WAVES[bound])
    return dict(gpu=g["name"], t_mem=t_mem, t_compute=t_cmp, bound=bound, efficiency=eff,
                t=max(t_mem, t_cmp) / eff)


def model_note() -> str:
    """What the report prints beside every MODEL time."""
    from translator_kernels.timing import CALIBRATION

    return ("MODEL, not a measurement: max(bytes / fitted achievable HBM bandwidth, FLOPs / achievable matrix "
            "rate: AMD's measured Max-Achievable FLOPs where published (MI300X), else the dense peak), the "
            f"floors of the timing model (translator_kernels.timing; calibration: {CALIBRATION})")
