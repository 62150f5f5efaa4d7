"""Ops kept in PyTorch by design: convolution, pooling, batch norm, image resampling and collectives.

MIOpen already serves convolution, pooling and batch norm well on AMD GPUs; the translator leaves them
to PyTorch and the report says "kept in PyTorch by design". Listed here so the report and the op table
can name them. Resampling (`F.interpolate` nearest / (bi|tri)linear / bicubic: a gather of 1-8
neighbours, no reduction) sits between the convolutions of UNets, FPNs and decoders, and stays
with them: a FlyDSL kernel would save no pass over memory there (issue 27 item 5).

Collectives (torch.distributed's functional collectives: all_reduce, all_gather, reduce_scatter,
all_to_all, broadcast, and the wait_tensor that ends each) are communication: they stay in the graph,
as written, on the process group the model gave them (RCCL on ROCm, gloo on the CPU). The translator
never reimplements communication and never moves a wait, so a collective the model overlaps with
compute stays overlapped. The report says so with that reason (docs/moe.md, "rank by rank").
"""

import torch

from ..registry import BY_DESIGN, BY_DESIGN_WHY

aten = torch.ops.aten

for _name in (
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool2d", "batch_norm", "native_batch_norm", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact2d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
):
    _pk = getattr(aten, _name, None)
    if _pk is not None:
        BY_DESIGN.add(_pk)

COLLECTIVE_WHY = "communication stays on the model's process group (RCCL on ROCm), as written"
for _name in (
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
    "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "broadcast_",
    "wait_tensor", "isend", "irecv", "batch_p2p_ops",
):
    try:
        _pk = getattr(torch.ops._c10d_functional, _name)
    except (AttributeError, RuntimeError):  # a torch built without distributed
        continue
    BY_DESIGN.add(_pk)
    BY_DESIGN_WHY[_pk] = COLLECTIVE_WHY
