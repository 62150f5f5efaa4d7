"""Flash attention kernel vs eager torch SDPA (fp32-computed reference), run on the session's executor
(tests/executors.py: flysim, or rocm on an AMD GPU).

One table of cases drives one test; the default set is a covering subset (dtypes, causal,
mask kinds, GQA/MQA, tails, Sq=1 decode, padded head dims, soft-cap, per-head scale), the full
sweep (B, H, Hkv, Sq, Sk, D, causal, mask, dtype, options, arch) is marked slow. Every numeric
test asserts that the FlyDSL kernel was launched; the tests that read flysim's counters are
flysim_only.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol, op_tolerance
from translator_kernels.arch import ARCHS, NAMED_DTYPES
from translator_kernels.attention import attention, attention_config, split_geometry
from translator_kernels.attention.gqa import pack_group
from translator_kernels.measure.attention_isa import rescale_counts

DTYPES = {name: NAMED_DTYPES[name] for name in ("f32", "bf16", "f16")}
# dtype -> (atol, rtol): the project table, no per-op relaxation needed.
TOL = {k: op_tolerance(dt, "attention") for k, dt in DTYPES.items()}


def _run(arch, fn, *tensors, **kw):
    """fn(*tensors, **kw) on the session's executor, tensors (in kw too) put where it reads them; the
    output back on the CPU, and the launches."""
    with executors.current().run(arch) as ex:
        out = fn(*map(ex.put, tensors), **{k: ex.put(v) for k, v in kw.items()})
    return out.cpu(), ex.launches


def make_inputs(B, H, Hkv, Sq, Sk, D, dtype, mask_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    q = torch.randn(B, H, Sq, D, generator=g).to(dt)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dt)
    mask = None
    if mask_kind == "bool":  # [Sq, Sk] keep-mask, broadcast over B and H; row 0 fully masked
        mask = torch.rand(Sq, Sk, generator=g) < 0.7
        mask[0] = False
    elif mask_kind == "add":  # [B, 1, Sq, Sk] additive mask with some -inf
        mask = torch.randn(B, 1, Sq, Sk, generator=g)
        mask[torch.rand(B, 1, Sq, Sk, generator=g) < 0.2] = float("-inf")
        mask = mask.to(dt)
    return q, k, v, mask


def reference(q, k, v, mask, causal, scale=None, softcap=None, head_scale=None):
    m = mask if mask is None or mask.dtype == torch.bool else mask.float()
    if softcap is None and head_scale is None:
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, is_causal=causal,
                                              scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = q.float() @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if head_scale is not None:
        s = s * head_scale.view(1, -1, 1, 1)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if m is not None:
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
    return (torch.softmax(s, -1).nan_to_num(0.0) @ v)


def options(opt, H, seed=0):
    """"cap": a soft-cap of 5 over unscaled scores (so it bites); "hs": per-head scales in [0, 4)."""
    if opt == "cap":
        return {"softcap": 5.0, "scale": 1.0}
    if opt == "hs":
        return {"head_scale": torch.rand(H, generator=torch.Generator().manual_seed(seed)) * 4, "scale": 1.0}
    return {}


def run_case(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask_kind, scale=None, opt=None):
    q, k, v, mask = make_inputs(B, H, Hkv, Sq, Sk, D, dtype, mask_kind)
    kw = options(opt, H) if opt else {"scale": scale}
    out, launches = _run(arch, attention, q, k, v, mask=mask, causal=causal, **kw)
    # split KV or not, one launch: the splits combine inside it
    assert [ln.kernel.rsplit("_", 1)[0] for ln in launches] == ["attention_fwd_kernel"], "the FlyDSL kernel did not run"
    assert out.dtype == q.dtype and out.shape == q.shape
    ref = reference(q, k, v, mask, causal, **kw)
    atol, rtol = TOL[dtype]
    if opt == "hs" and dtype == "f32":  # scores up to 4x the default scale: fp32 rounding grows with them
        atol, rtol = 4 * atol, 4 * rtol
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)


#       B  H Hkv  Sq   Sk   D   dtype   causal mask   option
FAST = [
    (1, 1, 1, 17, 64, 64, "bf16", False, None, None),
    (1, 2, 2, 64, 64, 64, "bf16", True, None, None),
    (2, 2, 1, 130, 100, 128, "bf16", True, None, None),    # batch 2, GQA, tails on both axes, 4 waves
    (1, 4, 1, 1, 130, 128, "bf16", False, None, None),     # MQA decode, Sq = 1
    (1, 1, 1, 17, 64, 32, "f32", False, None, None),
    (1, 2, 2, 64, 17, 64, "f32", True, None, None),        # Sq > Sk causal
    (1, 1, 1, 33, 70, 80, "f16", False, "add", None),
    (1, 2, 1, 40, 50, 96, "bf16", False, "bool", None),    # fully masked row 0
    (1, 1, 1, 20, 40, 256, "bf16", True, "add", None),
    (1, 1, 1, 17, 17, 256, "f32", False, "bool", None),
]
# padded head dims (tiles cover D rounded up to 16: register and LDS paths), soft-cap, per-head
# scale: one arch each by default (the slow sweep runs both)
FAST_ONE_ARCH = [
    ("gfx942", 1, 2, 1, 10, 33, 12, "f32", False, None, None),
    ("gfx950", 1, 2, 2, 40, 50, 24, "bf16", True, None, None),
    ("gfx950", 1, 4, 2, 20, 40, 40, "f16", False, "add", "cap"),  # GQA 2 + Gemma-2 soft-cap
    ("gfx942", 1, 8, 1, 33, 20, 8, "bf16", True, None, "hs"),     # MQA + per-head scale
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,dtype,causal,mask,opt", FAST)
def test_attention(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt):
    run_case(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt=opt)


@pytest.mark.parametrize("arch,B,H,Hkv,Sq,Sk,D,dtype,causal,mask,opt", FAST_ONE_ARCH)
def test_attention_options(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt):
    run_case(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt=opt)


def _sweep():
    for B, H, Sq, Sk, D in itertools.product((1, 2), (1, 4), (1, 17, 64, 130), (1, 17, 64, 130), (32, 64, 80, 128)):
        for Hkv in sorted({1, H}):
            for dtype, causal, mask in itertools.product(DTYPES, (False, True), (None, "bool", "add")):
                yield B, H, Hkv, Sq, Sk, D, dtype, causal, mask, None
    # issue #15: head dims 8..256 (padded ones), GQA ratios 1, 4, 8 and MQA, soft-cap, per-head scale
    for D, (H, Hkv), (Sq, Sk), opt in itertools.product((8, 16, 24, 40, 64, 128, 256), ((8, 8), (8, 2), (8, 1)),
                                                        ((1, 77), (33, 70), (70, 33)), (None, "cap", "hs")):
        for dtype, causal in (("bf16", True), ("f32", False)):
            yield 1, H, Hkv, Sq, Sk, D, dtype, causal, None, opt


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,dtype,causal,mask,opt", list(_sweep()))
def test_attention_sweep(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt):
    run_case(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, opt=opt)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("D", [64, 128])
def test_decode_split_is_the_models_and_covers_every_key(arch, D):
    """B=1, H=32, Sq=1, Sk=4096: the KV split is the timing MODEL's cheapest (split_model.model_split; the
    grid rule, 2x the CUs, without features), its slices cover the keys (plan only, no launch)."""
    from translator_kernels.attention.split_model import model_split

    nsplit, chunk = split_geometry(1, 32, 1, 4096, D, "bf16", arch)
    assert (nsplit, chunk) == model_split(1, 32, 1, 4096, D, "bf16", arch) and nsplit > 1
    assert nsplit * chunk >= 4096 > (nsplit - 1) * chunk


@pytest.mark.parametrize("arch,B,H,Hkv,Sq,Sk,D,dtype,causal,mask,splits", [
    ("gfx942", 1, 2, 1, 1, 300, 64, "bf16", False, None, None),   # MQA decode: splits by itself (5 slices)
    ("gfx950", 1, 2, 2, 3, 200, 40, "f32", True, "bool", None),   # padded D, causal, a fully masked row
    ("gfx942", 1, 2, 1, 40, 150, 24, "bf16", True, None, 3),      # forced: LDS path, empty causal slices
])
@pytest.mark.flysim_only("reads each launch's grid")
def test_split_kv_on_flysim(arch, B, H, Hkv, Sq, Sk, D, dtype, causal, mask, splits):
    q, k, v, m = make_inputs(B, H, Hkv, Sq, Sk, D, dtype, mask)
    out, launches = _run(arch, attention, q, k, v, mask=m, causal=causal, num_splits=splits)
    (fwd,) = launches  # the slices combine inside the launch (no second kernel)
    pk = pack_group(H, Hkv, Sq, causal=causal, head_scale=None)  # decode GQA: a KV group's heads share a block
    nsplit, _ = split_geometry(B, H // pk, Sq * pk, Sk, D, dtype, arch, splits)
    assert nsplit > 1 and fwd.kernel.startswith("attention_fwd")
    assert fwd.grid[0] % nsplit == 0 and fwd.grid[1:] == (H // pk, B)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), reference(q, k, v, m, causal), atol=atol, rtol=rtol)


@pytest.mark.parametrize("arch,H,Hkv,Sq,Sk,D,causal", [("gfx942", 2, 1, 256, 256, 64, True),
                                                       ("gfx950", 1, 1, 128, 200, 40, False)])
@pytest.mark.flysim_only("reads flysim's counted global bytes")
def test_global_bytes_at_the_compulsory_bound(arch, H, Hkv, Sq, Sk, D, causal):
    """flysim's counted global bytes <= Q read once (its padding columns included: they load
    column 0, then zero) + O written once + per query block its key range (causal: up to the
    block's last row) in whole KV tiles, each K / V row read once: no tile is prefetched past
    the last one, and no chunk of a tile is read twice (D=40: 5 chunks a row, 320 a tile, for
    256 threads)."""
    q, k, v, _ = make_inputs(1, H, Hkv, Sq, Sk, D, "bf16", None)
    cfg = attention_config("bf16", D, Sq, arch, causal)
    bm, bn = cfg["block_m"], cfg["block_n"]
    assert cfg["use_lds"] and Sq % bm == 0  # the prefetching path; no clamped query rows
    keys = sum(-(-min(Sk, (i + 1) * bm if causal else Sk) // bn) * bn for i in range(Sq // bm))
    bound = (Sq * (-(-D // 16) * 16 + D) * H + 2 * keys * D * Hkv * (H // Hkv)) * 2
    out, (rec,) = _run(arch, attention, q, k, v, causal=causal)
    moved = rec.counters["global_bytes_read"] + rec.counters["global_bytes_written"]
    assert moved <= bound, (moved, bound)
    torch.testing.assert_close(out.float(), reference(q, k, v, None, causal), atol=TOL["bf16"][0], rtol=TOL["bf16"][1])


@pytest.mark.parametrize("arch,dtype", [("gfx942", "bf16"), ("gfx950", "bf16"), ("gfx950", "f32")])
@pytest.mark.parametrize("data", ["steady", "growing"])
@pytest.mark.flysim_only("reads flysim's op and region counters")
def test_rescale_only_when_a_row_max_outgrows_the_reference(arch, dtype, data):
    """Unmasked tiles rescale O and l (RG exp2 for alpha, then the multiplies) only when some row
    of the wave outgrows its reference max by more than RESCALE_TAU. The first unmasked tile is
    peeled and sets the reference with no rescale, so steady scores never rescale (before the
    peel: once, at the first tile); keys scaled up along the sequence rescale at every later
    unmasked tile, while the rows of group 0 (q near zero) never grow and must keep alpha = 1.
    Counted by flysim's executed math.exp2 ops (one workgroup: Sq = its block of rows) and its
    region_waves counter of the rescale branch; Sk = 250 leaves one masked tail tile (m handed
    over between the loops)."""
    Sq, Sk, D = 128 if dtype != "f32" else 64, 250, 64
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, Sq, D, generator=g)
    k = torch.randn(1, 1, Sk, D, generator=g)
    v = torch.randn(1, 1, Sk, D, generator=g).to(DTYPES[dtype])
    if data == "growing":
        k = k * (0.2 + 0.25 * torch.arange(Sk)).view(1, 1, -1, 1)  # the row max grows ~29 (log2) a 32-key tile
        q[:, :, (torch.arange(Sq) // 16) % 2 == 0] *= 0.01
    q, k = q.to(DTYPES[dtype]), k.to(DTYPES[dtype])
    cfg = attention_config(dtype, D, Sq, arch)
    rg, nt, bn = cfg["rows_per_wave"] // 16, cfg["n_tiles"], cfg["block_n"]
    assert Sq == cfg["block_m"]
    full, tail = Sk // bn, int(Sk % bn > 0)
    rescales = full - 1 if data == "growing" else 0
    want = (full + tail) * rg * nt * 4 + rg * (rescales + tail)
    with executors.current().run(arch, count_regions=True) as sim:  # counts the rescale branch's waves
        out = attention(q, k, v)
    (rec,) = sim.launches
    assert rec.counters["ops_by_kind"]["math.exp2"] == want, (rec.counters["ops_by_kind"]["math.exp2"], want)
    waves = Sq // cfg["rows_per_wave"]
    growing = waves if rg == 2 else waves // 2  # waves holding an odd (unshrunk) 16-row group
    assert rescale_counts(rec) == {"rescale_waves": rescales * growing if data == "growing" else 0,
                                   "loop_waves": (full - 1) * waves, "peeled_waves": waves}, rescale_counts(rec)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), reference(q, k, v, None, False), atol=atol, rtol=rtol)


def test_custom_scale_and_strided_inputs():
    """Non-contiguous q/k/v (a [B, S, H, D] buffer transposed, as models write it) and a scale."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 33, 4, 64, generator=g).bfloat16().transpose(1, 2)
    k = torch.randn(2, 45, 2, 64, generator=g).bfloat16().transpose(1, 2)
    v = torch.randn(2, 45, 2, 64, generator=g).bfloat16().transpose(1, 2)
    out, launches = _run("gfx942", attention, q, k, v, causal=True, scale=0.3)
    assert len(launches) == 1
    torch.testing.assert_close(out.float(), reference(q, k, v, None, True, 0.3), **op_tol(torch.bfloat16))


@pytest.mark.parametrize("arch,dtype,causal,opt", [("gfx942", "bf16", True, None), ("gfx950", "f32", False, "hs")])
def test_negative_scale(arch, dtype, causal, opt):
    """The kernel takes the row max of raw scores and folds the scale into exp2's fma, which needs
    scale > 0: a negative one (or a negative per-head scale) flips Q's sign bits instead."""
    q, k, v, _ = make_inputs(1, 2, 2, 40, 70, 64, dtype, None)
    kw = {"scale": -0.2}
    if opt == "hs":
        kw["head_scale"] = torch.tensor([-1.5, 2.0])
    out, launches = _run(arch, attention, q, k, v, causal=causal, **kw)
    assert len(launches) == 1
    # the explicit reference (torch's SDPA masks before a negative scale: -inf * -0.2 = inf, NaN rows)
    ref = reference(q, k, v, None, causal, scale=kw["scale"], head_scale=kw.get("head_scale", torch.ones(2)))
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype][0], rtol=TOL[dtype][1])


