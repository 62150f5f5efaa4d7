"""translator_kernels.replay: a host entry's planning runs once per call signature; replays give the
same outputs and the same launches as the adapter itself, on flysim and on the rocm path (device call
recorded); the tests that need no flysim record run on the session's executor (tests/executors.py)."""

import ctypes

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
import translator.lowerings  # noqa: F401 - fills the registry: FAMILIES is read at collection
from translator.registry import FAMILIES
from translator.runtime.stub import rocm_recorded
from translator_kernels import launch as kl
from translator_kernels import replay
from translator_kernels.attention import attention
from translator_kernels.gemm import bmm, gemm
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import GemmConfig
from translator_kernels.codegen.elementwise import fused_elementwise
from translator_kernels.codegen.host import record_kernels
from translator_kernels.program import Program
from translator_kernels.rows.softmax import softmax

ARCH = "gfx942"


class Counted:
    """An adapter that counts its own runs (a replayed call never enters it)."""

    def __init__(self, fn):
        self.fn, self.runs = fn, 0
        self.__qualname__ = getattr(fn, "__qualname__", "fn")

    def __call__(self, *args, **kwargs):
        self.runs += 1
        return self.fn(*args, **kwargs)


def _records(sim, start):
    return [(r.kernel, r.grid, r.block, r.arch, r.counters) for r in sim.launches[start:]]


def _flat(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _same(a, b):
    if a is None or b is None:  # an op that writes its argument in place (flydsl.cache_write) returns nothing
        assert a is b
        return
    a, b = _flat(a), _flat(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.shape, x.stride(), x.dtype) == (y.shape, y.stride(), y.dtype)
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def _check_plan_matches_adapter(fn, args, kwargs=None, no_alias=False):
    """The adapter run directly, then through replay.call: first sight (runs the adapter), the second
    call (builds the plan), the third (replays it, with the same tensors): identical outputs and
    identical flysim launch records; the replay never enters the adapter."""
    kwargs = kwargs or {}
    adapter = Counted(fn)
    with executors.current().run(ARCH) as sim:
        direct = fn(*args, **kwargs)
        want = _records(sim, 0)
        replay.call(adapter, args, kwargs, no_alias)
        n = len(sim.launches)
        built = replay.call(adapter, args, kwargs, no_alias)
        m = len(sim.launches)
        replayed = replay.call(adapter, args, kwargs, no_alias)
        got_built, got_replayed = _records(sim, n)[: m - n], _records(sim, m)
    assert want and got_built == want and got_replayed == want
    assert adapter.runs == 2, "the third call with this signature must replay the plan"
    _same(direct, built)
    _same(direct, replayed)


@pytest.mark.flysim_only("compares flysim's launch records (grid, block, counters)")
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_plan_matches_its_adapter_on_flysim(name):
    fam = FAMILIES[name]
    args = fam.sample_inputs(torch.float32)
    _check_plan_matches_adapter(fam.kernel, args, no_alias=True)  # how runtime.ops.dispatch calls it


def _gemm_operands(m=5, n=48, k=64):
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    return a, shuffle_weight(w), torch.randn(n, generator=g), torch.randn(m, n, generator=g)


@pytest.mark.flysim_only("compares flysim's launch records (grid, block, counters)")
@pytest.mark.parametrize("case", ["epilogue_residual", "split_k", "bmm_shuffled", "attention_split_kv",
                                  "attention_bool_mask"])
def test_host_entry_variants_plan_matches_adapter(case):
    g = torch.Generator().manual_seed(2)
    if case == "epilogue_residual":
        a, ws, b, r = _gemm_operands()
        _check_plan_matches_adapter(gemm.__wrapped__, (a, ws, 48, 64),
                                    dict(bias=b, activation="gelu", residual=r, scale=0.5))
    elif case == "split_k":
        a, ws, b, _ = _gemm_operands(m=2, k=256)
        _check_plan_matches_adapter(gemm.__wrapped__, (a, ws, 48, 256), dict(bias=b, _config=GemmConfig(16, 64, 64, 2)))
    elif case == "bmm_shuffled":  # b's rows run along N: preshuffled per call (an op the plan replays)
        x, y = torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, 24, generator=g)
        _check_plan_matches_adapter(bmm.__wrapped__, (x, y))
    elif case == "attention_split_kv":  # decode: the keys split in slices, then the combine kernel
        q, kv = torch.randn(1, 2, 1, 32, generator=g), torch.randn(1, 2, 64, 32, generator=g)
        _check_plan_matches_adapter(attention.__wrapped__, (q, kv, kv), dict(num_splits=2))
    else:
        q, kv = torch.randn(1, 2, 8, 32, generator=g), torch.randn(1, 2, 16, 32, generator=g)
        mask = torch.rand(8, 16, generator=g) > 0.3
        mask[:, 0] = True
        _check_plan_matches_adapter(attention.__wrapped__, (q, kv, kv), dict(mask=mask))


