"""The layout kernel on the session's executor (tests/executors.py): one launch per data-movement op, bit-exact against eager over
dtypes (f32, bf16, f16, int64, bool), odd shapes, negative shifts and pads, strided sources,
unfold with step > size; out-of-range indices raise and are never read; 128-bit vectors where
the map allows. The default set is small; `-m slow` runs the whole table on both archs."""

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
import translator_kernels.layout as L
from translator_kernels.errors import KernelInputError
from translator_kernels.layout.kernel import Layout, SrcDim

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]


def _data(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype == torch.int64:
        return torch.randint(-2**40, 2**40, shape, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


IDS = torch.tensor([4, 0, 6, 6, 2])
IDS2 = torch.tensor([[1, -1], [0, -7]])

# (name, kernel call, eager reference): x is the [7, 10] source of the case's dtype
CASES = [
    ("pad", lambda x: L.pad(x, (1, 3, 2, -1), "constant", 1), lambda x: F.pad(x, (1, 3, 2, -1), value=1)),
    ("pad_crop", lambda x: L.pad(x, (-2, -3)), lambda x: F.pad(x, (-2, -3))),
    ("pad_vec", lambda x: L.pad(x[:, :8], (8, 0)), lambda x: F.pad(x[:, :8], (8, 0))),
    ("roll", lambda x: L.roll(x, [-3, 12], [1, 0]), lambda x: torch.roll(x, (-3, 12), (1, 0))),
    ("repeat", lambda x: L.repeat(x, [2, 3, 1]), lambda x: x.repeat(2, 3, 1)),
    ("expand", lambda x: L.expand(x[:, 3:4], [2, 7, 5]), lambda x: x[:, 3:4].expand(2, 7, 5)),
    ("expand_t", lambda x: L.expand(x.t()[None], [3, 10, 7]), lambda x: x.t()[None].expand(3, 10, 7)),
    ("index_select", lambda x: L.index_select(x, 0, IDS), lambda x: x.index_select(0, IDS)),
    ("index", lambda x: L.index(x, 1, IDS2), lambda x: x[:, IDS2]),
    ("expand_splat", lambda x: L.expand(x[:, 3:4], [2, 7, 8]), lambda x: x[:, 3:4].expand(2, 7, 8)),
    ("unfold", lambda x: L.unfold(x, 1, 3, 2), lambda x: x.unfold(1, 3, 2)),
    ("unfold_vec", lambda x: L.unfold(x, 1, 4, 4), lambda x: x.unfold(1, 4, 4)),
    ("unfold_gap", lambda x: L.unfold(x, 0, 2, 3), lambda x: x.unfold(0, 2, 3)),  # step > size
    ("repeat_interleave", lambda x: L.repeat_interleave(x, 3, 0), lambda x: x.repeat_interleave(3, 0)),
]
FAST = {("pad", torch.float32), ("roll", torch.int64), ("repeat", torch.bfloat16), ("expand_t", torch.bool),
        ("index", torch.float16), ("unfold_gap", torch.float32), ("repeat_interleave", torch.int64),
        ("pad_vec", torch.float16), ("index_select", torch.bool), ("expand_splat", torch.float32),
        ("unfold_vec", torch.bfloat16)}
PARAMS = [pytest.param(name, call, ref, dt, marks=() if (name, dt) in FAST else pytest.mark.slow,
                       id=f"{name}-{str(dt)[6:]}") for name, call, ref in CASES for dt in DTYPES]


def _run(call, x, arch):
    with executors.current().run(arch) as ex:
        out = call(ex.put(x))
    assert [r.kernel.split("_kernel")[0] for r in ex.launches] == ["layout"]
    return out.cpu()


@pytest.mark.parametrize("name,call,ref,dtype", PARAMS)
def test_layout_op_matches_eager(name, call, ref, dtype, request):
    arch = "gfx950" if request.node.get_closest_marker("slow") else "gfx942"
    x = _data((7, 10), dtype)
    out, want = _run(call, x, arch), ref(x)
    assert out.dtype == want.dtype and out.shape == want.shape and out.is_contiguous()
    assert torch.equal(out, want), f"{name} {dtype}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes(mode, arch):
    x = _data((2, 5, 9), torch.float32)
    assert torch.equal(_run(lambda t: L.pad(t, (3, 2, 1, 4), mode), x, arch), F.pad(x, (3, 2, 1, 4), mode=mode))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_mode_fast(mode):
    x = _data((1, 3, 6), torch.bfloat16)
    assert torch.equal(_run(lambda t: L.pad(t, (2, 3), mode), x, "gfx942"), F.pad(x, (2, 3), mode=mode))


@pytest.mark.parametrize("dtype,value", [(torch.float16, -2.5), (torch.int64, -(2**40) - 3), (torch.bool, True)])
def test_fill(dtype, value):
    with executors.current().run("gfx942") as ex:
        out = L.fill([3, 33], value, dtype, device=ex.device)
    assert len(ex.launches) == 1
    assert torch.equal(out.cpu(), torch.full((3, 33), value, dtype=dtype))


def test_nan_payload_and_negative_zero_move_bit_exact():
    x = torch.tensor([float("nan"), -0.0, float("-inf"), 1.0]).view(torch.int32)
    x[0] = 0x7FC00123  # a NaN with a payload
    x = x.view(torch.float32)
    out = _run(lambda t: L.roll(t, [1], [0]), x, "gfx942")
    assert torch.equal(out.view(torch.int32), torch.roll(x, 1).view(torch.int32))


@pytest.mark.parametrize("ids,bad", [(torch.tensor([1, 7, 2]), 7), (torch.tensor([-1]), -1), (torch.tensor([2**33]), 2**33)])
def test_index_select_out_of_range_raises_and_is_never_read(ids, bad):
    x = _data((7, 10), torch.float32)
    with executors.current().run("gfx942") as ex, pytest.raises(IndexError, match=f"index {bad} is out of range"):
        L.index_select(ex.put(x), 0, ex.put(ids))
    assert len(ex.launches) == 1  # the kernel ran (flysim checks every access) and flagged it


def test_index_wraps_negative_ids_and_rejects_below_minus_size():
    x = _data((4, 6), torch.float32)
    ids = torch.tensor([-4, 3], dtype=torch.int32)
    assert torch.equal(_run(lambda t: L.index(t, 0, ids.to(t.device)), x, "gfx942"), x[ids.long()])
    with executors.current().run("gfx942") as ex, pytest.raises(IndexError, match="index -5 is out of range"):
        L.index(ex.put(x), 0, ex.put(torch.tensor([0, -5])))


def test_vectors_are_128_bit_where_the_map_allows():
    x = torch.randn(8, 64)
    lay = Layout((8, 128), 32, (SrcDim(8, ((0, 1, 1),)), SrcDim(64, ((1, 1, 1),), -32, "fill")), (64, 1))
    assert lay.vectorizable(4)
    assert not Layout((8, 130), 32, lay.src, (64, 1)).vectorizable(4)  # 130 rows split vectors of 4
    assert Layout((8, 130), 32, lay.src, (64, 1)).vectorizable(2)
    odd = Layout((8, 126), 32, (SrcDim(8, ((0, 1, 1),)), SrcDim(64, ((1, 1, 1),), -31, "fill")), (64, 1))
    assert not odd.vectorizable(2)  # a pad of 31 splits vectors
    interleave = Layout((8, 128), 32, (SrcDim(8, ((0, 1, 1),)), SrcDim(64, ((1, 1, 2),))), (64, 1))
    assert not interleave.vectorizable(2)
    splat = Layout((8, 128), 32, (SrcDim(8, ((0, 1, 1),)), SrcDim(1)), (1, 1))
    assert splat.vectorizable(4) and not splat.reads_last()  # expand [8, 1] -> [8, 128]: one load, splat
    windows = Layout((3, 8), 32, (SrcDim(32, ((0, 8, 1), (1, 1, 1))),), (1,))
    assert windows.vectorizable(4) and not Layout((3, 8), 32, (SrcDim(32, ((0, 6, 1), (1, 1, 1))),), (1,)).vectorizable(4)
    out = _run(lambda t: L.pad(t, (32, 32)), x, "gfx942")
    assert torch.equal(out, F.pad(x, (32, 32)))


@pytest.mark.parametrize("call,match", [
    (lambda x: L.pad(x, (1,)), "pad values"),
    (lambda x: L.pad(x, (7, 0), "reflect"), "reflect pad"),
    (lambda x: L.roll(x, [1], []), "one dim per shift"),
    (lambda x: L.expand(x, [3, 4]), "cannot expand"),
    (lambda x: L.index_select(x, 0, torch.tensor([0.0])), "int64 or int32"),
    (lambda x: L.unfold(x, 1, 9, 1), "do not fit"),
    (lambda x: L.pad(x.to(torch.complex64), (1, 1)), "complex64 is not supported"),
])
def test_bad_input_is_one_clear_error(call, match):
    with pytest.raises(KernelInputError, match=match):
        call(torch.randn(5, 6))


def test_empty_output_launches_nothing():
    with executors.current().run("gfx942") as ex:
        out = L.index_select(ex.put(torch.randn(4, 3)), 0, ex.put(torch.tensor([], dtype=torch.int64)))
    assert out.shape == (0, 3) and not ex.launches


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_isa_no_spills_and_128_bit_accesses(arch):
    from translator_kernels.measure.layout_isa import isa_rows

    rows = isa_rows(arch)
    assert all("error" not in r and r["spills"] == 0 for r in rows.values()), rows
    for name, r in rows.items():
        if "reflect" not in name:  # reflect reverses the order along the last dim: element accesses
            assert "buffer_store_dwordx4" in r["stores"], name


def test_a_repeated_call_plans_nothing(monkeypatch):
    planned = []
    real = L._geometry_roll
    monkeypatch.setattr(L, "_geometry_roll", lambda *a: planned.append(a) or real(*a))
    x = torch.randn(3, 11)
    with executors.current().run("gfx942") as ex:
        first, again = L.roll(ex.put(x), [4], [1]).cpu(), L.roll(ex.put(x + 1), [4], [1]).cpu()
    assert len(planned) == 1 and len(ex.launches) == 2
    assert torch.equal(first, torch.roll(x, 4, 1)) and torch.equal(again, torch.roll(x + 1, 4, 1))