def test_fully_masked_rows_are_zero():
    q, k, v, _ = make_inputs(1, 1, 1, 5, 20, 64, "f32", None)
    mask = torch.zeros(5, 20)
    mask[2] = float("-inf")
    out, _ = _run("gfx950", attention, q, k, v, mask=mask)
    assert torch.all(out[0, 0, 2] == 0)
    torch.testing.assert_close(out, reference(q, k, v, mask, False), **op_tol(torch.float32))


def test_fp32_inputs_with_bf16_precision():
    q, k, v, _ = make_inputs(1, 2, 2, 17, 33, 64, "f32", None)
    out, _ = _run("gfx942", attention, q, k, v, causal=True, precision="bf16")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference(q, k, v, None, True), **op_tol(torch.bfloat16))


@pytest.mark.parametrize("kwargs,shapes,match", [
    ({}, ((1, 1, 8, 264), (1, 1, 8, 264)), "head_dim 264"),
    ({}, ((1, 1, 8, 4), (1, 1, 8, 4)), "head_dim 4"),
    ({"softcap": 0.0}, ((1, 1, 8, 64), (1, 1, 8, 64)), "softcap"),
    ({"head_scale": torch.ones(3)}, ((1, 2, 8, 64), (1, 2, 8, 64)), "per head"),
    ({}, ((1, 3, 8, 64), (1, 2, 8, 64)), "must divide"),
    ({"mask": torch.zeros(3, 9)}, ((1, 1, 8, 64), (1, 1, 8, 64)), "does not broadcast"),
    ({"mask": torch.zeros(8, 8, dtype=torch.int32)}, ((1, 1, 8, 64), (1, 1, 8, 64)), "mask dtype"),
    ({"precision": "fp8"}, ((1, 1, 8, 64), (1, 1, 8, 64)), "precision"),
])
def test_validation_errors(kwargs, shapes, match):
    q = torch.zeros(shapes[0])
    k = torch.zeros(shapes[1])
    with pytest.raises(ValueError, match=match):
        attention(q, k, k, **kwargs)


def test_dtype_mismatch_error():
    q = torch.zeros(1, 1, 8, 64)
    with pytest.raises(ValueError, match="dtypes differ"):
        attention(q, q.bfloat16(), q)
