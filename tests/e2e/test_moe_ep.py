"""Expert parallel rank by rank (tests/e2e/moe_ep_worker.py): W ranks on gloo, each translating and
verifying its own share of the experts; the all_reduce stays in each rank's graph."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("moe_ep_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(backend: str, world: int, mode: str = "translate", *form) -> list[str]:
    p = subprocess.run([sys.executable, str(WORKER), backend, str(world), str(_free_port()), mode, *form],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-3000:]
    return sorted(line for line in p.stdout.splitlines() if line.startswith("rank "))


def _launched(kernels: str, backend: str) -> None:
    """The rank's recorded launches: on flysim its routing and its experts each launched FlyDSL kernels."""
    if backend == "reference":
        assert kernels == "-", kernels
        return
    assert kernels != "-", "no FlyDSL kernel launch recorded on this rank"
    counts = {f: int(n) for f, n in (item.split(":") for item in kernels.split(","))}
    assert counts.get("moe_topk", 0) >= 1 and counts.get("moe_experts", 0) >= 1, kernels


# 1.5 min each on 2 shared cores on flysim / 4 ranks: slow; test_moe.py's test_a_ranks_share_of_the_experts (one process) and
# tests/kernels/test_moe_kernels.py's test_expert_parallel_shares_add_up cover the pattern and the kernels by default
@pytest.mark.parametrize("backend,world,mode", [
    pytest.param("flysim", 2, "translate", marks=pytest.mark.slow),
    pytest.param("flysim", 4, "translate", marks=pytest.mark.slow),
    ("reference", 2, "compile"),  # torch.compile(backend="flydsl"), one graph per rank (~20 s)
    pytest.param("flysim", 2, "compile", marks=pytest.mark.slow),
    pytest.param("flysim", 4, "compile", marks=pytest.mark.slow),
])
def test_expert_parallel_ranks_translate_and_verify(backend, world, mode):
    lines = _ranks(backend, world, mode)
    assert len(lines) == world, lines
    for r, line in enumerate(lines):
        head, left, kernels, diff = line.split(" | ")
        # the loop over this rank's experts is one moe_experts (first_expert = its first expert); only the
        # collective stays in PyTorch, on the process group
        assert head == f"rank {r} ok moe_topk=1 moe_experts_loop=1", line
        assert set(left.split(",")) == {"_c10d_functional.all_reduce", "_c10d_functional.wait_tensor"}, line
        assert float(diff) < 1e-4, line
        _launched(kernels, backend)


# HF models split by transformers' own expert parallel (moe_ep_worker.hf_expert_parallel): DTensor Shard(0) experts,
# HF's masking of off-rank routes, an all_reduce. ~2 min each on 2 shared cores: slow; the one-rank test below covers
# the rewrite (localize + the sentinel-masked grouped-mm form) by default
@pytest.mark.slow
@pytest.mark.parametrize("backend,world,mode,family", [
    ("flysim", 2, "translate", "mixtral"),
    ("reference", 2, "compile", "qwen3_moe"),
    ("flysim", 2, "compile", "mixtral"),
    ("flysim", 4, "translate", "olmoe"),
    ("flysim", 4, "compile", "olmoe"),
])
def test_hf_expert_parallel_ranks(backend, world, mode, family):
    lines = _ranks(backend, world, mode, "hf", family)
    assert len(lines) == world, lines
    for r, line in enumerate(lines):
        head, left, kernels, diff, whole = line.split(" | ")
        assert head == f"rank {r} ok moe_topk=1 moe_experts=1", line  # HF's grouped-mm experts: one moe_experts
        assert set(left.split(",")) == {"_c10d_functional.all_reduce", "_c10d_functional.wait_tensor"}, line
        assert float(diff) < 1e-4 and float(whole) < 1e-4, line  # its eager, and the unsharded model
        _launched(kernels, backend)


@pytest.fixture(scope="module")
def one_rank_lines():
    """The 1-rank HF runs of the two tests below from one worker process (one start-up, transformers and the
    translator imported once): all_reduce first, as alone, then all_to_all. Its lines by their word after the rank."""
    lines = _ranks("reference", 1, "translate", "hf", "mixtral", "all_reduce,all_to_all")
    assert len(lines) == 2, lines
    return {line.split()[2]: line for line in lines}


def test_hf_expert_parallel_one_rank(one_rank_lines):
    """transformers' expert parallel on a 1-rank group (a subprocess: a process group made and destroyed in the
    pytest process left later forked ranks of test_dtensor hanging): the same graph form as W ranks (DTensor
    experts, the off-rank mask, sentinel-masked grouped-mm, all_reduce) -> moe_topk + moe_experts, only the
    collective left; the user's model keeps its DTensors."""
    line = one_rank_lines["ok"]
    head, left, kernels, diff, whole = line.split(" | ")
    _launched(kernels, "reference")
    assert head == "rank 0 ok moe_topk=1 moe_experts=1", line
    assert set(left.split(",")) == {"_c10d_functional.all_reduce", "_c10d_functional.wait_tensor"}, line
    assert float(diff) < 1e-4 and float(whole) < 1e-4, line


def test_hf_expert_parallel_other_implementations_name_the_fix(one_rank_lines):
    line = one_rank_lines["refused:"]
    assert line.startswith("rank 0 refused: InputError") and 'ep_implementation="all_reduce"' in line, line
