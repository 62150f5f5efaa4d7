"""ISA statistics of one compiled bench kernel: metadata, occupancy, static instruction mix.

The compile, the parser and the occupancy MODEL live in translator_kernels.isa (its module
docstring states the model); this module names them for the bench and adds `compile_stats`,
which compiles one bench kernel (`bench._isa_child`: ours or FlyDSL's own) without a GPU.
"""

from __future__ import annotations

from translator_kernels.isa import (LDS_PER_CU, MAX_WAVES, ROOT, IsaCompileError, IsaStats,  # noqa: F401
                                    classify, compile_env, compile_isa, fmt_widths, occupancy, parse_isa)
from translator_kernels.isa import width as _width  # noqa: F401


def compile_stats(impl: str, family: str, dtype: str, shape, arch: str) -> IsaStats:
    """Compile one kernel in a child process and return the statistics of its (main) kernel.

    Raises LookupError when FlyDSL has no kernel for the case (impl="flydsl")."""
    try:
        c = compile_isa(f"bench._isa_child:{impl}", (family, dtype, list(shape)), arch=arch)
    except IsaCompileError as e:
        if e.error_type == "LookupError":
            raise LookupError(str(e).split("LookupError: ", 1)[-1]) from None
        raise RuntimeError(f"{impl} {family} {dtype} {shape} {arch}: compile failed\n{e}") from None
    main = c.main
    main.config = (c.result or {}).get("config") or f"{main.meta['block']} threads"
    return main
