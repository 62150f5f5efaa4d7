"""The GEMM ISA compiles that the kernel tests assert on (test_gemm.py, test_gemm_cstore.py), in one
table per arch, so that the session fixture `gemm_isa` (conftest.py, over `compiled_isa`) compiles
all of them in one child per arch instead of one child per test (each child pays a start of Python,
torch and FlyDSL besides the compile).

Each job is translator_kernels.measure.gemm_isa's compile of one tile at N = K = 4096 (M = 2 BM + 1), bf16."""

from translator_kernels.measure import gemm_isa

# a long epilogue program with every transcendental kind (also run under flysim by test_gemm.py)
LONG_PROGRAM = "hardsigmoid;rsub(1.0);relu;silu;clamp(-inf,0.3);mish;gelu_tanh;elu(0.5)"
FULL_EPILOGUE = dict(activation="gelu", bias=True, residual=True)


def row(compiled, name: str, arch: str) -> dict:
    """translator_kernels.measure.gemm_isa's statistics row (spills, MFMA mnemonics, LDS bytes) of one compiled job."""
    return gemm_isa.row(jobs(arch)[name][1][0], compiled)


def jobs(arch: str) -> dict:
    """name -> translator_kernels.isa job (entry, args, kwargs) for `arch`."""
    from translator_kernels.gemm import choose_config

    c = choose_config(128, 4096, 4096, "bf16", arch)  # the large-M tile

    def job(bm, bn, bk, **epilogue):
        return (gemm_isa.ENTRY, (gemm_isa.spec(4096, 4096, "bf16", arch, bm, bn, bk, **epilogue),), {})

    out = {"chosen": job(c.bm, c.bn, c.bk),
           "long_program": job(c.bm, c.bn, c.bk, bias=True, residual=True, activation=LONG_PROGRAM),
           "cstore_128": job(128, 128, 64, **FULL_EPILOGUE)}
    if arch == "gfx950":
        out["cstore_256"] = job(128, 256, 64, **FULL_EPILOGUE)
    return out
