"""translator_kernels.traffic's attention byte MODEL against flysim's counted bytes, at shapes that are not
multiples of the kernel's tiles.

The model (`translator_kernels.traffic.attention_bytes`) must equal flysim's global_bytes_read +
global_bytes_written summed over the call's launches, exactly: the bench extrapolates the
anchor-shape traffic from the model, so any gap here would be carried to the anchor. The cases
cover the pieces the model adds up: the query rows a workgroup loads past Sq, the last KV tile
that the kernel's per-tile buffer descriptors clamp at Sk, the causal key bound (below and past
Sk), gfx950's 64-key causal D=128 tile, one-wave workgroups without LDS, and split KV with its
in-launch merge. Cases that share a kernel specialization (arch, dtype, head dim, causal, waves)
sit next to each other so the process compiles each once.
"""

import pytest

from translator_kernels.measure import traffic  # measures (flysim)
from translator_kernels import traffic as traffic_model

CASES = [  # dtype, Sq, Sk, D, arch, causal
    ("bf16", 200, 200, 64, "gfx942", True),    # two 128-row blocks, last block ends at key 200
    ("bf16", 150, 40, 64, "gfx942", True),     # Sq > Sk: the causal bound is Sk
    ("bf16", 77, 300, 64, "gfx942", True),     # Sq < Sk: keys past the last row never loaded
    ("bf16", 77, 77, 128, "gfx950", True),     # 64-key tiles (gfx950 causal D=128)
    ("bf16", 70, 150, 128, "gfx950", True),
    ("bf16", 77, 77, 128, "gfx942", False),
    ("bf16", 100, 40, 128, "gfx942", False),
    ("bf16", 40, 150, 64, "gfx950", False),    # two waves, 64-row blocks
    ("bf16", 1, 200, 64, "gfx950", False),     # decode: split KV, merged in the launch
    pytest.param("bf16", 1000, 1000, 64, "gfx942", True, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dt,sq,sk,d,arch,causal", CASES)
def test_attention_model_equals_flysim(dt, sq, sk, d, arch, causal):
    m = traffic.measure_attention(dt, sq, sk, d, arch, causal)
    assert len(m["kernels"]) == 1 and "attention_fwd" in m["kernels"][0], m["kernels"]  # split KV combines in the launch
    assert m["moved"] == traffic_model.attention_bytes(dt, sq, sk, d, arch, causal)


def test_bench_attention_measure_matches_model():
    """translator_kernels.measure.traffic.measure's attention row (causal, Sq = Sk, B x H heads) sees the same bytes."""
    m = traffic.measure("attention", "bf16", (1, 77, 2, 64), "gfx942")
    assert m["launches"] == 1 and m["moved"] == m["model"] > m["compulsory"]


def test_attention_model_counts_every_head():
    """B x H query heads over fewer KV heads (GQA 2, decode): the group's heads share a block, so
    K / V are read once per KV head, and the split count follows that grid (B x Hkv workgroups)."""
    m = traffic.measure_attention("bf16", 1, 200, 64, "gfx950", False, b=2, h=4, hkv=2)
    assert len(m["kernels"]) == 1  # split KV, merged inside the launch
    assert m["moved"] == traffic_model.attention_bytes("bf16", 1, 200, 64, "gfx950", False, heads=8, group=2)
