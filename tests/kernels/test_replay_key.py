"""A per-call replay (translator_kernels.replay) is replayed only for calls its adapter would handle the
same way (issue 24, item 4).

The plan key holds, per tensor argument, its dtype, shape, strides, device, data-pointer alignment
and which earlier argument it is. Mutation testing showed that a key without the strides (a
transposed input replayed as the contiguous one: error 3.7) or without the dtype (an fp32 plan
replayed on bf16 data: an out-of-bounds read) passed every test, and so did a wrong batch stride in
bmm at K = 38 (error 28.5). Each has its test here, and a property test runs random strides,
dtypes, storage offsets and aliasing through one plan against the unplanned call, bit for bit.
"""

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import executors  # the session's executor (tests/executors.py)
import translator.lowerings  # noqa: F401 - registers the torch.ops.flydsl ops
from translator import runtime
from translator.registry import FAMILIES
from translator.tolerances import op_tol
from translator_kernels import replay
from translator_kernels.gemm import bmm, gemm
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.arch import DTYPE_NAMES
from translator_kernels.codegen.elementwise import fused_elementwise
from translator_kernels.rows.softmax import softmax

ARCH = "gfx942"
F32 = op_tol(torch.float32, "gemm", reduction_length=64, scale=10.0)


@pytest.fixture(autouse=True)
def _fresh_plans():
    replay.clear_replays()
    yield
    replay.clear_replays()


def _through_plan(fn, args, kwargs=None):
    """Three planned calls with the same signature (first sight, plan built, plan replayed)."""
    for _ in range(3):
        out = replay.call(fn, args, kwargs, True)
    return out


@pytest.mark.flysim_only("a wrong replay shows as an out-of-bounds access or wrong bits that flysim reports")
def test_a_plan_is_not_replayed_for_other_strides():
    """gemm's plan for a contiguous [16, 64] activation, then the same shape transposed in memory:
    the adapter makes the second contiguous (a copy); a replay of the first plan would read it as
    row-major."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g)
    ws = shuffle_weight(w)
    a = torch.randn(16, 64, generator=g)
    at = torch.randn(64, 16, generator=g).t()  # shape (16, 64), strides (1, 16)
    with executors.current().run(ARCH):
        torch.testing.assert_close(_through_plan(gemm.unreplayed, (a, ws, 48, 64)), a @ w.T, **F32)
        torch.testing.assert_close(replay.call(gemm.unreplayed, (at, ws, 48, 64), None, True), at @ w.T, **F32)
        x = torch.randn(8, 8, generator=g)
        _through_plan(softmax.unreplayed, (x,))
        xt = torch.randn(8, 8, generator=g).t()
        torch.testing.assert_close(replay.call(softmax.unreplayed, (xt,), None, True), torch.softmax(xt, -1))


@pytest.mark.flysim_only("a wrong replay shows as an out-of-bounds access or wrong bits that flysim reports")
def test_a_plan_is_not_replayed_for_another_dtype():
    """softmax's fp32 plan, then bf16 rows of the same shape: a replay would launch the fp32 kernel
    on half the bytes (an out-of-bounds read that flysim reports)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 64, generator=g)
    xb = torch.randn(6, 64, generator=g).to(torch.bfloat16)
    with executors.current().run(ARCH):
        _through_plan(softmax.unreplayed, (x,))
        got = replay.call(softmax.unreplayed, (xb,), None, True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), torch.softmax(xb.float(), -1), **op_tol(torch.bfloat16, "softmax"))