def test_plan_is_reused_and_a_new_batch_builds_a_plan_without_a_compile():
    kl.clear()
    with executors.current().run(ARCH) as ex:
        softmax(ex.put(torch.randn(3, 256)))
        assert replay.replay_count() == 0 and kl.compiled_count() == 1  # first sight: no plan yet
        softmax(ex.put(torch.randn(3, 256)))
        plans, compiled = replay.replay_count(), kl.compiled_count()
        assert plans == 1 and compiled == 1
        for _ in range(2):
            y = torch.randn(3, 256)
            torch.testing.assert_close(softmax(ex.put(y)).cpu(), torch.softmax(y, -1))
        assert replay.replay_count() == plans  # same signature: the plan is looked up, not built
        for rows in (7, 50):  # a run-time dim: a new plan on its second call, the same compiled kernel
            for _ in range(2):
                y = torch.randn(rows, 256)
                torch.testing.assert_close(softmax(ex.put(y)).cpu(), torch.softmax(y, -1))
        assert replay.replay_count() == plans + 2 and kl.compiled_count() == compiled
    assert len(ex.launches) == 8


def _planned_double(runs: list):
    """A planned toy adapter that appends to `runs` each time it really runs."""

    @replay.replayed
    def double(x):
        runs.append(1)
        return x * 2

    return double


def test_a_signature_met_once_builds_no_plan():
    runs = []
    double = _planned_double(runs)
    for n in range(1, 6):  # a growing length: every signature new
        double(torch.randn(n))
    assert len(runs) == 5 and not any(k[0] is double.__wrapped__ for k in replay._REPLAYS)


def test_rocm_path_plan_packs_what_the_adapter_packs():
    a, ws, b, r = _gemm_operands()
    x = torch.randn(6, 128)
    with rocm_recorded(ARCH) as rec:
        for fn, args, kwargs in ((gemm, (a, ws, 48, 64), dict(bias=b, residual=r)), (softmax, (x,), {})):
            rec.clear()
            fn.__wrapped__(*args, **kwargs)
            direct = list(rec)
            rec.clear()
            for _ in range(3):  # first sight, plan built, plan replayed
                fn(*args, **kwargs)
            assert direct and list(rec) == direct * 3
    with rocm_recorded(ARCH), kl.launch_log([]) as log:
        for _ in range(3):
            softmax(x)
    assert [r.kernel for r in log] == ["softmax"] * 3


def test_rocm_path_split_k_plan_takes_counters_per_call():
    """A replayed split-K GEMM on the device path passes the counters it took for this call (the
    pool's array: gemm/splitk.py), not the array the recording took, which a launch that raised could
    have left dirty: the packed counter pointer follows the pool."""
    from translator_kernels.gemm import splitk

    class Spec(list):
        wants_spec = True

        def __call__(self, name, packed, spec):  # each packed slot's first word, read during the call
            self.append([ctypes.c_void_p.from_address(addr).value for addr in packed])

    a, ws, b, _ = _gemm_operands(m=2, k=256)
    key = (torch.device("cpu"), None)
    saved = splitk._POOL.pop(key, None)
    try:
        with rocm_recorded(ARCH, Spec()) as rec:
            for _ in range(3):  # first sight, plan built, plan replayed
                gemm(a, ws, 48, 256, bias=b, _config=GemmConfig(16, 64, 64, 2))
            fresh = torch.zeros(splitk.MIN_COUNTERS, dtype=torch.int32)
            splitk._POOL[key] = [fresh]  # as after a fault: the pool's old array was dropped
            gemm(a, ws, 48, 256, bias=b, _config=GemmConfig(16, 64, 64, 2))
        assert len(rec) == 4 and fresh.data_ptr() in rec[-1]
        assert splitk._POOL[key] == [fresh]
    finally:
        splitk._POOL.pop(key, None)
        if saved is not None:
            splitk._POOL[key] = saved


