"""gfx950 scaled MFMA (``mfma.scale.f32.16x16x128.f8f6f4``, ``32x32x64``) with fp8 / bf8 / fp6 /
fp4 operands, selected by the cbsz (A) / blgp (B) format codes, and E8M0 scales by opsel byte.

The reference decodes every code from tables written here from the OCP MX formats (not
flysim's), packs the codes into registers as the hardware reads them (value v of a lane at bits
[w*v, w*(v+1)) of its little-endian register stream: fp4 low nibble first, fp6 four values per
three bytes, fp8 one byte each), and places them with the MFMA lane layout (A: lane g*M + i
holds row i, K 32g..32g+31; B likewise by column; C / D by the f32 accumulator layout). Codes
and scales are drawn so that every product and partial sum is exact in float64, so the result
is one rounding of the exact value and must match bit for bit.
"""

import pytest
import torch

import flysim

import flysim_kernels as K

FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # e2m1 magnitudes by code & 7


def _fp6(code, ebits, bias):
    mbits = 5 - ebits
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    mag = (m / 2 ** mbits) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
    return -mag if code & 0x20 else mag


def _fp8(code, fmt):
    return torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn if fmt == 0 else torch.float8_e5m2).item()


def decode(code, fmt):
    if fmt == 4:
        return -FP4[code & 7] if code & 8 else FP4[code & 7]
    if fmt in (2, 3):
        return _fp6(code, 2 if fmt == 2 else 3, 1 if fmt == 2 else 3)
    return _fp8(code, fmt)


def codes(fmt, g, n):
    """n random codes of the format; fp8 ones with exponents near 1 (values 2^-3 .. 2^5)."""
    if fmt == 4:
        return torch.randint(0, 16, (n,), generator=g)
    if fmt in (2, 3):
        return torch.randint(0, 64, (n,), generator=g)
    ebits, mbits, bias = (4, 3, 7) if fmt == 0 else (5, 2, 15)
    e = torch.randint(bias - 3, bias + 5, (n,), generator=g)
    m = torch.randint(0, 1 << mbits, (n,), generator=g)
    s = torch.randint(0, 2, (n,), generator=g)
    return (s << 7) | (e << mbits) | m


def pack(c, fmt):
    """Codes [64, 32] -> one lane's register dwords [64, 8 | 6 | 4] (int32)."""
    width = {0: 8, 1: 8, 2: 6, 3: 6, 4: 4}[fmt]
    rows = []
    for lane in c.tolist():
        stream = sum(v << (width * i) for i, v in enumerate(lane))
        rows.append(list(stream.to_bytes(width * 4, "little")))
    return torch.tensor(rows, dtype=torch.uint8).view(torch.int32)


def scale_words(g, opsel):
    """Per-lane i32 scale words: random bytes, with an E8M0 exponent 124..130 in byte ``opsel``."""
    w = torch.randint(0, 256, (64, 4), generator=g)
    w[:, opsel] = torch.randint(124, 131, (64,), generator=g)
    return w.to(torch.uint8).view(torch.int32).reshape(64), w[:, opsel]


def reference(m, ca, cb, fa, fb, ea, eb, C):
    """D as a matrix: C + sum_g scaleA * scaleB * (A_g . B_g), exact in float64, rounded to f32."""
    G, k = 64 // m, 32 * (64 // m)
    A = torch.zeros(m, k, dtype=torch.float64)
    B = torch.zeros(m, k, dtype=torch.float64)
    for lane in range(64):
        grp, r = divmod(lane, m)
        for v in range(32):
            A[r, 32 * grp + v] = decode(int(ca[lane, v]), fa) * 2.0 ** (int(ea[lane]) - 127)
            B[r, 32 * grp + v] = decode(int(cb[lane, v]), fb) * 2.0 ** (int(eb[lane]) - 127)
    return (C.double() + A @ B.T).float()


def acc_layout(m):
    """(row, col) of value r of lane l of the f32 accumulator, as index tensors [64, acc]."""
    acc = 4 if m == 16 else 16
    lane = torch.arange(64).unsqueeze(1)
    r = torch.arange(acc).unsqueeze(0)
    grp, col = lane // m, (lane % m).expand(64, acc)
    row = 8 * (r // 4) + 4 * grp + r % 4 if m == 32 else 4 * grp + r
    return row, col


CASES = [  # m, cbsz (A format), blgp (B format), opselA, opselB
    (16, 4, 4, 0, 0), (16, 2, 2, 1, 0), (16, 3, 3, 0, 2), (16, 0, 4, 3, 1), (16, 2, 4, 0, 0),
    (16, 4, 1, 2, 3), (16, 3, 0, 0, 0), (32, 4, 4, 0, 0), (32, 2, 3, 1, 1), (32, 1, 4, 0, 3),
]


@pytest.mark.parametrize("m,fa,fb,osa,osb", CASES)
def test_scaled_mfma_formats_bit_exact(m, fa, fb, osa, osb):
    g = torch.Generator().manual_seed(100 * m + 10 * fa + fb)
    ca = codes(fa, g, 64 * 32).reshape(64, 32)
    cb = codes(fb, g, 64 * 32).reshape(64, 32)
    sa, ea = scale_words(g, osa)
    sb, eb = scale_words(g, osb)
    acc = 4 if m == 16 else 16
    Cm = torch.randint(-64, 65, (m, m), generator=g).float() / 8
    row, col = acc_layout(m)
    C = Cm[row, col].contiguous()
    A, B = pack(ca, fa), pack(cb, fb)
    D = torch.zeros(64, acc)
    with flysim.simulate(arch="gfx950") as sim:
        K.build_scaled_mfma_regs(m, fa, fb, A.shape[1], B.shape[1], osa, osb)(
            A.reshape(-1), B.reshape(-1), sa, sb, C.reshape(-1), D.reshape(-1))
    ref = reference(m, ca, cb, fa, fb, ea, eb, Cm)
    assert torch.equal(D, ref[row, col])
    (kind, count), = sim.launches[-1].counters["mfma_by_kind"].items()
    assert count == 1 and kind.startswith("mfma.scale.")


def test_scaled_mfma_e8m0_255_is_nan_and_scale_128_doubles():
    """E8M0 255 is NaN (row 0 of D: lanes 0, 16, 32, 48 carry row 0's A scale); 128 is 2.0."""
    g = torch.Generator().manual_seed(5)
    ca, cb = codes(4, g, 2048).reshape(64, 32), codes(4, g, 2048).reshape(64, 32)
    sa = torch.full((64,), 127, dtype=torch.int32)
    sb = torch.full((64,), 128, dtype=torch.int32)
    sa[[0, 16, 32, 48]] = 255
    D = torch.zeros(64, 4)
    with flysim.simulate(arch="gfx950"):
        K.build_scaled_mfma_regs(16, 4, 4, 4, 4)(pack(ca, 4).reshape(-1), pack(cb, 4).reshape(-1), sa, sb,
                                                  torch.zeros(256), D.reshape(-1))
    row, col = acc_layout(16)
    Dm = torch.zeros(16, 16)
    Dm[row, col] = D
    assert Dm[0].isnan().all() and not Dm[1:].isnan().any()
    ref = reference(16, ca, cb, 4, 4, torch.full((64,), 127), torch.full((64,), 128), torch.zeros(16, 16))
    assert torch.equal(Dm[1:], ref[1:])
