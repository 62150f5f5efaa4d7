"""One file per op family; importing this package registers them all (see translator.registry).

The order of these imports does not matter: each family registers its op before its own rules
name it, a rule's priority is explicit, and the registry orders rules by priority and name
(tests/unit/test_architecture.py imports them shuffled and checks that the same rules fire).
"""

from ..registry import populating

with populating(__name__):  # all or nothing: an interrupted import leaves the registry as it was
    from . import (attention, attention_decompose, attention_patterns, by_design, cache_write, einsum,  # noqa: F401
                   elementwise, fbgemm_fp8, fold, fp8_mode, gated_mlp, gemm, gemm_epilogue, embedding, layout, losses,
                   moe, moe_gpt_oss, moe_loops, gated_packed, norm, norm_fp8, norm_gemm, norm_patterns, norm_residual, norm_sandwich, qkv, quant,
                   quant_block, quant_w4, gated_fp8,
                   quantize_fold, reduce, rope, rope_cache, rope_casts, rope_norm, rope_pass, scan, softmax, inplace)
