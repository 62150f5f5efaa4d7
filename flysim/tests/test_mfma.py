"""One MFMA per wave, for every MFMA kind flysim simulates, starting from a random accumulator.

A zero C only checks D = A @ B; a random C also checks where each accumulator value of
each lane sits (the C/D lane layout), which a zero start cannot see. The reference is
computed in float64 from the same (already rounded) inputs.
"""

import pytest
import torch

import flydsl.expr as fx
import flysim

import flysim_kernels as K

I8 = (fx.Int8, torch.int8)
CASES = [  # arch, m, n, k, (FlyDSL element, torch dtype), atom factory (None: fx.rocdl.MFMA)
    ("gfx942", 16, 16, 4, (fx.Float32, torch.float32), None),
    ("gfx942", 32, 32, 2, (fx.Float32, torch.float32), None),
    ("gfx942", 16, 16, 16, (fx.BFloat16, torch.bfloat16), None),
    ("gfx942", 32, 32, 8, (fx.BFloat16, torch.bfloat16), None),
    ("gfx942", 16, 16, 16, (fx.Float16, torch.float16), None),
    ("gfx942", 32, 32, 8, (fx.Float16, torch.float16), None),
    ("gfx942", 16, 16, 32, (fx.Float8E4M3FNUZ, torch.float8_e4m3fnuz), None),
    ("gfx942", 32, 32, 16, (fx.Float8E4M3FNUZ, torch.float8_e4m3fnuz), None),
    ("gfx942", 16, 16, 32, I8, None),
    ("gfx942", 32, 32, 16, I8, None),
    ("gfx950", 16, 16, 32, (fx.BFloat16, torch.bfloat16), None),
    ("gfx950", 32, 32, 16, (fx.BFloat16, torch.bfloat16), None),
    ("gfx950", 16, 16, 32, (fx.Float16, torch.float16), None),
    ("gfx950", 16, 16, 128, (fx.Float8E4M3FN, torch.float8_e4m3fn),
     lambda: fx.rocdl.cdna4.MFMA_Scale(16, 16, 128, fx.Float8E4M3FN)),
    ("gfx950", 32, 32, 64, (fx.Float8E4M3FN, torch.float8_e4m3fn),
     lambda: fx.rocdl.cdna4.MFMA_Scale(32, 32, 64, fx.Float8E4M3FN)),
]


def _operands(m, n, k, tdt, g, tiles=1):
    if tdt == torch.int8:
        A = torch.randint(-128, 128, (tiles * m, k), generator=g, dtype=torch.int8)
        B = torch.randint(-128, 128, (tiles * n, k), generator=g, dtype=torch.int8)
        C = torch.randint(-2**20, 2**20, (tiles * m, n), generator=g, dtype=torch.int32)
        return A, B, C
    A = torch.randn(tiles * m, k, generator=g).to(tdt)
    B = torch.randn(tiles * n, k, generator=g).to(tdt)
    return A, B, 4 * torch.randn(tiles * m, n, generator=g)


@pytest.mark.parametrize("arch,m,n,k,el,atom", CASES, ids=lambda v: getattr(v, "__name__", None) if isinstance(v, type) else None)
def test_single_mfma_from_random_accumulator(arch, m, n, k, el, atom):
    fel, tdt = el
    A, B, C = _operands(m, n, k, tdt, torch.Generator().manual_seed(m * 1000 + k))
    ref = C.double() + A.double() @ B.double().T
    with flysim.simulate(arch=arch) as sim:
        K.build_mma_tile(m, n, k, fel, tdt.itemsize * 8, acc=fx.Int32 if tdt == torch.int8 else None,
                         load_c=True, atom=atom)(A, B, C)
    if tdt == torch.int8:
        assert torch.equal(C.long(), ref.long())
    else:
        torch.testing.assert_close(C.double(), ref, rtol=1e-6, atol=1e-5)
    (kind, count), = sim.launches[-1].counters["mfma_by_kind"].items()
    assert count == 1 and f"{m}x{n}x{k}" in kind


def test_mfma_counter_skips_waves_that_branch_around_it():
    """Four one-wave workgroups; only workgroups 0..2 take the branch holding the MFMA."""
    m = n = k = 16
    A, B, C = _operands(m, n, k, torch.bfloat16, torch.Generator().manual_seed(7), tiles=4)
    ref = C.double().clone()
    for t in range(3):
        ref[t * m:(t + 1) * m] += A[t * m:(t + 1) * m].double() @ B[t * n:(t + 1) * n].double().T
    with flysim.simulate(arch="gfx942") as sim:
        K.build_mma_tile(m, n, k, fx.BFloat16, 16, tiles=4, load_c=True, active=3)(A, B, C)
    torch.testing.assert_close(C.double(), ref, rtol=1e-6, atol=1e-5)  # tile 3 left as it was
    assert sim.launches[-1].counters["mfma_by_kind"] == {"mfma.f32.16x16x16bf16.1k": 3}
