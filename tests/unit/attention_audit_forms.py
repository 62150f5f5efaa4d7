"""Attention blocks written the way users write them, for the matcher audit
(test_attention_audit.py): each form is a small module plus its inputs, in the styles of code
outside this tree (old HF GPT-2 / Bloom / T5 / BERT, Gemma-2, Swin-V2, Llama-style GQA, timm,
nanoGPT, torch's nn.MultiheadAttention), at varied shapes: head_dim 8..256, odd sequence
lengths, Sq != Sk, float32 and bfloat16."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rnd(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(b=1, h=2, sq=7, d=16, sk=None, hkv=None, dtype=torch.float32):
    sk = sq if sk is None else sk
    return (rnd(b, h, sq, d, seed=11, dtype=dtype), rnd(b, hkv or h, sk, d, seed=12, dtype=dtype),
            rnd(b, hkv or h, sk, d, seed=13, dtype=dtype))


class WhereFinfoCausal(nn.Module):
    """torch.where(causal_bool, s, finfo.min), the bool built by the user from a tril buffer."""

    def __init__(self, n=32):
        super().__init__()
        self.register_buffer("tri", torch.ones(n, n).tril().bool(), persistent=False)

    def forward(self, q, k, v):
        sq, sk = q.shape[2], k.shape[2]
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
        s = torch.where(self.tri[:sq, :sk], s, torch.finfo(s.dtype).min)
        return torch.matmul(s.softmax(-1), v)


class WhereInputMask(nn.Module):
    """torch.where(keep, s, finfo.min) with a bool keep-mask input, Sq != Sk."""

    def forward(self, q, k, v, keep):
        s = q @ k.transpose(-1, -2) * q.size(-1) ** -0.5
        s = torch.where(keep, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
        return F.softmax(s, dim=-1) @ v


class ScaleFull(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / torch.full([], q.size(-1) ** 0.5, dtype=q.dtype)
        return torch.softmax(s, -1) @ v


class ScaleTensorSqrt(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) / torch.tensor(q.size(-1)).sqrt()
        return torch.matmul(torch.softmax(s, -1), v)


class ScaleBuffer(nn.Module):
    """A registered buffer holding the scale (not a parameter)."""

    def __init__(self, d):
        super().__init__()
        self.register_buffer("scale", torch.tensor(d ** -0.5))

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, -1) @ v


class MHA(nn.Module):
    def __init__(self, e=48, h=3, batch_first=True, need_weights=None):
        super().__init__()
        self.attn = nn.MultiheadAttention(e, h, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        kw = {} if self.need_weights is None else {"need_weights": self.need_weights}
        out, _ = self.attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, **kw)
        return out


class MHACross(nn.Module):
    """Cross attention, Sq != Sk (weights discarded, or not computed)."""

    def __init__(self, e=32, h=4, need_weights=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(e, h, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x, mem):
        return self.attn(x, mem, mem, need_weights=self.need_weights)[0]


class SoftCap(nn.Module):
    def __init__(self, cap=30.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = torch.tanh(s / self.cap) * self.cap
        return torch.softmax(s.float(), -1).to(q.dtype) @ v


class SwinV2(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(h, 1, 1)))

    def forward(self, q, k, v):
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
        return attn.softmax(dim=-1) @ v


def expand_kv(how: str, x, n: int):
    """K / V from Hkv to Hkv * n heads as GQA code writes it; "repeat_kv" is HF's own function."""
    if how == "repeat_interleave":
        return torch.repeat_interleave(x, n, dim=1)
    if how == "expand_reshape":
        b, h, s, d = x.shape
        return x.unsqueeze(2).expand(b, h, n, s, d).reshape(b, h * n, s, d)
    from transformers.models.llama.modeling_llama import repeat_kv
    return repeat_kv(x, n)


class GQA(nn.Module):
    """Llama-style eager GQA: softmax in fp32, cast back to the query's dtype."""

    def __init__(self, how, n):
        super().__init__()
        self.how, self.n = how, n

    def forward(self, q, k, v):
        k, v = expand_kv(self.how, k, self.n), expand_kv(self.how, v, self.n)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
        return torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)


class InplaceBias(nn.Module):
    def forward(self, q, k, v, bias):
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores += bias
        return torch.matmul(F.softmax(scores.float(), dim=-1).type_as(scores), v)


class InplaceMaskedFill(nn.Module):
    def forward(self, q, k, v, pad):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        return scores.softmax(-1) @ v


