"""transformers' own expert parallel compiled directly: `torch.compile(model, backend="flydsl")` on the DTensor
model, without `translator.distributed.localize`.

Each rank's model is an HF tiny MoE (tests/e2e/moe_ep_worker.py `hf_expert_parallel`: `apply_expert_parallelism`
with ep_implementation "all_reduce", DTensor Shard(0) experts, HF's masking of the other ranks' routes, an in-place
all_reduce inside an autograd Function). The backend runs dynamo's graph through AOT autograd's subclass flattening
(translator/distributed.py `desugared`): the graph translated is over the rank's local shards, its all_reduce
functional, `chunk(2, -1)` decomposed to `split`. The MoE rules take that form (docs/moe.md, "HF's expert
parallel"): the router is one `moe_topk`, the sentinel-masked grouped-mm experts one `moe_experts`, and only the
collective stays in PyTorch. Each rank's output equals its eager and the unsharded model's.

Run as a script, this file is the worker (one process per rank, gloo on the CPU):

    python tests/e2e/test_moe_ep_compile.py BACKEND WORLD PORT FAMILY [model|block]

FORM "model" compiles the whole causal LM (input ids -> logits); "block" compiles only its first layer's sparse MoE
block (the router, the DTensor experts, the all_reduce; hidden states in), four times quicker to translate.

prints one line per rank: "rank R ok COUNTERS | PYTORCH OPS | MOE LAUNCHES | LOCALIZED MOE LAUNCHES | DIFF TO EAGER |
DIFF TO UNSHARDED", MOE LAUNCHES being, per MoE op of the translated graph, its family and the kernels flysim
recorded on the rank's last call, and LOCALIZED the same for `localize(model)[0]` compiled in the same process (on
flysim only; "-" on the reference backend, where no kernel launches)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "flysim" / "src"), str(Path(__file__).parent)]

import pytest  # noqa: E402
import torch  # noqa: E402

MOE_FAMILIES = ("moe_topk", "moe_experts")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(backend: str, world: int, family: str, form: str) -> list[str]:
    p = subprocess.run([sys.executable, __file__, backend, str(world), str(_free_port()), family, form],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-3000:]
    return sorted(line for line in p.stdout.splitlines() if line.startswith("rank "))


def _check(lines: list[str], world: int, backend: str) -> None:
    assert len(lines) == world, lines
    for r, line in enumerate(lines):
        head, left, moe, local, diff, whole = line.split(" | ")
        # one graph, desugared (DTensor flattened into the local shards), its router and experts on the MoE ops
        assert head == f"rank {r} ok desugared moe_topk=1 moe_experts=1", line
        # nothing but the collective in PyTorch: before, sort / histc / cumsum / index_put and both
        # transformers.grouped_mm_fallback stayed there (the experts' halves came as split, not chunk)
        assert set(left.split(",")) == {"_c10d_functional.all_reduce", "_c10d_functional.wait_tensor"}, line
        assert float(diff) < 1e-4 and float(whole) < 1e-4, line  # its eager, and the unsharded model
        if backend == "reference":
            assert moe == local == "-", line
            continue
        ops = dict(item.split("=") for item in moe.split(" "))
        assert set(ops) == set(MOE_FAMILIES), line
        assert ops["moe_topk"] == "topk_gating_kernel", line
        # align (the permutation), gather, the gated grouped GEMM, the down grouped GEMM (gemm/kernel.py's kernel,
        # grouped), the weighted un-permute
        assert ops["moe_experts"] == "moe_align_kernel,moe_gather_kernel,gemm_kernel,gemm_kernel,moe_unpermute_kernel", \
            line
        assert moe == local, line  # the same MoE launches as the localized copy's


def test_hf_expert_parallel_compiled_directly():
    """2 ranks, reference backend, OLMoE's MoE block: the desugared graph's MoE is moe_topk + moe_experts (no
    localize), each rank equal to its eager and the unsharded block."""
    _check(_ranks("reference", 2, "olmoe", "block"), 2, "reference")


# the whole model, 2 ranks: ~1.5 min on reference and ~2.5 min on flysim (both modes compiled) on 2 shared cores:
# slow; the block case above covers the pattern on the desugared graph, tests/kernels/test_moe_kernels.py
# (test_expert_parallel_shares_add_up) the kernels on a rank's share
@pytest.mark.slow
@pytest.mark.parametrize("backend,family", [("flysim", "olmoe"), ("flysim", "qwen3_moe"), ("reference", "olmoe")])
def test_hf_expert_parallel_model_compiled_directly(backend, family):
    _check(_ranks(backend, 2, family, "model"), 2, backend)


@pytest.mark.parametrize("split,halves", [
    (lambda t: t.chunk(2, -1), True),  # AOT autograd decomposes it: split(I, -1)
    (lambda t: torch.split(t, [48, 48], -1), True),  # split_with_sizes
    (lambda t: torch.split(t, 24, -1), False),  # four pieces
    (lambda t: torch.split(t, [40, 56], -1), False),  # unequal
    (lambda t: t.chunk(2, 0), False),  # the rows
])
def test_the_gate_up_halves_as_aot_writes_them(split, halves):
    """The grouped-mm pattern's [S, 2I] -> gate, up split (moe.py `_halves`) on the aten graph a dispatch trace gives
    (what AOT autograd hands over for a DTensor model): chunk(2, -1) arrives as split."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from translator.lowerings.moe import _halves

    gm = make_fx(lambda t: split(t), tracing_mode="fake")(torch.randn(6, 96))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "split" in str(n.target)]
    assert _halves(node) is halves, node.format_node()


