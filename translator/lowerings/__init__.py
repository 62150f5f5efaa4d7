"""One file per op family; importing this package registers them all (see translator.registry)."""

from . import attention, attention_patterns, by_design, gemm, gemm_epilogue, norm, softmax  # noqa: F401