@pytest.mark.flysim_only("a wrong replay shows as an out-of-bounds access or wrong bits that flysim reports")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_batch_stride_with_a_k_tail(dtype):
    """K = 38 is padded to 40 (16-byte rows): the activation's batch stride is M x 40, not M x 38,
    and b (K not a multiple of kpack) is preshuffled per batch; 3 batches of distinct matrices,
    directly and through a replayed plan."""
    g = torch.Generator().manual_seed(2)
    a = (torch.randn(3, 7, 38, generator=g) / 6).to(dtype)
    b = torch.randn(3, 38, 24, generator=g).to(dtype)
    want = a.float() @ b.float()
    tol = op_tol(dtype, "gemm", reduction_length=38, scale=10.0)
    with executors.current().run(ARCH):
        direct = bmm(a, b)
        replayed = _through_plan(bmm.unreplayed, (a, b))
    for out in (direct, replayed):
        assert out.shape == (3, 7, 24)
        torch.testing.assert_close(out.float(), want.to(dtype).float(), **tol)


# ---- adapters that move, reshape or copy, called as the graph calls them ----------------------
def _moved(*shape, perm, seed=7):
    """A tensor of `shape` laid out as the permutation `perm` of a contiguous one (not contiguous)."""
    inv = sorted(range(len(perm)), key=perm.__getitem__)
    return torch.randn(*[shape[i] for i in perm], generator=torch.Generator().manual_seed(seed)).permute(inv)


def _op_cases():
    x = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(6))
    xt = _moved(2, 6, 5, perm=(0, 2, 1))  # [2, 6, 5] with the last two dims swapped in memory
    w, b = torch.randn(5), torch.randn(5)
    return {
        **{f"softmax_dim{d}": ("softmax", (x, d, False)) for d in (0, 1, -1)},  # moves dim last and back
        "log_softmax_dim0": ("softmax", (x, 0, True)),
        "softmax_dim1_transposed": ("softmax", (xt, 1, False)),
        "layer_norm_transposed": ("layer_norm", (xt, [5], w, b, 1e-5)),  # reshape(-1, n) copies
        "rms_norm_transposed": ("rms_norm", (xt, [5], w, 1e-6)),
        "bmm_broadcast_batch": ("bmm", (torch.randn(1, 7, 16), torch.randn(3, 16, 24))),  # expand().reshape copies
    }


@pytest.mark.flysim_only("a wrong replay shows as an out-of-bounds access or wrong bits that flysim reports")
@pytest.mark.parametrize("case", sorted(_op_cases()))
def test_moving_adapters_replay_bit_for_bit_through_the_op(case):
    """torch.ops.flydsl.<op> under the flysim backend, three times (first sight, plan built, plan
    replayed), against the adapter run directly. The op's body runs below autograd, so the plan's
    recorder sees reshape / movedim / contiguous undecomposed: their schemas say "may alias", and a
    plan that took a reshape or contiguous that copied for a view replayed softmax over dim 1 of
    [2, 6, 5] with error 0.25 (the input read as if it were already moved, the result returned as
    the kernel's rows)."""
    name, args = _op_cases()[case]
    with executors.current().run(ARCH):
        want = FAMILIES[name].kernel(*args)
    op = getattr(torch.ops.flydsl, name).default
    with runtime.use_backend("flysim", ARCH):
        got = [op(*args) for _ in range(3)]
    assert replay.replay_count() >= 1, "the second call must have built a plan"
    for out in got:
        assert (out.shape, out.stride(), out.dtype) == (want.shape, want.stride(), want.dtype)
        assert torch.equal(out, want), (out - want).abs().max().item()


# ---- property: random strides, dtypes, offsets and aliasing through one plan -------------------
ROWS, COLS = 4, 8