def _moe_launches(tm) -> str:
    """'FAMILY=KERNEL,KERNEL ...' for the MoE ops of the translated graph, from the launches flysim recorded."""
    out = []
    for node, op in sorted(tm.report.ops.items()):
        if op.get("family") in MOE_FAMILIES:
            kernels = [re.sub(r"_\d+$", "", rec["kernel"]) for rec in tm.report.launches.get(node, [])]
            out.append(f"{op['family']}={','.join(kernels) or 'none'}")
    return " ".join(out)


def _out(y):
    """A causal LM's logits, a MoE block's hidden states (some HF blocks also return their router logits)."""
    y = getattr(y, "logits", y)
    return y[0] if isinstance(y, tuple) else y


def run(rank: int, world: int, backend: str, port: int, family: str, form: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from moe_ep_worker import hf_expert_parallel
        from test_moe import _hf
        from translator.distributed import localize
        from translator.frontends import compile_backend

        model, x, whole = hf_expert_parallel(family, rank, world)
        m = model
        if form == "block":  # its first MoE block, on hidden states; the unsharded block: _hf's same seeded init
            m = model.model.layers[0].mlp
            torch.manual_seed(1)
            x = torch.randn(2, 6, model.config.hidden_size)
            with torch.no_grad():
                whole = _hf(family)[0].model.layers[0].mlp(x)
        with torch.no_grad():
            want = _out(m(x))
            got = _out(torch.compile(m, backend="flydsl", options={"backend": backend})(x))
        recs = compile_backend.reports()
        assert len(recs) == 1 and recs[0].calls_translated == 1 and not recs[0].graph_breaks, compile_backend.summary()
        rec, tm = recs[0], recs[0].translated[0]
        assert tm.report.verification.passed, tm.report.verification.message
        # the user's model keeps its DTensor experts (the backend reads their local shards, frozen)
        assert type(model.model.layers[0].mlp.experts.gate_up_proj).__name__ == "DTensor"
        left = sorted({r.op for r in tm.report.rows if not r.layout and r.where == "pytorch"})
        if backend == "flysim":  # every FlyDSL op's row comes from a recorded launch on this rank
            assert not [r.node for r in tm.report.rows if r.where in ("flydsl-reference", "flydsl-op")], \
                [(r.node, r.where) for r in tm.report.rows]
        c = tm.report.counters
        moe, local = "-", "-"
        if backend == "flysim":  # and the localized copy's, for comparison
            moe = _moe_launches(tm)
            compile_backend.reset()
            with torch.no_grad():
                torch.compile(localize(m)[0], backend="flydsl", options={"backend": backend})(x)
            local = _moe_launches(compile_backend.reports()[0].translated[0])
        # one write per line: the ranks share one pipe
        sys.stdout.write(f"rank {rank} ok {'desugared' if rec.desugared else 'dynamo'} moe_topk={c.get('moe_topk')} "
                         f"moe_experts={c.get('moe_experts')} | {','.join(left)} | {moe} | {local} | "
                         f"{(got - want).abs().max().item():.3g} | {(got - whole).abs().max().item():.3g}\n")
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    _backend, _world, _port, _family = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(run, args=(_world, _backend, _port, _family, sys.argv[5] if len(sys.argv) > 5 else "model"),
             nprocs=_world)
