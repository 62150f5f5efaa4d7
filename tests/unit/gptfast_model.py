"""A tiny gpt-fast-style Llama decoder (re-typed from the well-known public form of that
reference): a static KV cache held in module buffers and written with ``cache[:, :, pos] = k``,
RoPE from a precomputed complex table applied through ``view_as_complex``, the causal mask
sliced from a buffer by ``input_pos``, SDPA with GQA by ``repeat_interleave``, and the attention
output as ``y.transpose(1, 2).contiguous().view(B, S, D)``. Tests build it with `build()`."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache(nn.Module):
    def __init__(self, b, s_max, heads, hd, dtype=torch.float32):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(b, heads, s_max, hd, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(b, heads, s_max, hd, dtype=dtype))

    def update(self, input_pos, k_val, v_val):
        k_out, v_out = self.k_cache, self.v_cache
        k_out[:, :, input_pos] = k_val
        v_out[:, :, input_pos] = v_val
        return k_out, v_out


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


def precompute_freqs_cis(seq_len, n_elem, base=10000):
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2)[: (n_elem // 2)].float() / n_elem))
    t = torch.arange(seq_len)
    freqs = torch.outer(t, freqs)
    cis = torch.polar(torch.ones_like(freqs), freqs)
    return torch.stack([cis.real, cis.imag], dim=-1)


def apply_rotary_emb(x, freqs_cis):
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    freqs_cis = freqs_cis.view(1, xshaped.size(1), 1, xshaped.size(3), 2)
    x_out2 = torch.stack([
        xshaped[..., 0] * freqs_cis[..., 0] - xshaped[..., 1] * freqs_cis[..., 1],
        xshaped[..., 1] * freqs_cis[..., 0] + xshaped[..., 0] * freqs_cis[..., 1],
    ], -1)
    return x_out2.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim, n_head, n_local_heads):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim, self.dim = n_head, n_local_heads, dim // n_head, dim
        total = (n_head + 2 * n_local_heads) * self.head_dim
        self.wqkv = nn.Linear(dim, total, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.kv_cache = None

    def forward(self, x, freqs_cis, mask, input_pos=None):
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        q = apply_rotary_emb(q, freqs_cis)
        k = apply_rotary_emb(k, freqs_cis)
        q, k, v = map(lambda t: t.transpose(1, 2), (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        y = y.transpose(1, 2).contiguous().view(bsz, seqlen, self.dim)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_head, n_local_heads, hidden):
        super().__init__()
        self.attention = Attention(dim, n_head, n_local_heads)
        self.feed_forward = FeedForward(dim, hidden)
        self.ffn_norm, self.attention_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, input_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab=256, dim=128, n_layer=2, n_head=4, n_local_heads=2, hidden=256, block_size=64):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_head, n_local_heads, hidden) for _ in range(n_layer))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.n_head, self.n_local_heads, self.head_dim = n_head, n_local_heads, dim // n_head
        self.register_buffer("freqs_cis", precompute_freqs_cis(block_size, self.head_dim))
        self.register_buffer("causal_mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)))
        self.block_size = block_size

    def setup_caches(self, max_batch_size, max_seq_length):
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, self.n_local_heads, self.head_dim)

    def forward(self, idx, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        freqs_cis = self.freqs_cis[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.output(self.norm(x))


def build(n_layer=2, cache=True, seed=0, **kw):
    torch.manual_seed(seed)
    m = Transformer(n_layer=n_layer, **kw).eval()
    if cache:
        m.setup_caches(1, m.block_size)
    return m