def _layout(kind: str, dtype, seed: int, offset: int):
    """A [ROWS, COLS] tensor of `dtype` laid out as `kind` (its own storage)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if kind == "contiguous":
        return rnd(ROWS, COLS)
    if kind == "transposed":
        return rnd(COLS, ROWS).t()
    if kind == "offset":  # storage offset (and base-address alignment) differ
        return rnd(ROWS * COLS + offset)[offset:].view(ROWS, COLS)
    if kind == "broadcast":  # one row, stride 0
        return rnd(1, COLS).expand(ROWS, COLS)
    if kind == "column-step":
        return rnd(ROWS, 2 * COLS)[:, ::2]
    return rnd(ROWS, COLS + 4)[:, offset:offset + COLS]  # "row-slice": row stride COLS + 4


KINDS = ["contiguous", "transposed", "offset", "broadcast", "column-step", "row-slice"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def calls(draw):
    """(first input, second input) of one call: the second independent, the same object, or
    another view of the first's storage (overlapping or not)."""
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    x = _layout(draw(st.sampled_from(KINDS)), dtype, seed, draw(st.integers(1, 3)))
    alias = draw(st.sampled_from(["independent", "same", "overlap", "disjoint"]))
    if alias == "independent":
        y = _layout(draw(st.sampled_from(KINDS)), draw(st.sampled_from(DTYPES)), seed + 1, draw(st.integers(1, 3)))
    elif alias == "same":
        y = x
    else:
        base = torch.randn(ROWS, 2 * COLS, generator=torch.Generator().manual_seed(seed)).to(dtype)
        x = base[:, :COLS]
        y = base[:, COLS // 2:COLS // 2 + COLS] if alias == "overlap" else base[:, COLS:]
    return x, y


def _program(x, y):
    out = "f32" if torch.float32 in (x.dtype, y.dtype) else DTYPE_NAMES[x.dtype]
    if x.dtype != y.dtype:
        out = "f32"
    return ('{"n":2,"ops":[["mul",[0,1],[]],["gelu",[2],[]]],"out":[[3,"%s"]]}' % out)


def _cases(x, y):
    """(adapter, args) pairs: softmax reads x (strides, dtype, offset); the fused elementwise
    program reads both (aliasing, and tensors inside a list argument); the softmax op's adapter
    over dim 0 moves x's dim last, reshapes (a copy unless x is transposed) and moves it back."""
    prog = _program(x, y)
    return [(softmax.unreplayed, (x,)), (fused_elementwise.unreplayed, ([x, y], prog)),
            (FAMILIES["softmax"].kernel, (x, 0, False))]


def _same(a, b):
    a = list(a) if isinstance(a, (list, tuple)) else [a]
    b = list(b) if isinstance(b, (list, tuple)) else [b]
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert (u.shape, u.dtype) == (v.shape, v.dtype)
        assert torch.equal(u, v) or (u.isnan() == v.isnan()).all() and torch.equal(u.nan_to_num(), v.nan_to_num())


@pytest.mark.flysim_only("a wrong replay shows as an out-of-bounds access or wrong bits that flysim reports")
@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking:
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # minutes under flysim
@given(first=calls(), second=calls(), inference=st.booleans())
def test_property_one_plan_never_serves_another_layout(first, second, inference):
    """Calls v1 x 3, v2 x 3, v1 through replay.call (v1's plan is built on its second call and
    replayed on its third; v2 must never be served by it, nor v1 by v2's): each result equals the
    adapter's own, bit for bit. Under inference mode (or in a custom op's body) the recorder sees
    composite ops such as reshape and contiguous undecomposed."""
    with executors.current().run(ARCH), (torch.inference_mode() if inference else contextlib.nullcontext()):
        for v1, v2 in zip(_cases(*first), _cases(*second)):
            want = {id(v): v[0](*v[1]) for v in (v1, v2)}
            for v in (v1, v1, v1, v2, v2, v2, v1):
                _same(replay.call(v[0], v[1], None, True), want[id(v)])


def test_a_view_of_a_dtype_view_follows_each_calls_storage_offset():
    """A slice of a dtype view of the input (replayed as the op) was addressed at the recorded call's
    absolute storage offset: calls on the same-shaped slice of a buffer at another offset read the
    recorded place (found through the KV-cache scatter; wrong values, silently)."""
    def f(x):
        return x.view(torch.int32)[2:6].clone()

    big = torch.arange(64, dtype=torch.float32)
    for off in (0, 16, 32, 16, 48):
        x = big[off:off + 16]
        assert torch.equal(replay.call(f, (x,), None, True), f(x)), off
    assert replay.replay_count() >= 1  # the later calls ran the replay