class Plain(nn.Module):
    """softmax(q kᵀ / sqrt(d)) v; head_dim comes from the inputs."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v


class Sdpa(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kw)


class SoftmaxDim3(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(2, 3) * 0.125, dim=3) @ v


class FloatTypeAs(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul(F.softmax(s.float(), -1).type_as(q), v)


class SoftmaxDtype(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-1, -2))
        return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype), v)


class DropoutEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, q, k, v):
        p = self.drop(torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1))
        return p @ v


class Einsum(nn.Module):
    def forward(self, q, k, v):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
        return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)


class KPermute(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.permute(0, 1, 3, 2) / math.sqrt(q.shape[-1])
        return s.softmax(-1) @ v


class KPermuteFromBSHD(nn.Module):
    """k given [B, S, H, D], permuted straight to [B, H, D, S] (timm / older ViT code)."""

    def forward(self, q, k, v):
        s = q @ k.permute(0, 2, 3, 1) * q.shape[-1] ** -0.5
        return s.softmax(-1) @ v.transpose(1, 2)


def alibi_slopes(h):
    return torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)])


class BloomBaddbmm(nn.Module):
    """Older HF Bloom: baddbmm(alibi, q, kᵀ, beta=1, alpha=1/sqrt(d)) over [B*H, S, D], then the
    view to [B, H, Sq, Sk], a masked_fill with finfo.min, softmax in fp32, bmm with V."""

    def __init__(self, h):
        super().__init__()
        self.h = h

    def forward(self, q, k, v, alibi, causal):
        bh, sq, d = q.shape
        s = alibi.baddbmm(batch1=q, batch2=k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(d))
        s = s.view(bh // self.h, self.h, sq, -1)
        s = torch.masked_fill(s, causal, torch.finfo(s.dtype).min)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(p.view(bh, sq, -1), v)


class T5(nn.Module):
    """T5: no scaling, position bias added (out of place)."""

    def forward(self, q, k, v, position_bias):
        scores = torch.matmul(q, k.transpose(3, 2))
        scores = scores + position_bias
        w = F.softmax(scores.float(), dim=-1).type_as(scores)
        w = F.dropout(w, p=0.1, training=False)
        return torch.matmul(w, v)


class QPreScaled(nn.Module):
    def forward(self, q, k, v):
        q = q * q.shape[-1] ** -0.5
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v


class ArangeCausal(nn.Module):
    """A causal mask built from arange comparisons at run time."""

    def forward(self, q, k, v):
        sq, sk = q.shape[-2], k.shape[-2]
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(j > i, float("-inf"))
        return s.softmax(-1) @ v


class ArangeKeep(nn.Module):
    """The same with torch.where and a keep condition (i >= j)."""

    def forward(self, q, k, v):
        sq = q.shape[-2]
        pos = torch.arange(sq, device=q.device)
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = torch.where(pos[:, None] >= pos[None, :], s, float("-inf"))
        return s.softmax(-1) @ v


class TriuNegInf(nn.Module):
    """mask = torch.triu(full(-inf), diagonal=1), added (nn.Transformer.generate_square_subsequent_mask)."""

    def forward(self, q, k, v):
        sq = q.shape[-2]
        mask = torch.triu(torch.full((sq, sq), float("-inf")), diagonal=1)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
        return s.softmax(-1) @ v


class TriuBoolFill(nn.Module):
    """masked_fill(torch.triu(ones, diagonal), -inf): causal at diagonal=1 (2 also keeps the next key)."""

    def __init__(self, diagonal=1):
        super().__init__()
        self.diagonal = diagonal

    def forward(self, q, k, v):
        sq = q.shape[-2]
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=self.diagonal), float("-inf"))
        return s.softmax(-1) @ v


class BertAdditive(nn.Module):
    """BERT eager: the [B, 1, 1, Sk] extended mask (1 - m) * finfo.min added."""

    def forward(self, q, k, v, m):
        ext = (1.0 - m[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1)) + ext
        return torch.matmul(nn.functional.softmax(s, dim=-1), v)


class DecodeKVCache(nn.Module):
    """One new token against a KV cache grown with torch.cat (Sq = 1)."""

    def forward(self, q, k_cache, v_cache, k_new, v_new):
        k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


class TimmQKV(nn.Module):
    """timm ViT: one qkv projection, reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4), unbind."""

    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.qkv, self.heads = nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, n, c)


class ReorderUpcast(nn.Module):
    """HF GPT-2's reorder_and_upcast_attn: baddbmm(torch.empty(..), q, kᵀ, beta=0, alpha=1/sqrt(d))
    over [B*H] reshapes of the [B, H, S, D] q and kᵀ, in fp32, viewed back to [B, H, Sq, Sk]."""

    def forward(self, q, k, v, mask):
        b, h, sq, d = q.shape
        sk = k.shape[-2]
        w = torch.empty(b * h, sq, sk, dtype=torch.float32)
        q2, k2 = q.reshape(-1, sq, d), k.transpose(-1, -2).reshape(-1, d, sk)
        w = torch.baddbmm(w, q2.float(), k2.float(), beta=0, alpha=1.0 / math.sqrt(d))
        w = w.reshape(b, h, sq, sk) + mask
        return torch.matmul(F.softmax(w, dim=-1).type(v.dtype), v)


class AnnotatedTransformer(nn.Module):
    """The Annotated Transformer: masked_fill(mask == 0, -1e9) with an int padding mask."""

    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(F.softmax(s.masked_fill(mask == 0, -1e9), dim=-1), v)


class SoftmaxModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q, k, v):
        return self.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5) @ v


class XTransformers(nn.Module):
    """x-transformers: einsum with spaces, a bottom-right causal triu(j - i + 1), -finfo.max."""

    def forward(self, q, k, v):
        dots = torch.einsum("b h i d, b h j d -> b h i j", q, k) * q.shape[-1] ** -0.5
        i, j = dots.shape[-2:]
        mask = torch.ones((i, j), dtype=torch.bool).triu(j - i + 1)
        dots = dots.masked_fill(mask, -torch.finfo(dots.dtype).max)
        return torch.einsum("b h i j, b h j d -> b h i d", dots.softmax(dim=-1), v)


class Temperature(nn.Module):
    """A learned 0-dim temperature dividing the scores."""

    def __init__(self):
        super().__init__()
        self.t = nn.Parameter(torch.tensor(2.0))

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / self.t, -1) @ v


class ManualSoftmax(nn.Module):
    """The softmax written out: exp of the max-shifted scores over their sum (amax or max().values)."""

    def __init__(self, how="amax"):
        super().__init__()
        self.how = how

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        top = s.amax(-1, keepdim=True) if self.how == "amax" else s.max(dim=-1, keepdim=True).values
        e = torch.exp(s - top)
        return (e / e.sum(dim=-1, keepdim=True)) @ v


class ManualSoftmaxAlone(nn.Module):
    """A hand-written softmax that is not attention (no product after it): left as it was."""

    def forward(self, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
