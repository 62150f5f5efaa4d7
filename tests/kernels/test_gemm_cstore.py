"""128-bit C stores through LDS (translator_kernels/gemm/cstore.py): the same bits as the
one-element-per-lane stores on the session's executor, and dwordx4 stores in the compiled ISA."""

import pytest
import torch
from translator.tolerances import op_tol

import executors  # the session's executor (tests/executors.py)
import gemm_isa_jobs  # tests/kernels: the GEMM ISA compiles, batched per arch (conftest gemm_isa)
from translator_kernels import launch as kl
from translator_kernels.arch import ARCHS, NAMED_DTYPES
from translator_kernels.gemm import GemmConfig
from translator_kernels.gemm.kernel import build_gemm
from translator_kernels.gemm.preshuffle import padded_shape, shuffle_weight

DT = {k: NAMED_DTYPES[k] for k in ("f32", "bf16")}


def _run(arch, dt, m, n, k, cfg, store_vec):
    g = torch.Generator().manual_seed(7)
    a = (torch.randn(1, m, k, generator=g) / k**0.5).to(DT[dt])
    w = torch.randn(n, k, generator=g).to(DT[dt])
    bias, res = torch.randn(n, generator=g), torch.randn(1, m, n, generator=g).to(DT[dt])
    n_pad, k_pad = padded_shape(n, k)
    ws = shuffle_weight(w).unsqueeze(0)
    out = torch.empty(1, m, n, dtype=DT[dt])
    ph = torch.zeros(1)
    launcher = build_gemm(n, k, n_pad, k_pad, dt, dt, arch, cfg.bm, cfg.bn, cfg.bk, "gelu", True, True, 1, "shuffled",
                          None, cfg.kw, store_vec)
    with executors.current().run(arch) as ex:
        dev = [ex.put(t) for t in (out, a, ws, bias, res, ph)]
        kl.call(launcher, *dev, dev[-1], m, 1, m * k, 0, m * n, 0.5, a.numel() * a.element_size(),
                ws.numel() * ws.element_size(), out.numel() * out.element_size(), 4, 4)
    ref = torch.nn.functional.gelu(0.5 * (a.float() @ w.float().T) + bias) + res.float()
    return dev[0].cpu(), ref, ex


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt,cfg", [("bf16", GemmConfig(32, 128, 64)), ("f32", GemmConfig(32, 64, 32)),
                                    ("bf16", GemmConfig(16, 64, 64)), ("bf16", GemmConfig(16, 16, 128, kw=4))],
                         ids=["bf16", "f32", "bf16-half-wave", "bf16-kw4"])
def test_vector_stores_match_scalar_stores(arch, dt, cfg):
    """M = 37 (row tail), N = 136 (a multiple of 8, not of the tile), K = 240 (K tail), full epilogue:
    bit-identical output, the same bytes written (exactly C), eager numerics. bf16-half-wave: 16
    columns per wave are 32 row pieces for 64 lanes (the spare lanes' LDS reads stay inside the
    wave's region; flysim's race check caught them reading the next wave's)."""
    vec_out, ref, vec = _run(arch, dt, 37, 136, 240, cfg, True)
    sc_out, _, sc = _run(arch, dt, 37, 136, 240, cfg, False)
    vec_l, sc_l = list(vec.launches), list(sc.launches)
    assert len(vec_l) == len(sc_l) == 1
    assert torch.equal(vec_out, sc_out)
    if vec.counts:  # flysim counts the bytes written
        assert vec_l[0].counters["global_bytes_written"] == sc_l[0].counters["global_bytes_written"] == vec_out.numel() * vec_out.element_size()
    tol = op_tol(vec_out.dtype, "gemm", reduction_length=240)
    torch.testing.assert_close(vec_out.float(), ref.to(vec_out.dtype).float(), **tol)


@pytest.mark.parametrize("arch,bn", [(a, 128) for a in ARCHS] + [("gfx950", 256)])
def test_isa_c_stores_are_dwordx4(arch, bn, gemm_isa):
    """bf16 4096^2, 128xBNx64, bias + gelu + residual: C leaves as buffer_store_dwordx4 only, 0 spills
    (gfx950's 128x256 tile had 34 SGPR spills with the one-element stores)."""
    name = f"cstore_{bn}"
    spec = gemm_isa_jobs.jobs(arch)[name][1][0]
    assert (spec["bm"], spec["bn"], spec["bk"], spec["activation"], spec["bias"], spec["residual"]) == \
        (128, bn, 64, "gelu", True, True)
    s = gemm_isa(name, arch).main
    stores = s.mnemonics("buffer_store_") + s.mnemonics("global_store_")
    assert stores and set(stores) == {"buffer_store_dwordx4"}, stores
    assert s.meta["vgpr_spill"] == 0 and s.meta["sgpr_spill"] == 0
