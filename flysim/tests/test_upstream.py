"""FlyDSL's own wave-specialized gfx950 kernels under flysim (only where FLYDSL_SRC names a checkout).

The default suite never needs the network or a FlyDSL checkout: without FLYDSL_SRC these tests
are not collected (conftest.py; nothing is reported skipped), and test_barrier.py covers the same
barrier behaviour on kernels of ours. Run them with FLYDSL_SRC=<checkout>.
"""

import os
import sys

import pytest
import torch

import flysim
from flysim.pytest_plugin import install_cuda_shim

SRC = os.environ.get("FLYDSL_SRC")


@pytest.fixture
def upstream():
    sys.path.insert(0, SRC)
    undo = install_cuda_shim("gfx950")
    try:
        yield
    finally:
        undo()
        sys.path.remove(SRC)


def test_gemm_a16w16_gfx950_half_tile_interleaved(upstream):
    """8-wave bf16 GEMM, default policy (256x256x64 tile, m_waves 2 x n_waves 4, HTI: group 1 runs an extra barrier)."""
    from kernels.gemm.gemm_a16w16_gfx950 import gemm_a16w16

    torch.manual_seed(0)
    m, n, k = 256, 256, 128
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(n, k, dtype=torch.bfloat16).t()  # "nt": B column-major
    with flysim.simulate("gfx950") as sim:
        out = gemm_a16w16(a, b, layout="nt")
    rec = sim.launches[-1]
    assert rec.counters["wave_split"] and rec.block == (512, 1, 1)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=0.2 * (k / 8192) ** 0.5, rtol=0.2)


def test_gemm_a16w16_gfx950_reads_lds_dma_of_the_lagging_group_before_its_wait(upstream):
    """check_waits: group 0 reads, after its second barrier, B-tile bytes that group 1's stage-0 LDS DMA
    wrote; group 1 (one barrier behind) executes its first s_waitcnt vmcnt only after that barrier.
    Correct on hardware only because those loads land in time (an ordering the ISA does not promise)."""
    from kernels.gemm.gemm_a16w16_gfx950 import gemm_a16w16

    a = torch.randn(256, 128, dtype=torch.bfloat16)
    b = torch.randn(256, 128, dtype=torch.bfloat16).t()
    with pytest.raises(flysim.LDSRaceError, match=r"missing s_waitcnt vmcnt.*by wave 4 .*0 retired"):
        with flysim.simulate("gfx950", check_waits=True):
            gemm_a16w16(a, b, layout="nt")


def test_gemm_a16w16_gfx950_epilogue_reads_lds_stored_before_a_bare_barrier(upstream):
    """check_waits="lgkmcnt": the HTI epilogue stores half tile (0, 1) to LDS (line 1119), runs
    MFMAs, then `wait_vmcnt_and_barrier(0)` (s_waitcnt vmcnt(0), lgkmcnt left at its maximum, and a
    bare s_barrier), and other waves read that half tile (line 1137): the stores are not retired
    before the barrier. LDS requests of different waves may be reordered (LLVM AMDGPUUsage,
    GFX942 memory model), so only the short LDS queue makes this work on hardware."""
    from kernels.gemm.gemm_a16w16_gfx950 import gemm_a16w16

    a = torch.randn(256, 128, dtype=torch.bfloat16)
    b = torch.randn(256, 128, dtype=torch.bfloat16).t()
    with pytest.raises(flysim.LDSRaceError, match=r"missing s_waitcnt lgkmcnt.*gemm_a16w16_gfx950.py:959"):
        with flysim.simulate("gfx950", check_waits="lgkmcnt"):
            gemm_a16w16(a, b, layout="nt")


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_gfx950_dualwave_stagger(upstream, causal):
    """Dual-wave flash attention with its default stagger (group B's extra s_barrier)."""
    from kernels.attention.flash_attn_interface import flydsl_flash_attn_func

    torch.manual_seed(0)
    b, s, h, d = 1, 256, 2, 128
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16) for _ in range(3))
    with flysim.simulate("gfx950", check_waits="lgkmcnt") as sim:  # its bare barriers follow lgkmcnt(0)
        out = flydsl_flash_attn_func(q, k, v, causal=causal)
    assert any(r.counters["wave_split"] for r in sim.launches)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=causal).transpose(1, 2)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
