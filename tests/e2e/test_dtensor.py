"""DTensor tensor parallel (`parallelize_module` with ColwiseParallel / RowwiseParallel) on a Llama-style
block (q, k, v, o and a gated MLP), 2 and 4 ranks on gloo (4 heads, so 4 ranks hold one head each).

torch.export cannot capture DTensor in this torch, so translate() takes each rank's local shards instead
(translator/distributed.py `localize`: plain parameters, the styles' hooks dropped, a functional
all_reduce after each RowwiseParallel linear) and verifies against the DTensor model's eager; the
all_reduces stay in the rank's graph, kept by design. A DTensor use outside those two styles is refused
with one InputError naming the fix. Under torch.compile(backend="flydsl") the DTensor model is translated as
it is (AOT autograd flattens dynamo's graph into the local shards: tests/e2e/test_dtensor_compile.py), with the
same two all_reduces; compiling `localize(model)[0]` is translated too."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator.distributed import localize
from translator.frontends import compile_backend
from translator.lowerings.by_design import COLLECTIVE_WHY
from translator.tolerances import model_tol

class Attention(nn.Module):
    def __init__(self, d=64, head_dim=16):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.hd = head_dim

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))  # local heads
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, d=64, f=128):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d)  # a bias: added once, after the sum over the ranks

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        h = x + self.attn(x)
        return h + self.mlp(h)


def _rank(rank, store, backend, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    torch._dynamo.reset()
    compile_backend.reset()  # a forked rank starts with the parent's records
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        m = Block().eval()
        col, row = ColwiseParallel(), RowwiseParallel()
        parallelize_module(m, mesh, {"attn.wq": col, "attn.wk": col, "attn.wv": col, "attn.wo": row,
                                     "mlp.w1": col, "mlp.w3": col, "mlp.w2": row})
        x = torch.randn(2, 5, 64)
        with torch.no_grad():
            want = m(x)
        tm = translator.translate(m, (x,), backend=backend)
        assert tm.report.verification.passed, tm.report.verification.message
        with torch.no_grad():
            torch.testing.assert_close(tm(x), want, **model_tol())
        assert sum("all_reduce" in str(n.target) for n in tm.gm.graph.nodes) == 2, tm.gm.code
        kept = {(r.op, r.detail) for r in tm.report.rows if r.where == "pytorch" and not r.layout}
        assert kept == {(op, f"kept in PyTorch by design: {COLLECTIVE_WHY}")
                        for op in ("_c10d_functional.all_reduce", "_c10d_functional.wait_tensor")}, kept
        assert isinstance(m.mlp.w2.weight, torch.distributed.tensor.DTensor)  # the user's model is unchanged
        if backend == "flysim":  # this rank's recorded launches: every FlyDSL op's row comes from one
            assert not [r.node for r in tm.report.rows if r.where in ("flydsl-reference", "flydsl-op")], \
                f"rank {rank}: {[(r.node, r.where) for r in tm.report.rows]}"
            assert "gemm" in {c.family for c in tm.last_calls if c.launches}, f"rank {rank}"

        other = MLP().eval()  # a DTensor weight with no parallel style: refused, naming the fix
        other.w1.weight = nn.Parameter(distribute_tensor(other.w1.weight.detach(), mesh, [Shard(0)]))
        with pytest.raises(translator.InputError, match=r"(?s)w1\.weight .*DTensor.*Fix: .*local shard.*all_reduce"):
            translator.translate(other, (x,), backend="reference")

        with torch.no_grad():
            got = torch.compile(m, backend="flydsl", options={"backend": backend})(x)
        torch.testing.assert_close(got, want, **model_tol())
        (rec,) = compile_backend.reports()  # the DTensor model itself: its graph over the local shards
        assert rec.calls_translated == 1 and rec.calls_pytorch == 0 and rec.desugared, compile_backend.summary()
        assert rec.translated[0].report.verification.passed, rec.translated[0].report.verification.message
        assert sum("all_reduce" in str(n.target) for n in rec.translated[0].gm.graph.nodes) == 2
        compile_backend.reset()  # localize's form compiles too
        local, _ = localize(m)
        with torch.no_grad():
            got = torch.compile(local, backend="flydsl", options={"backend": backend})(x)
        torch.testing.assert_close(got, want, **model_tol())
        (rec,) = compile_backend.reports()
        assert rec.calls_translated == 1 and rec.calls_pytorch == 0, compile_backend.summary()
        assert sum("all_reduce" in str(n.target) for n in rec.translated[0].gm.graph.nodes) == 2
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend,world", [("reference", 2), pytest.param("flysim", 2, marks=pytest.mark.slow),
                                           pytest.param("flysim", 4, marks=pytest.mark.slow)])
def test_dtensor_tensor_parallel(tmp_path, backend, world):
    mp.start_processes(_rank, args=(str(tmp_path / "store"), backend, world), nprocs=world, start_method="fork")
