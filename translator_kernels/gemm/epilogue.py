"""The GEMM epilogue's per-element program (kernel.py, wide.py): a one-input program of translator_kernels.program
(the same program and op table as the generated elementwise, reduce and scan kernels), its canonical text (what
gemm nodes carry and caches key on), its torch reference and its device form on a lane's accumulators."""

from translator_kernels import device_math as em
from translator_kernels.program import epilogue, evaluate, parse


def canonical_epilogue(program) -> str | None:
    """The epilogue's canonical program text (None for none): what gemm nodes carry and caches key on.
    Accepts a Program, its JSON, or a chain spelling such as "gelu" or "mul(0.5);sigmoid"."""
    return epilogue(program)


def apply_epilogue_torch(y, program):
    """The program on an fp32 tensor (the reference)."""
    if not program:
        return y
    prog = parse(canonical_epilogue(program))
    return evaluate(prog, [y])[prog.out[0][0]]


def apply_epilogue_device(v, program, width: int = 4):
    """The program on a lane's fp32 fx.Vector of `width` accumulators while the kernel traces."""
    if not program:
        return v
    prog = parse(canonical_epilogue(program))
    return em.run(prog, [v], width)[prog.out[0][0]]
