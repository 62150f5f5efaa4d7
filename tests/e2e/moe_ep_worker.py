"""Expert parallel, rank by rank (run by tests/e2e/test_moe_ep.py as a script: one process per rank,
gloo on the CPU). Each rank holds experts [rank·E/W, (rank + 1)·E/W) of a top-2 MoE written as a
hand-written loop over its experts; the ranks' partial outputs meet in a functional all_reduce.
Each rank translates its own graph (the loop becomes moe_experts with first_expert = its first
expert; the collective stays in the graph, on the process group) and verifies against its eager.

FORM "hf": a tiny HF MoE model (FAMILY: mixtral, qwen3_moe, olmoe; test_moe._hf) split by transformers' own
expert parallel (`apply_expert_parallelism` with the config's `base_model_ep_plan` and ep_implementation
"all_reduce", what from_pretrained(..., distributed_config=DistributedConfig(tp_size=W, tp_plan={}, ep_size=W,
ep_implementation="all_reduce")) applies; the shards are copied in from the unsharded weights, as the loader
would): DTensor expert weights, HF's masking of off-rank routes and an all_reduce. translate() localizes it
(translator/distributed.py); under torch.compile the localized copy is compiled. Its line also gives the max
difference to the unsharded model's output.

    python tests/e2e/moe_ep_worker.py BACKEND WORLD PORT [translate|compile] [hand|hf] [FAMILY] [EP IMPLEMENTATION]
prints one line per rank: "rank R ok COUNTERS | PYTORCH OPS | LAUNCHES | MAX ABS DIFF [| DIFF TO UNSHARDED]",
LAUNCHES being FAMILY:N for each op family that launched kernels on the rank's last call (flysim's recorded
launches; "-" on the reference backend)."""

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


def hf_expert_parallel(family, rank, world, implementation="all_reduce"):
    """(the rank's HF model under transformers' expert parallel, input ids, the unsharded model's logits)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    from test_moe import _hf

    m, ids = _hf(family)
    with torch.no_grad():
        whole = m(ids).logits
    full = {n: p.detach().clone() for n, p in m.named_parameters()}
    layers = range(m.config.num_hidden_layers)
    plan = {f"model.{k.replace('*', str(i))}": v for k, v in m.config.base_model_ep_plan.items() for i in layers}
    mesh = init_device_mesh("cpu", (world,))
    apply_expert_parallelism(m, mesh, mesh, plan, implementation)
    with torch.no_grad():  # what from_pretrained's loader writes into each rank's Shard(0) experts
        for n, p in m.named_parameters():
            if hasattr(p, "to_local"):
                local = p.to_local()
                local.copy_(full[n][rank * local.shape[0]:(rank + 1) * local.shape[0]])
    return m, ids, whole


def run(rank, world, backend, port, mode="translate", form="hand", family="mixtral", implementation="all_reduce"):
    """`implementation`: one of transformers' expert-parallel implementations, or several joined by commas, each
    a line of its own from one process (one start-up and one process group for the tests that read them)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for impl in implementation.split(","):
            _run_form(rank, world, backend, mode, form, family, impl)
    finally:
        dist.destroy_process_group()


def _run_form(rank, world, backend, mode, form, family, implementation):
    from translator import translate
    from translator.distributed import localize

    whole = None
    if form == "hf":
        m, x, whole = hf_expert_parallel(family, rank, world, implementation)
        if implementation != "all_reduce":  # refused before capture, naming the form that is taken
            try:
                translate(m, (x,), backend=backend)
            except Exception as e:  # noqa: BLE001 — the line reports what was raised
                sys.stdout.write(f"rank {rank} refused: {type(e).__name__}: {' '.join(str(e).split())}\n")
                sys.stdout.flush()
                return
    else:
        m = ExpertParallelMoE(rank, world).eval()
        torch.manual_seed(1)
        x = torch.randn(2, 5, 64)
    with torch.no_grad():
        want = m(x)
        want = getattr(want, "logits", want)
    if mode == "translate":
        tm = translate(m, (x,), backend=backend)
        with torch.no_grad():
            got = tm(x)
    else:
        tm, got = _compiled(localize(m)[0] if form == "hf" else m, x, backend)
    got = getattr(got, "logits", got)
    assert tm.report.verification.passed, tm.report.verification.message
    if form == "hf":  # the localized copy was translated: the user's model keeps its DTensor experts
        assert type(m.model.layers[0].mlp.experts.gate_up_proj).__name__ == "DTensor"
    left = sorted({r.op for r in tm.report.rows if not r.layout and r.where == "pytorch"})
    diff = (got - want).abs().max().item()
    c = tm.report.counters
    experts = "moe_experts_loop" if form == "hand" else "moe_experts"
    launched = {}
    for call in tm.last_calls:
        if call.launches:
            launched[call.family] = launched.get(call.family, 0) + len(call.launches)
    if backend == "flysim":  # every FlyDSL op's row comes from a recorded launch on this rank
        assert not [r.node for r in tm.report.rows if r.where in ("flydsl-reference", "flydsl-op")], \
            [(r.node, r.where) for r in tm.report.rows]
    kernels = ",".join(f"{f}:{n}" for f, n in sorted(launched.items())) or "-"
    tail = "" if whole is None else f" | {(got - whole).abs().max().item():.3g}"
    # one write per line: the ranks' prints went to one pipe interleaved ("...8.2e-08rank 0 ok ...")
    sys.stdout.write(f"rank {rank} ok moe_topk={c.get('moe_topk')} {experts}={c.get(experts)} "
                     f"| {','.join(left)} | {kernels} | {diff:.3g}{tail}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    backend, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(run, args=(world, backend, port, *sys.argv[4:8]), nprocs=world)
