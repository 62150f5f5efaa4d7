"""Hand-written attention forms -> flydsl.attention: the rewrite fired (counter, one attention
node, no softmax left) and numerics match eager (reference backend here; flysim in the
kernel tests and the end-to-end model tests)."""

from __future__ import annotations

import math

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn
import torch.nn.functional as F

from translator import translate

from attention_helpers import attention_node, ops, run_attention  # noqa: E402  (tests/unit on sys.path)


class NanoGPT(nn.Module):
    def __init__(self, d=64, h=2, t=32):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, 0.1, training=self.training)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


class BertSelfAttention(nn.Module):
    def forward(self, q, k, v, mask):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        scores = scores + mask
        probs = nn.functional.softmax(scores, dim=-1)
        return torch.matmul(probs, v)


def repeat_kv(x, n):
    b, kvh, s, d = x.shape
    if n == 1:
        return x
    return x[:, :, None, :, :].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)


class LlamaEager(nn.Module):
    def forward(self, q, k, v, causal_mask):
        w = torch.matmul(q, repeat_kv(k, 2).transpose(2, 3)) * q.shape[-1] ** -0.5
        w = w + causal_mask[:, :, :, : k.shape[-2]]
        w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, repeat_kv(v, 2))


def run(model, inputs):
    return run_attention(model, inputs)[0]


def test_nanogpt_causal_tril_buffer():
    model = NanoGPT()
    tm = run(model, (torch.randn(2, 16, 64),))
    n = attention_node(tm)
    assert n.args[3] is None and n.args[4] is True  # no mask tensor: recognized as causal
    assert n.args[5] == pytest.approx(1 / math.sqrt(32))
    x = torch.randn(2, 9, 64)  # a shorter sequence through the same translation
    with torch.no_grad():
        torch.testing.assert_close(tm(x), model(x), **model_tol(check="few_ops"))


def test_bert_additive_mask():
    q, k, v = (torch.randn(2, 2, 7, 32) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 7)
    mask[0, ..., 5:] = torch.finfo(torch.float32).min
    tm = run(BertSelfAttention(), (q, k, v, mask))
    n = attention_node(tm)
    assert n.args[3] is not None and n.args[4] is False


def test_llama_repeat_kv_fp32_softmax_is_gqa():
    q = torch.randn(1, 4, 6, 32)
    k, v = torch.randn(1, 2, 6, 32), torch.randn(1, 2, 6, 32)
    cm = torch.triu(torch.full((6, 6), float("-inf")), 1)[None, None]
    tm = run(LlamaEager(), (q, k, v, cm))
    n = attention_node(tm)
    assert n.args[1].meta["val"].shape[1] == 2  # K reaches the kernel with 2 heads: not repeated


def test_masked_fill_with_a_general_boolean_mask():
    class M(nn.Module):
        def forward(self, q, k, v, pad):
            s = q @ k.transpose(-2, -1) / 8.0
            s = s.masked_fill(pad, torch.finfo(s.dtype).min)
            return torch.softmax(s, -1) @ v

    q, k, v = (torch.randn(2, 2, 5, 64) for _ in range(3))
    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    pad[1, ..., 3:] = True
    tm = run(M(), (q, k, v, pad))
    mask = attention_node(tm).args[3]
    assert mask is not None and mask.meta["val"].dtype == torch.bool  # keep = ~pad (PyTorch or a fused kernel)


def test_probabilities_returned_are_not_fused_and_say_why():
    class M(nn.Module):
        def forward(self, q, k, v):
            p = torch.softmax(q @ k.transpose(-2, -1), -1)
            return p @ v, p

    q = torch.randn(1, 2, 4, 32)
    tm = translate(M().eval(), (q, q.clone(), q.clone()), backend="reference")
    assert "attention" not in ops(tm)
    assert tm.report.verification.passed


class T5Attention(nn.Module):
    """HF T5: no scaling, position bias and the padding mask both added to the scores."""

    def forward(self, q, k, v, position_bias, mask):
        scores = torch.matmul(q, k.transpose(3, 2))
        scores += position_bias
        scores = scores + mask
        w = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        return torch.matmul(w, v)


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_t5_two_additive_masks(backend):
    q, k, v = (torch.randn(2, 2, 6, 32) for _ in range(3))
    bias = torch.randn(1, 2, 6, 6)
    mask = torch.zeros(2, 1, 1, 6)
    mask[1, ..., 4:] = torch.finfo(torch.float32).min
    m = T5Attention().eval()
    tm = translate(m, (q, k, v, bias, mask), backend=backend)
    assert tm.report.counters.get("attention_handwritten") == 1, tm.report.counters
    assert tm.report.verification.passed, tm.report.verification.message
    n = attention_node(tm)
    assert n.args[3] is not None and n.args[5] == 1.0
    if backend == "flysim":  # every FlyDSL op launched a kernel (rows say flydsl-kernel from launches)
        assert tm.last_launches and not tm.report.without_launch(), tm.report.without_launch()
