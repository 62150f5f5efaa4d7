"""Row kernels: one workgroup per row (norms, softmax) and their shared host code."""
