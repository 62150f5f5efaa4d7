"""Tensor parallel rank by rank (issue 27 item 4): the gpt-fast-style decoder sharded over 2 ranks
(models/_static_cache_decoder.shard: heads and MLP split, a functional all_reduce in forward hooks), on
gloo (CPU) in 2 forked processes. Each rank translate()s its own shard; the all_reduce stays in its graph
(the translator never reimplements communication), verification passes against that rank's eager, and
the generated tokens equal the sharded eager model's (which equal the unsharded model's)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import translator

from test_generation import D  # models/_static_cache_decoder.py, loaded by path

WORLD = 2
NEW = 3


def _rank(rank, store, backend, whole):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        m = D.shard(D.Model("view", D.TINY).eval(), rank, WORLD)
        prompt, pos = D.get_inputs(D.TINY, 4)
        D.reset_caches(m)
        want = D.generate(m, prompt, NEW)
        assert want == whole, f"rank {rank}: sharded eager {want} != unsharded {whole}"
        D.reset_caches(m)
        tm = translator.translate(m, (prompt, pos), backend=backend)
        assert tm.report.verification.passed, tm.report.verification.message
        reduces = [n for n in tm.gm.graph.nodes if "all_reduce" in str(n.target)]
        assert len(reduces) == 2 * D.TINY.n_layer, tm.gm.code  # wo's and w2's: in the graph, as written
        got = D.generate(tm, prompt, NEW)
        assert got == want, f"rank {rank}: translated {got} != eager {want}"
        if backend == "flysim":
            assert any(c.launches for c in tm.last_calls)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["reference", pytest.param("flysim", marks=pytest.mark.slow)])
def test_two_ranks_translate_and_generate_like_their_eager(tmp_path, backend):
    torch.manual_seed(0)
    m = D.Model("view", D.TINY).eval()
    whole = D.generate(m, D.get_inputs(D.TINY, 4)[0], NEW)
    mp.start_processes(_rank, args=(str(tmp_path / "store"), backend, whole), nprocs=WORLD, start_method="fork")
