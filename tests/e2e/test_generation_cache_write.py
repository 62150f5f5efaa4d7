"""The state write as a FlyDSL kernel, in place (issue 23 item 1): `cache[:, :, pos] = k`,
`index_copy_` and a slice `copy_` become `flydsl.cache_write`, the scatter kernel, writing the one
storage the state contract names (translate: the module's copy; torch.compile: the user's buffer).

Evidence per form, on flysim: the translated steps return eager's values, the cache afterwards
holds eager's cache, each step launched the scatter kernel (launch records), and the report has
no state write left in PyTorch. The decoder-sized run (models/_static_cache_decoder.py) is the slow
test at the end; tests/kernels/test_scatter.py covers the kernel alone."""

from __future__ import annotations

import pytest
import torch

import translator
from translator.frontends import compile_backend

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/e2e/conftest.py
WRITES = ("aten.index_put_", "aten.index_copy_", "aten.copy_")


class _KV(torch.nn.Module):
    """A projection written into a [1, 2, 16, 4] cache buffer, then a read of the whole cache."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.register_buffer("cache", torch.zeros(1, 2, 16, 4))

    def forward(self, x, pos):
        k = self.proj(x).view(1, x.shape[1], 2, 4).transpose(1, 2)
        if self.form == "index_put":
            self.cache[:, :, pos] = k
        elif self.form == "index_copy":
            self.cache.index_copy_(2, pos, k)
        else:  # a slice assignment: copy_ into a view of the buffer
            self.cache[:, :, 4:4 + x.shape[1]] = k
        return self.cache.sum(2) * 1


def _steps():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 3, 8, generator=g), torch.arange(3))] + \
        [(torch.randn(1, 1, 8, generator=g), torch.tensor([3 + i])) for i in range(2)]


def _eager(form):
    torch.manual_seed(0)
    m = _KV(form).eval()
    with torch.no_grad():
        outs = [m(*s) for s in _steps()]
    return outs, m.cache.clone()


def _kernels(records):
    return [r.kernel.split("_kernel")[0] for r in records]


@pytest.mark.parametrize("form", ["index_put", "index_copy", "slice"])
def test_translate_writes_the_cache_with_the_scatter_kernel(form):
    want, cache = _eager(form)
    torch.manual_seed(0)
    m = _KV(form).eval()
    steps = _steps()
    tm = translator.translate(m, steps[0], backend="flysim")
    assert tm.report.verification.passed
    writes = [r for r in tm.report.rows if r.op in WRITES]
    assert writes and all(r.where == "flydsl-kernel" and "cache_write" in r.detail for r in writes), \
        [(r.op, r.where, r.detail) for r in writes]
    with torch.no_grad():
        for s, w in zip(steps, want):
            torch.testing.assert_close(tm(*s), w)
            assert "scatter" in _kernels(tm.last_launches)
    torch.testing.assert_close(tm.state_dict()["cache"], cache)
    assert float(m.cache.abs().max()) == 0, "translate() wrote the user's buffer"


def test_compile_writes_the_users_buffer_with_the_scatter_kernel():
    want, cache = _eager("index_put")
    torch.manual_seed(0)
    m = _KV("index_put").eval()
    user = m.cache
    cm = torch.compile(m, backend="flydsl", options={"backend": "flysim"})
    with torch.no_grad():
        for s, w in zip(_steps(), want):
            torch.testing.assert_close(cm(*s), w)
    assert m.cache is user
    torch.testing.assert_close(user, cache)
    recs = compile_backend.reports()
    assert sum(r.calls_translated for r in recs) == 3 and not any(r.calls_pytorch for r in recs)
    assert all("scatter" in _kernels(r.translated[-1].last_launches) for r in recs)


class _Fresh(torch.nn.Module):
    """A cache made in forward and written by index_copy_ (HF's StaticCache when the prefill graph
    allocates it): functionalization makes the write out of place; the cache is an output."""

    def __init__(self, also_read: bool = False):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.also_read = also_read

    def forward(self, x, pos):
        k = self.proj(x).view(1, x.shape[1], 2, 4).transpose(1, 2)
        cache = torch.zeros(1, 2, 16, 4)
        before = cache.sum() if self.also_read else None  # read before the write: not fresh for it
        cache.index_copy_(2, pos, k)
        out = cache.sum(2) * 1
        return (cache, out) if before is None else (cache, out + before)


@pytest.mark.parametrize("also_read", [False, True])
def test_a_write_into_a_fresh_allocation_is_in_place(also_read):
    """index_copy(zeros(...), ...): the scatter kernel writes the zeros the graph allocated (no clone of
    the cache), a fresh one each call (two calls' caches are two storages); with another reader of the
    allocation the functional form stays as it was."""
    torch.manual_seed(0)
    m = _Fresh(also_read).eval()
    x, pos = torch.randn(1, 3, 8), torch.tensor([2, 5, 9])
    want = m(x, pos)
    tm = translator.translate(m, (x, pos), backend="flysim")
    assert tm.report.verification.passed
    fresh = [r for r in tm.report.rows if r.op == "aten.index_copy_"]
    got1, got2 = tm(x, pos), tm(x, pos)
    for got in (got1, got2):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    assert got1[0].data_ptr() != got2[0].data_ptr()  # each call its own cache
    in_kernel = fresh and all(r.where == "flydsl-kernel" and "cache_write" in r.detail for r in fresh)
    assert bool(in_kernel) == (not also_read), [(r.op, r.where, r.detail) for r in tm.report.rows]
    assert ("scatter" in _kernels(tm.last_launches)) == (not also_read)
