"""DTensor tensor parallel under torch.compile(backend="flydsl"), with no localize (issue 27 item 4): a Llama
transformer block sharded with the layer plan of torch's own tensor-parallel tutorial (ColwiseParallel q / k / v /
w1 / w3, RowwiseParallel o / w2 with output_layouts=Shard(1), SequenceParallel norms, PrepareModuleInput), 2
ranks on gloo (CPU) in forked processes, 4 as a slow variant.

The graph dynamo hands over reads DTensor parameters; the backend runs it through AOT autograd's subclass
flattening, as inductor does (translator/distributed.py `desugared`), and translates the graph over the rank's
local shards: DTensor's redistributions are functional all_gather / reduce_scatter there, kept on the process
group by design. Each rank's translation verifies against its eager; the compiled output equals the rank's eager
(the DTensor model) and its sequence shard of the unsharded model's; on flysim the GEMMs are launches. The same
model under translate() is refused (localize takes ColwiseParallel / RowwiseParallel with default layouts only),
the error naming torch.compile; a graph AOT autograd cannot take runs in PyTorch with its reason.

Also: a tiny HF Llama sharded by transformers' own TP styles with its config's base_model_tp_plan
(`test_hf_llama_tp_plan`, reference by default, flysim -m slow), and the two graph fix-ups the flattened graph
gets (`restore_sdpa`, `drop_same_layout_copies`)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator.distributed import drop_same_layout_copies, localize, restore_linear, restore_sdpa
from translator.frontends import compile_backend
from translator.lowerings.by_design import COLLECTIVE_WHY
from translator.tolerances import model_tol

DIM, HEADS, HIDDEN, BATCH, SEQ = 32, 4, 64, 2, 8


# ---- the tutorial's Llama block (torch tutorials: TP_tutorial / llama2_model.py), re-typed, tiny, no RoPE ----
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, n_heads * self.head_dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        q, k, v = (w(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden_dim, bias=False), nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = Attention(DIM, HEADS), FeedForward(DIM, HIDDEN)
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def tutorial_plan():
    """The tutorial's layer_tp_plan (its attention also takes freqs_cis: one input here)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"attention_norm": SequenceParallel(), "attention": gather,
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(), "feed_forward": copy.deepcopy(gather),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel()}


