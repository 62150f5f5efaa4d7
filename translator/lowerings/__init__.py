"""One file per op family; importing this package registers them all (see translator.registry)."""

# op families first (each registers its flydsl op), then the lowerings that target them
from . import attention, by_design, gemm, norm, softmax  # noqa: F401,I001
from . import attention_patterns, einsum, gemm_epilogue, gated_mlp  # noqa: F401,I001
from . import norm_patterns  # noqa: F401,I001
from . import elementwise  # noqa: F401,I001
from . import reduce, losses  # noqa: F401,I001
from . import scan  # noqa: F401,I001
