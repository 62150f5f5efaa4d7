"""The bytes our GEMM loads through the vector-memory path, in closed form (tiles.l2_bytes: what the timing MODEL's
L2 term charges, issue 29), against flysim's global read counter (every lane's load, no cache): each workgroup its
valid A rows and its W columns over its K slice, the 2 x 2 layout's W twice, split-K's partial reads."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels import gemm as G
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import l2_bytes

CASES = [  # (arch, M, N, K, config): masked A rows, split-K partials, kw = 4, the ring, the 2 x 2 layout
    ("gfx942", 40, 128, 512, G.GemmConfig(32, 64, 128)),
    ("gfx950", 40, 128, 512, G.GemmConfig(16, 64, 128, 2)),
    ("gfx942", 20, 64, 512, G.GemmConfig(16, 32, 128, 2, kw=4)),
    ("gfx950", 64, 256, 512, G.GemmConfig(32, 128, 128, 2, head=32, ring=True)),
    ("gfx942", 64, 128, 512, G.GemmConfig(32, 64, 128, 2, head=32, ring=True, quad=True)),
]


@pytest.mark.parametrize("arch,m,n,k,cfg", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[4].bm}x{c[4].bn}x{c[4].bk}"
                                                         f"s{c[4].split}kw{c[4].kw}{'q' if c[4].quad else ''}"
                                                         for c in CASES])
def test_loaded_bytes_match_flysim(arch, m, n, k, cfg):
    a, w = (torch.rand(rows, k, generator=torch.Generator().manual_seed(rows)).sub(0.5).bfloat16() for rows in (m, n))
    with executors.current().run(arch) as ex:
        out = G.gemm(ex.put(a), ex.put(shuffle_weight(w)), n, k, _config=cfg).cpu().float()
    assert len(ex.launches) == 1
    torch.testing.assert_close(out, (a.float() @ w.float().T).bfloat16().float(), **op_tol(torch.bfloat16, "gemm"))
    if not executors.current().counts:
        return
    got = ex.launches[0].counters["global_bytes_read"]
    want = l2_bytes(m, n, k, "bf16", cfg)
    # split-K's ticket and counter reads add a few bytes per workgroup, far below one K tile
    assert want <= got <= want + 64 * ex.launches[0].grid[0] * ex.launches[0].grid[1], (got, want)
