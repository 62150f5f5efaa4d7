"""DTensor tensor parallel (`parallelize_module` with ColwiseParallel / RowwiseParallel) on a Llama-style
gated MLP, 2 ranks on gloo: torch.export cannot capture DTensor in this torch, so translate() refuses it
with one InputError that names the fix (translator/distributed.py), and torch.compile(backend="flydsl")
runs dynamo's graph in PyTorch (output equal to eager) with that reason on its record. The fix the
message names (local shards + a functional all_reduce) is what tests/e2e/test_generation_tp.py runs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator.frontends import compile_backend

WORLD = 2


class MLP(nn.Module):
    def __init__(self, d=64, f=128):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _rank(rank, store):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        m = MLP().eval()
        parallelize_module(m, init_device_mesh("cpu", (WORLD,)),
                           {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()})
        x = torch.randn(2, 5, 64)
        with torch.no_grad():
            want = m(x)
        with pytest.raises(translator.InputError, match=r"(?s)w1\.weight .*DTensor.*Shard\(dim=0\).*Fix: .*local "
                                                        r"shard.*all_reduce"):
            translator.translate(m, (x,), backend="reference")
        with torch.no_grad():
            got = torch.compile(m, backend="flydsl", options={"backend": "reference"})(x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # dynamo's graph, in PyTorch
        (rec,) = compile_backend.reports()
        assert rec.calls_pytorch == 1 and not rec.translated, compile_backend.summary()
        assert rec.fallback_reason.startswith("InputError: ") and "DTensor" in rec.fallback_reason, rec.fallback_reason
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dtensor_parallel_is_refused_with_the_fix(tmp_path):
    mp.start_processes(_rank, args=(str(tmp_path / "store"),), nprocs=WORLD, start_method="fork")
