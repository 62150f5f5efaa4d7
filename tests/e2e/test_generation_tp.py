"""Tensor parallel rank by rank (issue 27 item 4): the gpt-fast-style decoder sharded over W ranks
(models/_static_cache_decoder.shard: heads and MLP split, a functional all_reduce in forward hooks), on
gloo (CPU) in W forked processes. Each rank translates its own shard, with translate() or under
torch.compile(backend="flydsl"); the all_reduces stay in its graph, on the process group (the translator
never reimplements communication, and the report says they are kept by design), verification passes
against that rank's eager, and the generated tokens equal the sharded eager model's (which equal the
unsharded model's). Under torch.compile every graph dynamo hands over (prefill, decode) is translated and
no call runs in PyTorch.

Also here, in one forked process (a 1-rank gloo group; made and destroyed in the pytest process itself, a
group left later forked ranks of another file hanging): a collective whose wait the model puts after independent
compute stays overlapped (the translator moves no wait), under translate() and torch.compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import translator
from translator.frontends import compile_backend
from translator.lowerings.by_design import COLLECTIVE_WHY

from test_generation import D  # models/_static_cache_decoder.py, loaded by path

NEW = 3
CONFIGS = {2: D.TINY, 4: dataclasses.replace(D.TINY, n_kv_head=4)}  # 4 ranks: one kv head each


def _collectives_kept_by_design(tm, layers):
    reduces = [n for n in tm.gm.graph.nodes if "all_reduce" in str(n.target)]
    assert len(reduces) == 2 * layers, tm.gm.code  # wo's and w2's: in the graph, as written
    kept = {(r.op, r.detail) for r in tm.report.rows if "c10d" in r.op}
    assert kept == {(op, f"kept in PyTorch by design: {COLLECTIVE_WHY}")
                    for op in ("_c10d_functional.all_reduce", "_c10d_functional.wait_tensor")}, kept


def _rank(rank, store, backend, whole, mode, world):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        cfg = CONFIGS[world]
        torch.manual_seed(0)
        m = D.shard(D.Model("view", cfg).eval(), rank, world)
        prompt, pos = D.get_inputs(cfg, 4)
        D.reset_caches(m)
        want = D.generate(m, prompt, NEW)
        assert want == whole, f"rank {rank}: sharded eager {want} != unsharded {whole}"
        D.reset_caches(m)
        if mode == "translate":
            tm = translator.translate(m, (prompt, pos), backend=backend)
            tms, got = [tm], D.generate(tm, prompt, NEW)
        else:  # each graph dynamo hands over (prefill, then decode) translates on its first call
            compile_backend.reset()
            got = D.generate(torch.compile(m, backend="flydsl", options={"backend": backend}), prompt, NEW)
            recs = compile_backend.reports()
            assert len(recs) == 2 and all(r.calls_pytorch == 0 and r.translated for r in recs), compile_backend.summary()
            tms = [tm for r in recs for tm in r.translated]
        assert got == want, f"rank {rank}: {mode}d {got} != eager {want}"
        for tm in tms:
            assert tm.report.verification.passed, tm.report.verification.message
            _collectives_kept_by_design(tm, cfg.n_layer)
            assert tm.report.rank_summary()["world_size"] == world
        if backend == "flysim":
            for tm in tms:  # this rank's recorded launches: every FlyDSL op's row comes from one, GEMMs among them
                assert not [r.node for r in tm.report.rows if r.where in ("flydsl-reference", "flydsl-op")], \
                    f"rank {rank}: {[(r.node, r.where) for r in tm.report.rows]}"
                launched = {c.family for c in tm.last_calls if c.launches}
                assert "gemm" in launched, f"rank {rank}: {launched}"
    finally:
        dist.destroy_process_group()


# 2 ranks on the reference backend take ~15 s each mode; flysim is slow (the same code paths; 4 ranks on flysim:
# 27 s translate, 34 s compile on 2 shared cores)
@pytest.mark.parametrize("mode,backend,world", [
    ("translate", "reference", 2), ("compile", "reference", 2),
    pytest.param("translate", "flysim", 2, marks=pytest.mark.slow),
    pytest.param("compile", "flysim", 2, marks=pytest.mark.slow),
    pytest.param("translate", "flysim", 4, marks=pytest.mark.slow),
    pytest.param("compile", "flysim", 4, marks=pytest.mark.slow),
])
def test_ranks_translate_and_generate_like_their_eager(tmp_path, mode, backend, world):
    torch.manual_seed(0)
    cfg = CONFIGS[world]
    m = D.Model("view", cfg).eval()
    whole = D.generate(m, D.get_inputs(cfg, 4)[0], NEW)
    mp.start_processes(_rank, args=(str(tmp_path / "store"), backend, whole, mode, world), nprocs=world,
                       start_method="fork")


class Overlapped(nn.Module):
    """The all_reduce is issued, independent compute runs, then the wait: the overlap the model wrote."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x, y):
        h = torch.ops._c10d_functional.all_reduce(self.a(x), "sum", "0")
        g = torch.relu(self.b(y))
        return torch.ops._c10d_functional.wait_tensor(h) + g


class OverlappedSibling(Overlapped):
    """b reads a's input: the sibling-linear merge (lowerings/qkv.py) must not pull b's GEMM before the issue."""

    def forward(self, x, y):
        h = torch.ops._c10d_functional.all_reduce(self.a(x), "sum", "0")
        g = torch.relu(self.b(x)) + y
        return torch.ops._c10d_functional.wait_tensor(h) + g


def _overlapped_rank(rank, store, mode, cls):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    compile_backend.reset()  # a forked rank starts with the parent's records
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=1)
    try:
        _check_overlapped(mode, cls)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["translate", "compile"])
@pytest.mark.parametrize("cls", [Overlapped, OverlappedSibling])
def test_an_overlapped_collective_stays_overlapped(tmp_path, mode, cls):
    mp.start_processes(_overlapped_rank, args=(str(tmp_path / "store"), mode, cls), nprocs=1, start_method="fork")


def _check_overlapped(mode, cls):
    torch.manual_seed(0)
    m = cls().eval()
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    if mode == "translate":
        tm = translator.translate(m, (x, y), backend="reference")
    else:
        with torch.no_grad():
            torch.compile(m, backend="flydsl", options={"backend": "reference"})(x, y)
        (rec,) = compile_backend.reports()
        (tm,) = rec.translated
    assert tm.report.verification.passed
    order = [str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"]
    issue, wait = order.index("_c10d_functional.all_reduce.default"), order.index("_c10d_functional.wait_tensor.default")
    between = order[issue + 1:wait]
    assert "flydsl.gemm.default" in between, order  # b's GEMM (with its relu) runs while the all_reduce flies
    kept = {r.op: r.detail for r in tm.report.rows if r.where == "pytorch" and not r.layout}
    assert kept == {"_c10d_functional.all_reduce": f"kept in PyTorch by design: {COLLECTIVE_WHY}",
                    "_c10d_functional.wait_tensor": f"kept in PyTorch by design: {COLLECTIVE_WHY}"}, kept
