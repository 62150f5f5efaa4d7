"""A roofline MODEL (not a measurement) of kernel and model time on MI300X and MI355X.

    time >= max(bytes / achievable HBM bandwidth, FLOPs / achievable matrix FLOPs) / efficiency(occupancy)

Matrix rates (translator.report.cost.GPUS, which the report uses too) are AMD's measured Max-Achievable FLOPs
where published (MI300X bf16 / f16 / fp8) and the vendor's dense peaks otherwise (translator_kernels.arch); the
achievable HBM bandwidth is the share of the vendor's peak that
bench.calibration fitted on measured MI350X kernels (translator_kernels.timing, the full timing
MODEL, of which this roofline is the floor; its calibration error: timing.CALIBRATION). Occupancy penalty (our
assumption, documented here, not calibrated on hardware): a memory-bound kernel needs
`NEED_WAVES["memory"]` = 4 waves per SIMD in flight to cover HBM latency, an MFMA-bound one
`NEED_WAVES["compute"]` = 2; below that the kernel reaches waves / need of the roof.

Model traffic (`graph_traffic`): every non-view op of a graph reads each tensor input once and
writes each output once from / to HBM (no cache between ops), which is how eager PyTorch runs
op by op; a translated graph is counted the same way, so fused FlyDSL ops save the
intermediate round trips. Both graphs are captured at static shapes.
"""

from __future__ import annotations

import torch

from translator.report.cost import GPUS, NEED_WAVES, kernel_time  # noqa: F401  (one table of peaks)
from translator_kernels.arch import FLOAT_NAMES
from translator.report.cost import nbytes as _nbytes
from translator.report.cost import tensors as _tensors

_VIEWS = {"view", "_unsafe_view", "transpose", "t", "permute", "unsqueeze", "squeeze", "expand", "slice", "select",
          "split", "split_with_sizes", "chunk", "unbind", "flatten", "unflatten", "getitem", "alias", "detach",
          "size", "sym_size", "narrow", "movedim", "dropout", "lift_fresh_copy", "_assert_tensor_metadata",
          "_guards_fn", "_assert_scalar", "sym_constrain_range_for_size", "scalar_tensor", "arange", "zeros",
          "ones", "full", "empty"}
_COPY_IF_STRIDED = {"reshape", "contiguous", "flatten"}


def node_bytes(node) -> int:
    """HBM bytes of one op under the op-by-op model (0 for views)."""
    if node.op != "call_function":
        return 0
    short = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    if "flydsl" in node.meta:
        short = "flydsl"
    if short in _VIEWS or short.startswith("sym_"):
        return 0
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    if short in _COPY_IF_STRIDED and ins and isinstance(ins[0], torch.Tensor) and ins[0].is_contiguous():
        return 0
    seen, total = set(), 0
    for v in ins:
        for t in _tensors(v):
            if id(t) not in seen:
                seen.add(id(t))
                total += _nbytes(t)
    return total + sum(_nbytes(t) for t in _tensors(node.meta.get("val")))


def graph_traffic(gm, flops_by_name: dict, arch: str, dtype: str = "f32") -> dict:
    """Modeled bytes, FLOPs, kernel count and op-by-op roofline time of a graph."""
    total_b = total_f = kernels = 0
    t = 0.0
    for n in gm.graph.nodes:
        b = node_bytes(n)
        info = n.meta.get("flydsl")
        names = info["sources"] if info else [n.meta.get("orig_name", n.name)]
        f = sum(flops_by_name.get(s, 0) for s in names)
        if not b and not f:
            continue
        kernels += 1
        total_b += b
        total_f += f
        t += kernel_time(f, b, dtype, arch)["t"]
    return dict(bytes=total_b, flops=total_f, kernels=kernels, t=t)


def model_traffic(model, inputs, arch: str = "gfx942") -> dict:
    """Eager (captured aten graph) vs translated graph, under the op-by-op traffic model."""
    from translator import translate
    from translator.capture import capture
    from translator.report import measure_flops

    with torch.no_grad():
        eager_gm = capture(model.eval(), tuple(inputs), None).gm
        flops = measure_flops(eager_gm, list(inputs))
        tm = translate(model, tuple(inputs), arch=arch, backend="reference", verify=False, dynamic_shapes=None)
    dt = FLOAT_NAMES.get(inputs[0].dtype, "f32")
    return dict(eager=graph_traffic(eager_gm, flops, arch, dt), translated=graph_traffic(tm.gm, flops, arch, dt))
