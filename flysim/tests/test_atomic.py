"""llvm.atomicrmw: many lanes of one instruction hitting few addresses, on global memory and LDS.

The hardware serializes colliding updates in no specified order, so these tests check what
holds for every order: the final memory, and old values that chain into it.
"""

import pytest
import torch

import flysim

import flysim_kernels as K

N, BINS = 512, 8  # 4 workgroups of 128 threads, 8 addresses


def _run(kind, X, Acc, **kw):
    idx = torch.randint(0, BINS, (N,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    acc0, old = Acc.clone(), torch.zeros_like(X)
    with flysim.simulate() as sim:
        K.build_atomic(kind, **kw)(X, idx, Acc, old, N)
    return idx.long(), acc0, old, sim.launches[-1]


def _rand(lo, hi, dtype=torch.int32, seed=2):
    return torch.randint(lo, hi, (N,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32).to(dtype)


def test_add_returns_a_chain_of_old_values():
    X, Acc = _rand(1, 100), torch.full((BINS,), 5, dtype=torch.int32)
    idx, acc0, old, rec = _run("add", X, Acc)
    assert torch.equal(Acc.long(), acc0.long().index_add(0, idx, X.long()))
    for b in range(BINS):  # sorted by old value, each update starts where the previous ended
        o, x = old[idx == b].long(), X[idx == b].long()
        o, order = o.sort()
        assert o[0] == 5 and torch.equal(o[1:], (o + x[order])[:-1])
    assert rec.counters["ops_by_kind"]["llvm.atomicrmw"] == 1
    assert rec.counters["global_bytes_written"] == 2 * N * 4  # the atomics, then Old


def test_fadd_matches_float64_sum():
    X, Acc = _rand(-1000, 1000, seed=3).float() / 7, torch.ones(BINS)
    idx, acc0, old, _ = _run("fadd", X, Acc)
    torch.testing.assert_close(Acc.double(), acc0.double().index_add(0, idx, X.double()), rtol=1e-6, atol=1e-4)
    seen_initial = torch.zeros(BINS, dtype=torch.long).index_add(0, idx, (old == 1).long())
    assert (seen_initial >= 1).all()


@pytest.mark.parametrize("kind", ["max", "min", "umax", "xchg"])
def test_exchange_like_kinds_form_a_permutation(kind):
    """Per address, {old values} + {final} == {initial} + {operands}: each update saw exactly one value."""
    X, Acc = _rand(-50, 50, seed=4), torch.full((BINS,), 7, dtype=torch.int32)
    idx, acc0, old, _ = _run(kind, X, Acc)
    for b in range(BINS):
        x = X[idx == b]
        u = lambda v: v.long() & 0xFFFFFFFF  # noqa: E731
        want = {"max": torch.max(x.max(), acc0[b]), "min": torch.min(x.min(), acc0[b]),
                "umax": x[u(x).argmax()] if u(x).max() > 7 else acc0[b], "xchg": None}[kind]
        if want is not None:
            assert Acc[b] == want
        if kind == "xchg":
            got = torch.cat([old[idx == b], Acc[b:b + 1]]).sort().values
            assert torch.equal(got, torch.cat([x, acc0[b:b + 1]]).sort().values)


def test_lds_atomics_then_masked_global_atomics():
    """A per-workgroup LDS histogram, then 8 of 128 threads add it into global memory."""
    X, Acc = _rand(0, 1000, seed=5), torch.zeros(BINS, dtype=torch.int32)
    idx, _acc0, _old, rec = _run("add", X, Acc, lds_bins=BINS)
    assert torch.equal(Acc.long(), torch.zeros(BINS, dtype=torch.long).index_add(0, idx, X.long()))
    assert rec.counters["ops_by_kind"]["llvm.atomicrmw"] == 2
    assert rec.counters["lds_bytes_written"] == 4 * BINS * 4 + N * 4  # zeroing, then the atomics
    assert rec.counters["global_bytes_written"] == N * 4 + 4 * BINS * 4  # Old, then 8 lanes per workgroup


KINDS = ["add", "sub", "xchg", "and", "or", "xor", "nand", "max", "min", "umax", "umin",
         "uinc_wrap", "udec_wrap", "usub_cond", "usub_sat"]


def _one_by_one(kind, old, x):
    """LLVM's atomicrmw on i32, one update at a time, in plain Python integers."""
    u = lambda v: v & 0xFFFFFFFF  # noqa: E731
    new = {"add": old + x, "sub": old - x, "xchg": x, "and": old & x, "or": old | x, "xor": old ^ x,
           "nand": ~(old & x), "max": max(old, x), "min": min(old, x),
           "umax": old if u(old) >= u(x) else x, "umin": old if u(old) <= u(x) else x,
           "uinc_wrap": 0 if u(old) >= u(x) else u(old) + 1,
           "udec_wrap": u(x) if u(old) == 0 or u(old) > u(x) else u(old) - 1,
           "usub_cond": u(old) - u(x) if u(old) >= u(x) else u(old),
           "usub_sat": u(old) - u(x) if u(old) >= u(x) else 0}[kind]
    new = u(new)
    return new - (1 << 32) if new >= 1 << 31 else new


@pytest.mark.parametrize("kind", KINDS)
def test_serialize_matches_one_update_at_a_time(kind):
    """flysim's vectorized serialization (lane order) against a sequential loop over the same order."""
    from flysim.ops_atomic import serialize

    g = torch.Generator().manual_seed(len(kind))
    addr = torch.randint(0, 5, (200,), generator=g) * 4
    x = torch.randint(-2**31, 2**31, (200,), generator=g, dtype=torch.int64).to(torch.int32)
    if kind in ("uinc_wrap", "udec_wrap"):
        x = torch.randint(0, 40, (200,), generator=g, dtype=torch.int32)
    mem = {a: int(v) for a, v in zip(range(0, 20, 4), torch.randint(-50, 50, (5,), generator=g))}
    want_old, ref = [], dict(mem)
    for a, v in zip(addr.tolist(), x.tolist()):
        want_old.append(ref[a])
        ref[a] = _one_by_one(kind, ref[a], v)

    def read(a):
        return torch.tensor([mem[int(i)] for i in a], dtype=torch.int32)

    def write(a, vals):
        mem.update({int(i): int(v) for i, v in zip(a, vals)})

    old = serialize(kind, addr, x, read, write, 32)
    assert old.tolist() == want_old
    assert mem == ref


def test_buffer_atomic_fadd_collides_and_drops_past_num_records():
    """rocdl.raw.ptr.buffer.atomic.fadd: colliding lanes all add; lanes past num_records do nothing."""
    X = torch.randn(128)
    Idx = torch.randint(0, 8, (128,), dtype=torch.int32)
    Acc = torch.zeros(8)
    with flysim.simulate("gfx942") as sim:
        K.build_buffer_atomic_fadd(6 * 4)(X, Idx, Acc)
    ref = torch.zeros(8, dtype=torch.float64).index_add_(0, Idx.long(), X.double())
    ref[6:] = 0
    torch.testing.assert_close(Acc, ref.float(), rtol=1e-5, atol=1e-5)
    assert sim.launches[-1].counters["oob_buffer_accesses"] == int((Idx >= 6).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_buffer_atomic_vector_fadd_fmax_cmpswap(dtype):
    """buffer_atomic_pk_add (vector<2x bf16 / f16> operand), fmax and cmpswap through buffer
    descriptors of 6 pairs: colliding lanes all apply, lanes past num_records do nothing."""
    import flydsl.expr as fx
    from repro_kernels import build_buffer_atomics

    g = torch.Generator().manual_seed(3)
    X = torch.randn(256, generator=g).to(dtype)
    F = torch.randn(128, generator=g)
    Idx = torch.randint(0, 8, (128,), generator=g, dtype=torch.int32)
    Acc = torch.zeros(16, dtype=dtype)
    Mx = torch.full((8,), -100.0)
    Cas = torch.arange(8, dtype=torch.int32)
    Old = torch.full((128,), -7, dtype=torch.int32)
    with flysim.simulate("gfx950") as sim:
        build_buffer_atomics(fx.BFloat16 if dtype == torch.bfloat16 else fx.Float16, 6 * 4)(X, F, Idx, Acc, Mx, Cas, Old)
    inside = Idx < 6
    ref = torch.zeros(8, 2, dtype=torch.float64).index_add_(0, Idx[inside].long(), X.view(128, 2)[inside].double())
    torch.testing.assert_close(Acc.view(8, 2).double(), ref.to(dtype).double(), rtol=2e-2, atol=2e-2)
    mx = torch.full((8,), -100.0).scatter_reduce(0, Idx[inside].long(), F[inside], "amax")
    assert torch.equal(Mx, mx)
    for s in range(8):
        lanes = (Idx == s).nonzero().squeeze(1).tolist()
        if s >= 6:  # dropped: the slot keeps its value, the lanes get 0
            assert int(Cas[s]) == s and all(int(Old[t]) == 0 for t in lanes)
        elif lanes:  # the first lane in order swaps (finds s), the others find its tid
            assert int(Cas[s]) == lanes[0] and int(Old[lanes[0]]) == s
            assert all(int(Old[t]) == lanes[0] for t in lanes[1:])
    assert sim.launches[-1].counters["oob_buffer_accesses"] == 3 * int((~inside).sum())


@pytest.mark.parametrize("kind,dtype", [("add", torch.int32), ("sub", torch.int32), ("fadd", torch.float32),
                                        ("fsub", torch.float32)])
@pytest.mark.parametrize("spread", [4, 1 << 24])  # a dense window, and addresses too sparse for it
def test_unused_result_sum_needs_no_order(kind, dtype, spread):
    """An add / sub whose old values nobody reads (RMSNorm backward's dweight) takes the no-sort
    path: memory ends as after the one-at-a-time chain (integers wrap; floats summed in float64)."""
    from flysim.ops_atomic import serialize

    g = torch.Generator().manual_seed(spread)
    addr = torch.randint(0, 7, (300,), generator=g) * spread
    x = (torch.randint(-2**31, 2**31, (300,), generator=g, dtype=torch.int64).to(torch.int32) if dtype == torch.int32
         else torch.randn(300, generator=g))
    sign = -1 if kind.endswith("sub") else 1
    mem = {a: torch.tensor(0.25 * i).to(dtype) for i, a in enumerate(range(0, 7 * spread, spread))}
    ref = {a: v.item() for a, v in mem.items()}  # Python float (double) / int
    for a, v in zip(addr.tolist(), x.tolist()):
        ref[a] += sign * v

    def read(a):
        return torch.stack([mem[int(i)] for i in a])

    def write(a, vals):
        mem.update({int(i): v for i, v in zip(a, vals)})

    old = serialize(kind, addr, x, read, write, 32, need_old=False)
    assert (old is None) == (spread == 4)  # the sparse case falls back to the ordered chain
    for a, want in ref.items():
        if dtype.is_floating_point:
            assert mem[a].item() == torch.tensor(want, dtype=torch.float64).float().item()
        else:
            assert (int(mem[a]) - want) % (1 << 32) == 0
