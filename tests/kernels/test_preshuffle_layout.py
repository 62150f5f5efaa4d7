"""The GEMM weight preshuffle against an index formula written from the MFMA operand layout.

preshuffle.py builds the layout with view/permute; this test never calls that arithmetic. It
derives where each weight element must land from what the kernel's B-operand loads need:

- The kernel works on 16 (N) x 32 (K) blocks of B[N, K]; a block is 512 elements, kpack =
  16 bytes / element size elements per 16-byte chunk, so 32 / kpack chunks per row.
- A 16x16xK MFMA gives B column n to lanes l with l % 16 == n, and K-group q = l // 16 to
  lane group q (flysim's ops_amd: lane l holds B[KPT (l // 16) + v][l % 16]). A wave's
  128-bit loads of one block are contiguous: lane l reads the l-th 16-byte chunk. So chunk
  c of row r of a block (elements [c kpack, (c+1) kpack) of its K slice) must be the
  (16 c + r)-th chunk of the block (fp32 has 8 chunks per row: chunks 4..7 are a second
  64-lane load, the same formula continued).
- Blocks are stored N-block-major: block (bn, bk) is block number bn * (K_pad / 32) + bk.

Element B[n, k] therefore lands at flat position
    ((bn * (K_pad/32) + bk) * (32/kpack) * 16 + 16 c + r) * kpack + j
with bn, r = divmod(n, 16); bk, kk = divmod(k, 32); c, j = divmod(kk, kpack).
"""

import pytest
import torch

from translator_kernels.gemm.preshuffle import shuffle_weight, shuffle_weight_batched, unshuffle_weight

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fnuz, torch.int8]


def formula_position(n, k, k_pad, kpack):
    """Flat position of B[n, k] in the preshuffled tensor (ints or int tensors)."""
    bn, r = n // 16, n % 16
    bk, kk = k // 32, k % 32
    c, j = kk // kpack, kk % kpack
    block = bn * (k_pad // 32) + bk
    return (block * (32 // kpack) * 16 + 16 * c + r) * kpack + j


def _weight(n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        return torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    return torch.randn(n, k, generator=g).to(dtype)


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (20, 40), (1, 7)])
def test_preshuffle_matches_the_mfma_lane_formula(dtype, n, k):
    w = _weight(n, k, dtype)
    ws = shuffle_weight(w)
    n_pad, k_pad = -(-n // 16) * 16, -(-k // 32) * 32
    assert ws.shape == (n_pad, k_pad) and ws.dtype == dtype
    kpack = 16 // w.element_size()
    nn, kk = torch.meshgrid(torch.arange(n_pad), torch.arange(k_pad), indexing="ij")
    pos = formula_position(nn, kk, k_pad, kpack).reshape(-1)
    assert torch.equal(pos.sort().values, torch.arange(n_pad * k_pad))  # a permutation of the slots
    padded = torch.zeros(n_pad, k_pad, dtype=dtype)
    padded[:n, :k] = w
    flat = _bits(ws.contiguous()).reshape(-1)
    assert torch.equal(flat[pos], _bits(padded).reshape(-1))  # every element where the formula says
    assert torch.equal(_bits(unshuffle_weight(ws, n, k)), _bits(w))


def test_formula_by_hand():
    """Spot values of the formula, worked by hand for bf16 (kpack 8) and K_pad 64."""
    assert formula_position(0, 0, 64, 8) == 0
    assert formula_position(1, 0, 64, 8) == 8  # next row, same chunk: the next lane's 16 bytes
    assert formula_position(0, 8, 64, 8) == 16 * 8  # chunk 1 of row 0: lane 16
    assert formula_position(0, 32, 64, 8) == 512  # second K block of the same N block
    assert formula_position(16, 0, 64, 8) == 1024  # second N block after both K blocks
    assert formula_position(3, 45, 64, 8) == 512 + (16 * 1 + 3) * 8 + 5


def test_batched_preshuffle_follows_the_same_formula():
    w = torch.randn(2, 20, 40).to(torch.bfloat16)
    ws = shuffle_weight_batched(w)
    nn, kk = torch.meshgrid(torch.arange(32), torch.arange(64), indexing="ij")
    pos = formula_position(nn, kk, 64, 8).reshape(-1)
    for b in range(2):
        padded = torch.zeros(32, 64, dtype=w.dtype)
        padded[:20, :40] = w[b]
        assert torch.equal(ws[b].reshape(-1)[pos], padded.reshape(-1))
