"""The tiles issue 29's refit ranking newly chooses at decode / mid M (row tiles of 16 and 32 at M = 64,
BM = 32 at mid M, split-K 2-4): numerics against eager, with the full epilogue, one launch each, at a
small shape that keeps several row tiles, an N tail and every split."""

from __future__ import annotations

import pytest
import torch

from test_gemm_schedule import TOL, _case, _ref, _run
from translator_kernels import gemm as G
from translator_kernels.arch import ARCHS

NEW = [G.GemmConfig(16, 64, 128, split=4), G.GemmConfig(32, 64, 128, split=4), G.GemmConfig(32, 64, 128, split=2),
       G.GemmConfig(64, 64, 256, split=2), G.GemmConfig(32, 128, 128, split=2), G.GemmConfig(64, 128, 256, split=2)]


@pytest.mark.parametrize("arch,cfg", [(ARCHS[i % 2], c) for i, c in enumerate(NEW)],
                         ids=lambda x: x if isinstance(x, str) else f"{x.bm}x{x.bn}x{x.bk}-s{x.split}")
def test_new_row_tiles_match_eager(arch, cfg):
    """Each tile on one arch (alternating: the kernel code is the same up to the MFMA)."""
    m, n, k = 40, 72, 512
    a, w, b, r = _case(m, n, k, torch.bfloat16)
    out, launches = _run(arch, a, w, cfg, bias=b, residual=r, activation="silu", scale=0.5)
    assert len(launches) == 1
    torch.testing.assert_close(out.float(), _ref(a, w, b, r).to(torch.bfloat16).float(), **TOL[torch.bfloat16])
