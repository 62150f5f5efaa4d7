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