def test_same_object_twice_is_its_own_signature():
    @replay.replayed
    def add(a, b):
        return a + b

    x, y = torch.randn(4), torch.randn(4)
    for _ in range(3):  # the (x, x) plan: built, replayed
        torch.testing.assert_close(add(x, x), x + x)
    for _ in range(3):  # not the (x, x) plan: that would return x + x
        torch.testing.assert_close(add(x, y), x + y)
    torch.testing.assert_close(add(y, y), y + y)


def test_signed_zero_scalars_are_distinct_signatures():
    """0.0 == -0.0, so a signature keyed on the value alone replayed one's plan for the other:
    x / -0.0 came back +inf."""
    @replay.replayed
    def div(a, s):
        return a / s

    @replay.replayed
    def mul(a, items):
        return a * items[0]

    x = torch.tensor([1.0, -2.0])
    for _ in range(3):  # the +0.0 plan: built, replayed
        torch.testing.assert_close(div(x, 0.0), x / 0.0)
    for s in (-0.0, 0.0, -0.0):
        torch.testing.assert_close(div(x, s), x / s)
    ones = torch.ones(2)
    for _ in range(3):  # a zero nested in a list: its sign is part of the signature too
        assert not torch.signbit(mul(ones, [0.0])).any()
    assert torch.signbit(mul(ones, [-0.0])).all()
    assert replay.signature((x, 0.0), None)[0] != replay.signature((x, -0.0), None)[0]


def test_host_read_of_tensor_data_is_never_planned():
    runs = []

    @replay.replayed
    def branchy(x):
        runs.append(1)
        return x * 2 if x.sum().item() > 0 else x * 3

    pos, neg = torch.ones(3), -torch.ones(3)
    for _ in range(2):  # first sight; then the recording meets .item() and stores "no plan"
        torch.testing.assert_close(branchy(pos), pos * 2)
    torch.testing.assert_close(branchy(neg), neg * 3)
    assert len(runs) == 3
    assert [v for k, v in replay._REPLAYS.items() if k[0] is branchy.__wrapped__] == [None]


def test_autograd_and_dispatch_modes_bypass_plans():
    from torch.utils.flop_counter import FlopCounterMode

    runs = []
    double = _planned_double(runs)
    x = torch.randn(3, requires_grad=True)
    double(x)
    double(x)
    with FlopCounterMode(display=False):
        double(torch.randn(3))
        double(torch.randn(3))
    assert len(runs) == 4 and not any(k[0] is double.__wrapped__ for k in replay._REPLAYS)
    with torch.no_grad():  # no autograd to record: planned on the second call, replayed on the third
        for _ in range(3):
            double(x)
    assert len(runs) == 6


def test_no_alias_clones_a_result_rooted_in_an_argument():
    @replay.replayed(no_alias=True)
    def first_row(x):
        return x[0]

    x = torch.randn(3, 4)
    for _ in range(3):  # first sight, built, replayed
        y = first_row(x)
        torch.testing.assert_close(y, x[0])
        assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_no_alias_clones_an_unannotated_alias_and_a_copying_reshape_is_replayed():
    """_unsafe_view's schema claims a fresh result but it shares x's storage: cloned under
    no_alias. Under inference mode reshape / contiguous reach the recorder undecomposed; one that
    copied is no view of x (a replay as one read x's memory as if it were the copy)."""
    @replay.replayed(no_alias=True)
    def flat(x):
        return torch.ops.aten._unsafe_view(x, [-1])

    @replay.replayed(no_alias=True)
    def moved(x):
        return x.movedim(0, -1).reshape(-1).cumsum(0).reshape(x.shape[1], x.shape[0]).t().contiguous()

    x = torch.randn(3, 4)
    with torch.inference_mode():
        for _ in range(3):  # first sight, built, replayed
            y = flat(x)
            assert torch.equal(y, x.reshape(-1))
            assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            assert torch.equal(moved(x), moved.unreplayed(x))


def test_replay_repeats_the_generated_kernels_use_record():
    x = torch.randn(4, 64)
    prog = Program(1, (("exp", (0,), ()),), ((1, "f32"),)).text()
    with executors.current().run(ARCH) as ex:
        x = ex.put(x)
        fused_elementwise([x], prog)
        fused_elementwise([x], prog)  # builds the plan
        with record_kernels() as used:
            fused_elementwise([x], prog)  # replays it
    assert len(used) == 1
