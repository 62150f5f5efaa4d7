"""Ops kept in PyTorch by design: convolution, pooling, batch norm.

MIOpen already serves these well on AMD GPUs; the translator leaves them to PyTorch and
the report says "kept in PyTorch by design". Listed here so the report and the op table
can name them.
"""

import torch

from ..registry import BY_DESIGN

aten = torch.ops.aten

for _name in (
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool2d", "batch_norm", "native_batch_norm", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm",
):
    _pk = getattr(aten, _name, None)
    if _pk is not None:
        BY_DESIGN.add(_pk)
