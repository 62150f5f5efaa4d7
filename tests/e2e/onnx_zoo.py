"""Models written the way other people write them, for the ONNX export tests and bench/onnx_exports.py.

Each entry of ZOO builds (model, example inputs) at a tiny size. The four scripts re-type well-known
public forms (issue 32): a GPT-2 block with HF's Conv1D projections and gelu_new, a T5 block with
relative position buckets and T5's RMS LayerNorm, a GEMM epilogue chain ending in logsumexp
(KernelBench level 2 style), and a multi-query attention decode step that repeats its one K/V head.
The HF entries are tiny configs with random init (no downloads): an encoder (BERT), a decoder with
its attention mask (Llama), a ViT.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):  # HF GPT-2's projection: weight [in, out], y = x @ W + b via addmm
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))
        self.nf = nf

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, d=64, heads=4, n_pos=32):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
        self.c_fc, self.mlp_proj = Conv1D(4 * d, d), Conv1D(d, 4 * d)
        self.heads, self.d = heads, d
        self.register_buffer("bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool)).view(1, 1, n_pos, n_pos))

    def _split(self, t):
        return t.view(t.size()[:-1] + (self.heads, self.d // self.heads)).permute(0, 2, 1, 3)

    def forward(self, x):
        h = self.ln_1(x)
        q, k, v = self.c_attn(h).split(self.d, dim=2)
        q, k, v = self._split(q), self._split(k), self._split(v)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        qlen, klen = q.size(-2), k.size(-2)
        causal = self.bias[:, :, klen - qlen:klen, :klen]
        w = torch.where(causal, w.to(w.dtype), torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = F.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.d,))
        x = x + self.c_proj(a)
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))


class T5LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class T5Block(nn.Module):
    def __init__(self, d=64, heads=4, d_ff=128, buckets=32, max_distance=128):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.rel = nn.Embedding(buckets, heads)
        self.ln1, self.ln2 = T5LayerNorm(d), T5LayerNorm(d)
        self.wi, self.wo = nn.Linear(d, d_ff, bias=False), nn.Linear(d_ff, d, bias=False)
        self.heads, self.d, self.buckets, self.max_distance = heads, d, buckets, max_distance

    def _bucket(self, rel):  # bidirectional relative position buckets, as in T5
        nb = self.buckets // 2
        ret = (rel > 0).to(torch.long) * nb
        rel = torch.abs(rel)
        max_exact = nb // 2
        small = rel < max_exact
        large = max_exact + (torch.log(rel.float() / max_exact) / math.log(self.max_distance / max_exact)
                             * (nb - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return ret + torch.where(small, rel, large)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln1(x)
        sh = lambda t: t.view(b, -1, self.heads, self.d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = sh(self.q(h)), sh(self.k(h)), sh(self.v(h))
        ctx = torch.arange(s, dtype=torch.long)[:, None]
        mem = torch.arange(s, dtype=torch.long)[None, :]
        bias = self.rel(self._bucket(mem - ctx)).permute([2, 0, 1]).unsqueeze(0)
        w = F.softmax((torch.matmul(q, k.transpose(3, 2)) + bias).float(), dim=-1).type_as(q)
        a = torch.matmul(w, v).transpose(1, 2).contiguous().view(b, -1, self.d)
        x = x + self.o(a)
        return x + self.wo(F.relu(self.wi(self.ln2(x))))


class GemmLogSumExp(nn.Module):  # KernelBench level 2 style: gemm, scale, residual, clamp, logsumexp, mish
    def __init__(self, k=64, n=128, scale=2.0, lo=-10.0, hi=10.0):
        super().__init__()
        self.matmul = nn.Linear(k, n)
        self.scale, self.lo, self.hi = scale, lo, hi

    def forward(self, x):
        x = self.matmul(x) * self.scale
        x = x + x
        x = torch.clamp(x, self.lo, self.hi)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        return x * F.mish(x)


class MQADecode(nn.Module):  # one new token against a cache with a single K/V head, repeated to every head
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.hd, self.heads = d // heads, heads
        self.wq, self.wkv, self.wo = nn.Linear(d, d), nn.Linear(d, 2 * (d // heads)), nn.Linear(d, d)

    def forward(self, x, k_cache, v_cache):
        b = x.shape[0]
        q = self.wq(x).view(b, 1, self.heads, self.hd).transpose(1, 2)
        k_new, v_new = self.wkv(x).view(b, 1, 1, 2 * self.hd).split(self.hd, dim=-1)
        k = torch.cat([k_cache, k_new], dim=2).repeat(1, self.heads, 1, 1)
        v = torch.cat([v_cache, v_new], dim=2).expand(b, self.heads, -1, self.hd)
        att = F.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd), dim=-1)
        return self.wo((att @ v).transpose(1, 2).reshape(b, 1, -1))


def _hf_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    ids = torch.randint(1, 99, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return _Out0(BertModel(cfg, add_pooling_layer=False)), (ids, mask)


def _hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                      attn_implementation="sdpa")
    ids = torch.randint(1, 99, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    return _Out0(LlamaForCausalLM(cfg)), (ids, mask)


def _hf_vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, attn_implementation="sdpa")
    return _Out0(ViTModel(cfg, add_pooling_layer=False)), (torch.randn(1, 3, 16, 16),)


class _Out0(nn.Module):
    """An HF model called positionally, returning its first output as a tensor (what an export takes)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        out = self.m(*args, return_dict=False) if len(args) > 1 else self.m(args[0], return_dict=False)
        return out[0]


ZOO = {
    "gpt2_conv1d_block": lambda: (GPT2Block(), (torch.randn(2, 8, 64),)),
    "t5_block": lambda: (T5Block(), (torch.randn(2, 8, 64),)),
    "gemm_logsumexp": lambda: (GemmLogSumExp(), (torch.randn(8, 64),)),
    "mqa_decode": lambda: (MQADecode(), (torch.randn(2, 1, 64), torch.randn(2, 1, 7, 16), torch.randn(2, 1, 7, 16))),
    "hf_bert": _hf_bert,
    "hf_llama": _hf_llama,
    "hf_vit": _hf_vit,
}


def build(name):
    torch.manual_seed(0)
    m, x = ZOO[name]()
    return m.eval(), x
