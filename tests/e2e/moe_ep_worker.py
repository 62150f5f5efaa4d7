"""Expert parallel, rank by rank (run by tests/e2e/test_moe_ep.py as a script: one process per rank,
gloo on the CPU). Each rank holds experts [rank·E/W, (rank + 1)·E/W) of a top-2 MoE written as a
hand-written loop over its experts; the ranks' partial outputs meet in a functional all_reduce.
Each rank translates its own graph (the loop becomes moe_experts with first_expert = its first
expert; the collective stays in the graph, on the process group) and verifies against its eager.

    python tests/e2e/moe_ep_worker.py BACKEND WORLD PORT
prints one line per rank: "rank R ok COUNTERS | PYTORCH OPS | MAX ABS DIFF"."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "flysim" / "src"), str(Path(__file__).parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402


from test_moe import HandMoE  # noqa: E402  (this folder: the hand-written loop, share=(rank, world))


class ExpertParallelMoE(HandMoE):
    """The rank's share of 8 experts, its output summed over the ranks by a functional all_reduce."""

    def __init__(self, rank, world):
        super().__init__(e=8, share=(rank, world))

    def forward(self, x):
        return funcol.all_reduce(super().forward(x), "sum", dist.group.WORLD)


def _compiled(m, x, backend):
    """(the translation of the one graph dynamo hands over, the compiled model's output)."""
    from translator.frontends import compile_backend

    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    with torch.no_grad():
        out = torch.compile(m, backend="flydsl", options={"backend": backend})(x)
    recs = compile_backend.reports()
    assert len(recs) == 1 and recs[0].calls_translated == 1 and not recs[0].graph_breaks, compile_backend.summary()
    return recs[0].translated[0], out


def run(rank, world, backend, port, mode="translate"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from translator import translate

        m = ExpertParallelMoE(rank, world).eval()
        torch.manual_seed(1)
        x = torch.randn(2, 5, 64)
        with torch.no_grad():
            want = m(x)
        if mode == "translate":
            tm = translate(m, (x,), backend=backend)
            with torch.no_grad():
                got = tm(x)
        else:
            tm, got = _compiled(m, x, backend)
        assert tm.report.verification.passed, tm.report.verification.message
        left = sorted({r.op for r in tm.report.rows if not r.layout and r.where == "pytorch"})
        diff = (got - want).abs().max().item()
        c = tm.report.counters
        # one write per line: the ranks' prints went to one pipe interleaved ("...8.2e-08rank 0 ok ...")
        sys.stdout.write(f"rank {rank} ok moe_topk={c.get('moe_topk')} moe_experts_loop={c.get('moe_experts_loop')} "
                         f"| {','.join(left)} | {diff:.3g}\n")
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    backend, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(run, args=(world, backend, port, *sys.argv[4:5]), nprocs=world)
