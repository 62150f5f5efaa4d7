"""MoE layers as people write them (translator/lowerings/moe.py): HF's grouped-mm experts (Mixtral,
Qwen3-MoE, OLMoE tiny configs, random init) and a hand-written top-2 loop over experts with
`torch.where(top_idx == e)` / `index_add_`. Each becomes `moe_topk` + `moe_experts`, leaves no compute
op in PyTorch, and verifies against eager; on flysim every FlyDSL op ran recorded launches."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from translator import CaptureError, translate
from translator.tolerances import model_tol


def _hf(family: str):
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    dec = dict(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    if family == "mixtral":
        m = T.MixtralForCausalLM(T.MixtralConfig(**dec, intermediate_size=96, num_local_experts=4,
                                                 num_experts_per_tok=2))
    elif family == "qwen2_moe":  # a shared expert besides the routed ones (an ordinary gated MLP, sigmoid-gated)
        m = T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**dec, intermediate_size=96, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=64, num_experts=4,
                                                   num_experts_per_tok=2))
    elif family == "qwen3_moe":
        m = T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**dec, intermediate_size=96, moe_intermediate_size=48, head_dim=16,
                                                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True))
    else:
        m = T.OlmoeForCausalLM(T.OlmoeConfig(**dec, intermediate_size=48, num_experts=8, num_experts_per_tok=2))
    m.config._attn_implementation = "sdpa"
    return m.eval(), torch.randint(0, 100, (2, 6))


def _check(tm, layers: int = 1, kernels: bool = True):
    c = tm.report.counters
    experts = sum(c.get(f"moe_experts{f}", 0) for f in ("", "_loop", "_dense"))
    assert c.get("moe_topk") == layers and experts == layers, c
    assert tm.report.verification.passed, tm.report.verification.message
    rows = [r for r in tm.report.rows if not r.layout]
    left = [(r.op, r.detail) for r in rows if r.where == "pytorch" and "by design" not in r.detail]
    assert left == [], f"left in PyTorch: {left}"
    if kernels:  # every FlyDSL op's row comes from recorded launches
        assert not [r.node for r in rows if r.where in ("flydsl-reference", "flydsl-op")]
    names = {str(n.target) for n in tm.gm.graph.nodes if n.op == "call_function"}
    assert not names & {"aten.sort.default", "aten.histc.default", "aten.topk.default", "aten.where.default",
                        "aten.index_add.default", "aten.index_add_.default"}, names
    assert not any("grouped_mm" in s for s in names), names


@pytest.mark.parametrize("family", ["mixtral", pytest.param("qwen3_moe", marks=pytest.mark.slow),
                                    pytest.param("olmoe", marks=pytest.mark.slow)])
def test_hf_moe_on_flysim(family):
    model, ids = _hf(family)
    tm = translate(model, (ids,), backend="flysim")
    _check(tm)


@pytest.mark.parametrize("family", [pytest.param("mixtral", marks=pytest.mark.slow), "qwen3_moe", "olmoe",
                                    pytest.param("qwen2_moe", marks=pytest.mark.slow)])
def test_hf_moe_forms_match(family):  # Mixtral's form runs on flysim by default (test_hf_moe_on_flysim)
    """Reference backend (fast): the patterns fire on each family (OLMoE: no renormalization; Qwen3:
    norm_topk_prob) and the translation serves another batch and sequence length."""
    model, ids = _hf(family)
    tm = translate(model, (ids,), backend="reference")
    _check(tm, kernels=False)
    (node,) = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.moe_topk.default]
    assert node.args[3] == (family not in ("olmoe", "qwen2_moe"))  # renormalize (norm_topk_prob)
    other = torch.randint(0, 100, (3, 4))
    with torch.no_grad():
        torch.testing.assert_close(tm(other).logits, model(other).logits, **model_tol())


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_hf_moe_bf16_on_flysim(family):
    """The model in bf16: bf16 grouped GEMMs, fp32 router scores (Mixtral keeps fp32 routing weights,
    Qwen3 casts them to bf16 after the top-k)."""
    model, ids = _hf(family)
    tm = translate(model.to(torch.bfloat16), (ids,), backend="flysim")
    _check(tm)


class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class HandMoE(nn.Module):
    """The top-2 MoE written the common way: router, topk, a loop over experts with where / index_add_."""

    def __init__(self, d=64, f=96, e=4, k=2, skip_empty=False, unsqueeze_after=False, share=None):
        """share=(rank, world): keep experts [rank·e/world, (rank + 1)·e/world) of the e (expert parallel;
        every rank builds the same weights from seed 0 first)."""
        super().__init__()
        if share is not None:
            torch.manual_seed(0)
        self.router = nn.Linear(d, e, bias=False)
        experts = [Expert(d, f) for _ in range(e)]
        per = e // share[1] if share else e
        self.first = share[0] * per if share else 0
        self.experts = nn.ModuleList(experts[self.first:self.first + per])
        self.k, self.skip_empty, self.unsqueeze_after = k, skip_empty, unsqueeze_after

    def forward(self, x):
        b, t, d = x.shape
        x = x.view(-1, d)
        w, top_idx = torch.topk(self.router(x).softmax(-1), self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(top_idx == self.first + e)
            if self.skip_empty and tok.numel() == 0:
                continue
            scale = w[tok, slot].unsqueeze(-1) if self.unsqueeze_after else w[tok, slot, None]
            out.index_add_(0, tok, expert(x[tok]) * scale)
        return out.view(b, t, d)


def test_hand_written_loop_on_flysim():
    torch.manual_seed(0)
    m = HandMoE().eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend="flysim")
    _check(tm)
    assert tm.report.counters["moe_experts_loop"] == 1


def test_hand_written_loop_forms_reference():
    """w[tok, slot].unsqueeze(-1) as well as w[tok, slot, None]; 8 experts (some get no token)."""
    torch.manual_seed(1)
    m = HandMoE(e=8, unsqueeze_after=True).eval()
    x = torch.randn(1, 3, 64)
    tm = translate(m, (x,), backend="reference")
    _check(tm, kernels=False)
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol())


class DenseMoE(HandMoE):
    """Dense dispatch: every expert on every token, weighted by its (masked) routing weight."""

    def forward(self, x):
        w, top_idx = torch.topk(self.router(x).softmax(-1), self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + (w * (top_idx == e)).sum(-1, keepdim=True) * expert(x)
        return out


@pytest.mark.parametrize("backend", ["flysim", pytest.param("reference", marks=pytest.mark.slow)])
def test_dense_dispatch(backend):
    torch.manual_seed(2)
    m = DenseMoE().eval()
    x = torch.randn(2, 5, 64)
    tm = translate(m, (x,), backend=backend)
    _check(tm, kernels=backend == "flysim")
    assert tm.report.counters["moe_experts_dense"] == 1
    assert tm.report.counters.get("gated_mlp", 0) == 0  # the experts are not taken one by one
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol())


def test_loop_that_skips_empty_experts_names_the_rewrite():
    torch.manual_seed(0)
    with pytest.raises(CaptureError, match=r"(?s)tok\.numel\(\) == 0.*Remove the branch.*moe_experts"):
        translate(HandMoE(skip_empty=True).eval(), (torch.randn(2, 5, 64),), backend="reference")


def test_a_ranks_share_of_the_experts():
    """Expert parallel in one process: a loop over experts 4..7 of 8 (rank 1 of 2) is one moe_experts with
    first_expert = 4; choices of experts 0..3 add nothing (tests/e2e/test_moe_ep.py runs the ranks)."""
    m = HandMoE(e=8, share=(1, 2)).eval()
    x = torch.randn(1, 7, 64)
    tm = translate(m, (x,), backend="reference")
    _check(tm, kernels=False)
    (node,) = [n for n in tm.gm.graph.nodes if n.target is torch.ops.flydsl.moe_experts.default]
    assert node.args[-1] == 4
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol())


def test_a_low_precision_router_softmax_keeps_topk_with_its_reason():
    """The gating kernel gives fp32 scores; a bf16 softmax + topk stays as it is and the report says why."""

    class Router(nn.Module):
        def forward(self, x):
            return torch.topk(x.softmax(-1), 2, dim=-1).values

    tm = translate(Router(), (torch.randn(5, 8).bfloat16(),), backend="reference")
    assert "moe_topk" not in tm.report.counters
    why = [r.detail for r in tm.report.rows if r.op.endswith("topk")]
    assert why and "router softmax is torch.bfloat16" in why[0], why


@pytest.mark.usefixtures("fresh_dynamo")
def test_hand_written_loop_under_torch_compile():
    """dynamo breaks the graph at the loop's torch.where (a data-dependent size) and, the break being in a
    loop, runs the whole forward in eager PyTorch (only the experts reach the backend): the record says
    so and names dynamo's flag; with the flag on, the loop is one graph and one moe_experts."""
    from translator.frontends import compile_backend

    torch.manual_seed(0)
    m = HandMoE().eval()
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        want = m(x)
        torch.testing.assert_close(torch.compile(m, backend="flydsl", options={"backend": "reference"})(x), want)
    said = compile_backend.summary()
    assert "frame skipped, runs in eager PyTorch: forward" in said and "capture_dynamic_output_shape_ops = True" in said, said
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compile_backend.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        got = torch.compile(m, backend="flydsl", options={"backend": "reference"})(x)
    (rec,) = compile_backend.reports()
    (tm,) = rec.translated
    assert rec.calls_translated == 1 and not rec.graph_breaks, compile_backend.summary()
    _check(tm, kernels=False)
    torch.testing.assert_close(got, want, **model_tol())


class TopkThenSoftmax(nn.Module):
    """gpt-oss's router: the softmax of the top-k logits (= the renormalized top-k of the softmax)."""

    def __init__(self, d=64, e=8, k=2):
        super().__init__()
        self.router, self.k = nn.Linear(d, e), k

    def forward(self, x):
        vals, ids = torch.topk(self.router(x), self.k, dim=-1)
        return torch.softmax(vals, dim=-1, dtype=vals.dtype), ids


def test_gpt_oss_router_on_flysim():
    torch.manual_seed(0)
    m = TopkThenSoftmax().eval()
    x = torch.randn(7, 64)
    tm = translate(m, (x,), backend="flysim")
    assert tm.report.counters.get("moe_topk") == 1 and tm.report.verification.passed
    assert not [r.op for r in tm.report.rows if r.where == "pytorch" and not r.layout]
    with torch.no_grad():
        (w, ids), (w0, ids0) = tm(x), m(x)
    assert torch.equal(ids, ids0)
    torch.testing.assert_close(w, w0, **model_tol())
