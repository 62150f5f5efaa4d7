"""Prepared GEMM weights left unmade on the reference backend of a large model (translator.state.settle,
issue 31 item 2).

Before: every linear weight got a preshuffled copy at translate time whatever the backend, +1x the
model's bytes (a 1.1 B fp32 Llama peaked at 2.16x its weights), although only a FlyDSL kernel reads it;
the reference unshuffled it again on every call. Here `LAZY_BYTES` is lowered so that tiny models take
the large-model path.
"""

import pytest
import torch
import torch.nn as nn

from translator import state, translate
from translator.tolerances import model_tol


def _llama():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    cfg._attn_implementation = "sdpa"
    return T.LlamaForCausalLM(cfg).eval(), (torch.randint(0, 128, (1, 8)),)


def _lazy(tm):
    return [n for n, b in tm.gm.named_buffers() if state.is_lazy(b)]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(state, "LAZY_BYTES", 0)


def test_llama_weights_stay_unmade_and_the_reference_computes_from_the_model(small_limit):
    m, inputs = _llama()
    tm = translate(m, inputs, backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    lazy = _lazy(tm)
    kinds = {n.rsplit("_", 1)[0] for n in lazy}
    assert {"_flydsl_qkv_w", "_flydsl_gated_w", "_flydsl_w"} <= kinds  # merged QKV, gate+up, o / down / head
    made = sum(b.numel() * b.element_size() for b in tm.gm.buffers() if not state.is_lazy(b))
    assert made < 1 << 16  # the rotary tables and the like; no weight copy
    with torch.no_grad():
        torch.testing.assert_close(tm(*inputs).logits, m(*inputs).logits, **model_tol(check="few_ops"))
        # a write no version counter sees is read at once: the reference reads the model's own weights
        m.model.layers[0].mlp.down_proj.weight.data.mul_(2)
        m.model.layers[1].self_attn.k_proj.weight.data.mul_(-1)
        torch.testing.assert_close(tm(*inputs).logits, m(*inputs).logits, **model_tol(check="few_ops"))


def test_below_the_limit_the_copies_are_made(monkeypatch):
    m, x = MLP().eval(), torch.randn(3, 32)
    monkeypatch.setattr(state, "LAZY_BYTES", 1 << 14)  # more than both weights' copies together
    assert not _lazy(translate(m, (x,), backend="reference", verify=False))
    monkeypatch.setattr(state, "LAZY_BYTES", 1000)
    assert len(_lazy(translate(m, (x,), backend="reference", verify=False))) == 2


def test_a_kernel_backend_gets_made_weights(small_limit):
    """translate(backend="flysim") makes the copies; a reference translation switched to flysim makes
    them per call: the kernel reads the preshuffled layout either way."""
    torch.manual_seed(0)
    m, x = MLP().eval(), torch.randn(3, 32)
    tm = translate(m, (x,), backend="flysim", verify=False)
    assert not _lazy(tm)
    tr = translate(m, (x,), backend="reference", verify=False)
    assert len(_lazy(tr)) == 2
    tr.backend = "flysim"
    with torch.no_grad():
        got, want = tr(x), m(x)
    assert len(tr.last_launches) >= 2  # the GEMMs ran as kernels
    torch.testing.assert_close(got, want, **model_tol(check="model"))


def test_save_load_and_conversions(tmp_path, small_limit):
    import translator

    torch.manual_seed(0)
    m, x = MLP().eval(), torch.randn(3, 32)
    tm = translate(m, (x,), backend="reference", verify=False)
    path = translator.save(tm, tmp_path / "m.pt2")
    assert len(_lazy(tm)) == 2  # saved made, left lazy
    loaded = translator.load(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), m(x), **model_tol(check="few_ops"))
        tm.double()
        tm.float()
        assert not _lazy(tm)  # a conversion makes them (a placeholder has no data to convert)
        torch.testing.assert_close(tm(x), m(x), **model_tol(check="few_ops"))


def test_a_pass_that_reads_a_lazy_copy_gets_its_data(small_limit):
    from translator.graph import LowerCtx

    torch.manual_seed(0)
    m, x = MLP().eval(), torch.randn(3, 32)
    tm = translate(m, (x,), backend="reference", verify=False)
    name = _lazy(tm)[0]
    node = next(n for n in tm.gm.graph.nodes if n.op == "get_attr" and n.target == name)
    got = LowerCtx(gm=tm.gm, arch="gfx942", precision="fp32").constant(node)
    assert got.device.type == "cpu" and not state.is_lazy(got)
    from translator_kernels.gemm.preshuffle import shuffle_weight

    assert torch.equal(got, shuffle_weight(m.a.weight.detach())) or torch.equal(got, shuffle_weight(m.b.weight.detach()))
    assert len(_lazy(tm)) == 1  # only the one read was made
