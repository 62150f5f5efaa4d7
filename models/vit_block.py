"""One Vision Transformer encoder block, in the form of timm's VisionTransformer.

Mirrors timm.models.vision_transformer.Block: pre-LN (eps 1e-6), attention
with one fused qkv linear reshaped to [3, B, heads, N, head_dim] and unbound,
F.scaled_dot_product_attention (not causal, no mask), heads merged back and
projected, then an MLP (fc1, GELU, fc2), each with its residual add. The
input is the token sequence after patch embedding: a class token plus a 4x4
grid of patches = 17 tokens, so the token count is not a power of two, as in
real ViTs (197 tokens at 224 px); dim 128 in 2 heads of 64.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
num_tokens = 17  # 1 class token + 4 * 4 patches
dim = 128
num_heads = 2
mlp_ratio = 4.0


class Attention(nn.Module):
    def __init__(self, dim, num_heads, qkv_bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        return self.proj_drop(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(0.0)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x):
        x = self.drop1(self.act(self.fc1(x)))
        return self.drop2(self.fc2(x))


class Model(nn.Module):
    """timm Block with drop_path and layer scale switched off (their inference defaults)."""

    def __init__(self, dim, num_heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


def get_inputs():
    return [torch.randn(batch_size, num_tokens, dim)]


def get_init_inputs():
    return [dim, num_heads, mlp_ratio]