def _join(rank, store, world):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    compile_backend.reset()  # a forked rank starts with the parent's records
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _rank(rank, store, backend, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    _join(rank, store, world)
    try:
        torch.manual_seed(0)
        whole = TransformerBlock().eval()
        xs = [torch.randn(BATCH, SEQ, DIM) for _ in range(2)]
        with torch.no_grad():
            wants = [whole(x) for x in xs]
        m = parallelize_module(copy.deepcopy(whole), init_device_mesh("cpu", (world,)), tutorial_plan())
        m.attention.n_heads //= world  # as the tutorial does: this rank's heads
        shard = slice(rank * SEQ // world, (rank + 1) * SEQ // world)  # SequenceParallel: this rank's tokens
        xs = [x[:, shard].contiguous() for x in xs]
        with torch.no_grad():
            eager = [m(x) for x in xs]
        for e, w in zip(eager, wants):
            torch.testing.assert_close(e, w[:, shard], **model_tol())

        with pytest.raises(translator.InputError, match=r"(?s)DTensor.*torch\.compile\(model, backend='flydsl'\)"):
            translator.translate(m, (xs[0],), backend="reference")  # localize takes no SequenceParallel

        compiled = torch.compile(m, backend="flydsl", options={"backend": backend})
        with torch.no_grad():
            got = [compiled(x) for x in xs]
        (rec,) = compile_backend.reports()
        assert rec.calls_translated == 2 and rec.calls_pytorch == 0 and len(rec.translated) == 1, \
            compile_backend.summary()
        assert rec.desugared and rec.sdpa_restored == 1, compile_backend.summary()
        assert rec.linears_restored == 7, compile_backend.summary()  # AOT's t + mm: aten.linear again
        for g, e, w in zip(got, eager, wants):
            assert type(g) is torch.Tensor
            torch.testing.assert_close(g, e, **model_tol())
            torch.testing.assert_close(g, w[:, shard], **model_tol())
        tm = rec.translated[0]
        assert tm.report.verification.passed, tm.report.verification.message
        assert not [n for n in tm.report.capture_notes if "training mode" in n], tm.report.capture_notes
        assert "local shards" in compile_backend.summary()
        colls = [str(n.target).split(".")[1] for n in tm.gm.graph.nodes if "c10d" in str(n.target)]
        assert colls == ["all_gather_into_tensor", "wait_tensor", "reduce_scatter_tensor", "wait_tensor"] * 2, colls
        kept = {r.detail for r in tm.report.rows if "c10d" in r.op}
        assert kept == {f"kept in PyTorch by design: {COLLECTIVE_WHY}"}, kept
        fams = {r.detail.split()[0] for r in tm.report.rows if r.where.startswith("flydsl")}
        assert {"flydsl.gemm", "flydsl.attention", "flydsl.rms_norm"} <= fams, fams
        c = tm.report.counters  # q, k, v in one GEMM and w1, w3 in one gated GEMM, as in a localized copy
        assert (c["qkv"], c["qkv_merged_linears"], c["gated_mlp"]) == (1, 3, 1), dict(c)
        assert [x.family for x in tm.last_calls].count("gemm") == 3, [x.family for x in tm.last_calls]
        s = tm.report.rank_summary()
        assert (s["rank"], s["world_size"], s["collective_ops"]) == (rank, world, 8), s
        assert 0 < s["collective_byte_share"] < 1, s
        assert isinstance(m.attention.wq.weight, DTensor)  # the user's model is unchanged
        if backend == "flysim":  # this rank's recorded launches: every FlyDSL op's row comes from one
            assert not [r.node for r in tm.report.rows if r.where in ("flydsl-reference", "flydsl-op")], \
                f"rank {rank}: {[(r.node, r.where) for r in tm.report.rows]}"
            launched = {c.family for c in tm.last_calls if c.launches}
            assert {"gemm", "attention"} <= launched, f"rank {rank}: {launched}"

        _aot_failure(m, xs[0], eager[0])  # every rank: dynamo's graph holds DTensor's collectives
    finally:
        dist.destroy_process_group()


def _aot_failure(m, x, want):
    import torch._dynamo.backends.common as common

    def broken(**_):
        def fail(*_a, **_k):
            raise RuntimeError("no sharding strategy")
        return fail

    torch._dynamo.reset()
    compile_backend.reset()
    real, common.aot_autograd = common.aot_autograd, broken
    try:
        with torch.no_grad(), pytest.warns(UserWarning, match="runs in PyTorch"):
            got = torch.compile(m, backend="flydsl", options={"backend": "reference"})(x)
    finally:
        common.aot_autograd = real
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (rec,) = compile_backend.reports()
    assert rec.calls_pytorch == 1 and not rec.translated, compile_backend.summary()
    assert "no sharding strategy" in rec.fallback_reason and "localize(model)" in rec.fallback_reason, \
        rec.fallback_reason


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_dtensor_under_torch_compile(tmp_path, world):
    mp.start_processes(_rank, args=(str(tmp_path / "store"), "flysim", world), nprocs=world, start_method="fork")


@pytest.mark.parametrize("op", ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_restore_sdpa(op, kv_heads):
    """The device SDPA op AOT autograd traces F.scaled_dot_product_attention to is SDPA again (item 0 read only),
    grouped-query attention included (the device ops take fewer K / V heads as they are; HF's sdpa passes
    enable_gqa: an OLMoE rank's graph, 4 query heads and 2 kv heads, failed its eager run without it)."""
    aten = torch.ops.aten
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, kv_heads, 5, 8), torch.randn(1, kv_heads, 5, 8)
    g = torch.fx.Graph()
    qkv = [g.placeholder(n) for n in "qkv"]
    for node, t in zip(qkv, (q, k, v)):
        node.meta["val"] = t
    args = (*qkv, 0.0, True) if "cpu" in op else (*qkv, None, False, 0.0, True)
    node = g.call_function(getattr(aten, op).default, args, {"scale": 0.5})
    g.output(g.call_function(operator.getitem, (node, 0)))
    gm = torch.fx.GraphModule(nn.Module(), g)
    assert restore_sdpa(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [aten.scaled_dot_product_attention.default]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5, enable_gqa=kv_heads != 4)
    if "cpu" in op:  # the op itself, where it runs here
        torch.testing.assert_close(getattr(aten, op)(q, k, v, 0.0, True, scale=0.5)[0], want)
    torch.testing.assert_close(gm(q, k, v), want)


def default_plan():
    """ColwiseParallel q / k / v / w1 / w3 and RowwiseParallel o / w2 with their default layouts: what `localize`
    takes, so the localized copy's launches can be compared with the compiled DTensor model's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {**{f"attention.w{n}": ColwiseParallel() for n in "qkv"}, "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel()}


def _launch_rank(rank, store, backend, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    _join(rank, store, world)
    try:
        torch.manual_seed(0)
        whole = TransformerBlock().eval()
        x = torch.randn(BATCH, SEQ, DIM)
        m = parallelize_module(copy.deepcopy(whole), init_device_mesh("cpu", (world,)), default_plan())
        m.attention.n_heads //= world
        with torch.no_grad():
            want, eager = whole(x), m(x)
            got = torch.compile(m, backend="flydsl", options={"backend": backend})(x)
        torch.testing.assert_close(got, eager, **model_tol())
        torch.testing.assert_close(got, want, **model_tol())
        (rec,) = compile_backend.reports()
        assert rec.desugared and rec.linears_restored == 7, compile_backend.summary()
        tm = rec.translated[0]
        local = translator.translate(localize(m)[0], (x,), backend=backend)
        with torch.no_grad():
            torch.testing.assert_close(local(x), want, **model_tol())
        calls = [c.family for c in tm.last_calls]
        assert calls == [c.family for c in local.last_calls], (calls, [c.family for c in local.last_calls])
        assert calls.count("gemm") == 3 and calls.count("gemm_gated") == 1, calls  # qkv, o, down; gate+up
        for t in (tm, local):
            assert (t.report.counters["qkv_merged_linears"], t.report.counters["gated_mlp"]) == (3, 1)
        if backend == "flysim":
            launches = [len(c.launches) for c in tm.last_calls]
            assert launches == [len(c.launches) for c in local.last_calls] and all(launches), launches
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["reference", pytest.param("flysim", marks=pytest.mark.slow)])
def test_launches_equal_the_localized_copy(tmp_path, backend):
    """The compiled DTensor model makes the launches of its localized copy: q / k / v in one GEMM, gate and up in
    one gated GEMM (AOT autograd writes nn.Linear as t + mm, which `restore_linear` turns back into aten.linear;
    before, 12 FlyDSL calls a layer against the localized copy's 8)."""
    mp.start_processes(_launch_rank, args=(str(tmp_path / "store"), backend, 2), nprocs=2, start_method="fork")


def test_restore_linear():
    """AOT's decomposed nn.Linear (t + mm / addmm, between views for a 3-D input, and a same-shape view of the
    input per projection) is aten.linear again, over the input itself: a product with a weight input only."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, wq, wk, b, y):
        x = x.view(x.shape)  # DTensor's to_local leaves one such view per projection
        return (F.linear(x.view(x.shape), wq), F.linear(x, wk, b), F.linear(x[0], wq),
                F.linear(x.view(x.shape), y))  # y is an activation: stays mm

    args = (torch.randn(2, 5, 8), torch.randn(4, 8), torch.randn(4, 8), torch.randn(4), torch.randn(4, 8))
    gm = make_fx(f)(*args)
    aten = torch.ops.aten
    assert [n.target for n in gm.graph.nodes].count(aten.t.default) == 4
    assert restore_linear(gm, weights={1, 2, 3}) == 3
    lin = [n for n in gm.graph.nodes if n.target is aten.linear.default]
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert [n.args[0] is x for n in lin] == [True, True, False], gm.code
    assert len(lin[1].args) == 3 and sum(n.target is aten.mm.default for n in gm.graph.nodes) == 1, gm.code
    for g, w in zip(gm(*args), f(*args)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _hf_rank(rank, store, backend, world):
    """A tiny HF Llama sharded by transformers' own TP styles with the config's base_model_tp_plan (what
    from_pretrained(tp_plan="auto") applies; from_pretrained needs a checkpoint, so it is applied here by
    `apply_tensor_parallelism` with the plan the model resolves), then compiled as it is."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    _join(rank, store, world)
    try:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
                          attn_implementation="sdpa")
        whole = LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, 8))
        with torch.no_grad():
            want = whole(ids).logits
        m = copy.deepcopy(whole)
        plan, _, _ = m._resolve_parallel_plans(DistributedConfig(tp_size=world))
        assert plan["model.layers.0.self_attn.q_proj"] == "colwise" and plan["model.layers.0.mlp.down_proj"] == "rowwise"
        apply_tensor_parallelism(m, init_device_mesh("cpu", (world,)), plan)
        with torch.no_grad():
            eager = m(ids).logits
        torch.testing.assert_close(eager, want, **model_tol())
        with pytest.raises(translator.InputError, match=r"torch\.compile\(model, backend='flydsl'\)"):
            translator.translate(m, (ids,), backend="reference")
        with torch.no_grad():
            got = torch.compile(m, backend="flydsl", options={"backend": backend})(ids).logits
        torch.testing.assert_close(got, eager, **model_tol())
        torch.testing.assert_close(got, want, **model_tol())
        (rec,) = compile_backend.reports()
        assert rec.desugared and rec.calls_translated == 1 and rec.calls_pytorch == 0, compile_backend.summary()
        tm = rec.translated[0]
        assert tm.report.verification.passed, tm.report.verification.message
        gemms = [r for r in tm.report.rows if r.where.startswith("flydsl") and r.detail.startswith("flydsl.gemm")]
        assert len(gemms) >= 8, [(r.node, r.where, r.detail) for r in tm.report.rows]  # q k v o gate up down lm_head
        assert {r.detail for r in tm.report.rows if "c10d" in r.op} == {f"kept in PyTorch by design: {COLLECTIVE_WHY}"}
        assert tm.report.rank_summary()["collective_ops"] > 0
        if backend == "flysim":
            assert "gemm" in {c.family for c in tm.last_calls if c.launches}, f"rank {rank}"
        # HF's RowwiseParallel all_reduces in place: functionalized, a copy back into the same layout, dropped
        assert not [n for n in tm.gm.graph.nodes if n.target is torch.ops.aten.copy.default], tm.gm.code
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("backend", ["reference", pytest.param("flysim", marks=pytest.mark.slow)])
def test_hf_llama_tp_plan(tmp_path, backend):
    pytest.importorskip("transformers.distributed.tensor_parallel")
    mp.start_processes(_hf_rank, args=(str(tmp_path / "store"), backend, 2), nprocs=2, start_method="fork")


def test_drop_same_layout_copies():
    """Functionalization's copy back into an equal layout is its source; into another layout it stays."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    same = g.call_function(torch.ops.aten.copy.default, (a, b))
    other = g.call_function(torch.ops.aten.copy.default, (g.call_function(torch.ops.aten.t.default, (a,)), b))
    g.output((same, other))
    with FakeTensorMode():
        fa, fb = torch.empty(4, 4), torch.empty(4, 4)
        a.meta["val"], b.meta["val"] = fa, fb
        other.args[0].meta["val"] = fa.t()
    gm = torch.fx.GraphModule(nn.Module(), g)
    assert drop_same_layout_copies(gm) == 1
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    got_same, got_other = gm(x, y)
    assert got_same is y and got_other.stride() == (1, 4)
    torch.testing.assert_close(got_other, y)
