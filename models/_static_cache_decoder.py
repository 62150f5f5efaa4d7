"""A Llama-style decoder with a static KV cache held in module buffers, and its greedy generate loop.

Written in the form of the widely used gpt-fast model (re-typed here, not copied): one fused
`wqkv` projection split into q / k / v, rotary embeddings applied from a precomputed
[S_max, D/2, 2] cos/sin table indexed by `input_pos` (interleaved pairs), grouped-query
attention (4 query heads share 2 key/value heads, widened by `repeat_interleave`), the KV cache
as buffers [B, Hkv, S_max, D] written with `cache[:, :, input_pos] = k`, the boolean causal
mask sliced from a [S_max, S_max] buffer by `input_pos`, SDPA with that mask, SwiGLU MLP and
RMSNorm. `forward(idx, input_pos)` is one prefill (input_pos = arange(T)) or one decode step
(input_pos = [t]); `generate` runs one prefill and then one decode call per new token.

`merge="view"` merges the heads as gpt-fast does (`y.transpose(1, 2).contiguous().view(...)`);
`merge="reshape"` writes `.reshape(...)`, which does not depend on the attention output's strides.

`build(n_layer)` is the size the stride and launch-count tests use (tests/unit/gptfast_model.py
loads it from here: one gpt-fast decoder in the tree).

The leading underscore keeps it out of the single-forward bundled-model tests (tests/e2e
test_models, test_compile_backend, test_onnx): it is a stateful model with a generate loop.
Tests: tests/e2e/test_generation.py. Bench: python -m bench.generate.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    vocab_size: int = 256
    dim: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    intermediate: int = 384
    max_seq: int = 48
    max_batch: int = 1


DEFAULT = Config()
TINY = Config(vocab_size=64, dim=64, n_layer=1, intermediate=128, max_seq=16)  # the flysim tests' size
prompt_len = 8


def rope_table(max_seq: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """cos / sin of each position and frequency: [max_seq, head_dim // 2, 2]."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq).float(), inv)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] with its last dim as (re, im) pairs, rotated by table [S, D/2, 2]."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table.view(1, pairs.size(1), 1, pairs.size(3), 2)
    re = pairs[..., 0] * t[..., 0] - pairs[..., 1] * t[..., 1]
    im = pairs[..., 1] * t[..., 0] + pairs[..., 0] * t[..., 1]
    return torch.stack([re, im], dim=-1).flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class KVCache(nn.Module):
    def __init__(self, batch: int, heads: int, max_seq: int, head_dim: int, dtype=torch.float32):
        super().__init__()
        shape = (batch, heads, max_seq, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype))

    def update(self, input_pos, k, v):
        kc, vc = self.k_cache, self.v_cache
        kc[:, :, input_pos] = k
        vc[:, :, input_pos] = v
        return kc, vc


class Attention(nn.Module):
    def __init__(self, c: Config, merge: str):
        super().__init__()
        self.c, self.head_dim = c, c.dim // c.n_head
        self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)
        self.kv_cache = KVCache(c.max_batch, c.n_kv_head, c.max_seq, self.head_dim)
        self.merge = merge

    def forward(self, x, table, mask, input_pos):
        c = self.c
        b, s, _ = x.shape
        kv = c.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([c.dim, kv, kv], dim=-1)
        q = q.view(b, s, c.n_head, self.head_dim)
        k = k.view(b, s, c.n_kv_head, self.head_dim)
        v = v.view(b, s, c.n_kv_head, self.head_dim)
        q, k = apply_rope(q, table), apply_rope(k, table)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(c.n_head // c.n_kv_head, dim=1)
        v = v.repeat_interleave(c.n_head // c.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        if self.merge == "view":
            y = y.transpose(1, 2).contiguous().view(b, s, c.dim)
        else:
            y = y.transpose(1, 2).reshape(b, s, c.dim)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.intermediate, bias=False)
        self.w3 = nn.Linear(c.dim, c.intermediate, bias=False)
        self.w2 = nn.Linear(c.intermediate, c.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: Config, merge: str):
        super().__init__()
        self.attention = Attention(c, merge)
        self.feed_forward = FeedForward(c)
        self.attention_norm = RMSNorm(c.dim)
        self.ffn_norm = RMSNorm(c.dim)

    def forward(self, x, input_pos, table, mask):
        h = x + self.attention(self.attention_norm(x), table, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Model(nn.Module):
    def __init__(self, merge: str = "view", config: Config = DEFAULT):
        super().__init__()
        c = self.config = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c, merge) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.register_buffer("freqs", rope_table(c.max_seq, c.dim // c.n_head), persistent=False)
        self.register_buffer("causal_mask", torch.tril(torch.ones(c.max_seq, c.max_seq, dtype=torch.bool)),
                             persistent=False)

    def forward(self, idx, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        table = self.freqs[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, table, mask)
        return self.output(self.norm(x))


def caches(model: nn.Module) -> list:
    """The model's KV cache buffers, in order."""
    return [b for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache"))]


def reset_caches(model: nn.Module) -> None:
    with torch.no_grad():
        for b in caches(model):
            b.zero_()


def generate(step, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy tokens: `step(idx, input_pos)` (the model, compiled or translated) is called once on the
    prompt (prefill) and then once per token with one token (decode)."""
    with torch.no_grad():
        t = prompt.shape[1]
        logits = step(prompt, torch.arange(t))
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out = [int(nxt)]
        for i in range(new_tokens - 1):
            logits = step(nxt, torch.tensor([t + i]))
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(nxt))
    return out


def build(n_layer: int = 2, seed: int = 0, merge: str = "view") -> Model:
    """The decoder at the tests' layer-count size (vocab 256, dim 128, 4 q / 2 kv heads, MLP 256, S_max 64),
    seeded, in eval mode: the gpt-fast form the stride and launch-count tests translate."""
    torch.manual_seed(seed)
    return Model(merge, Config(vocab_size=256, n_layer=n_layer, intermediate=256, max_seq=64)).eval()


def get_init_inputs():
    return []


def get_inputs(config: Config = DEFAULT, prompt: int = prompt_len):
    torch.manual_seed(1)
    return [torch.randint(0, config.vocab_size, (config.max_batch, prompt)), torch.arange(prompt)]


def shard(model: Model, rank: int, world: int, group=None) -> Model:
    """Tensor parallel in place, gpt-fast's way: each rank keeps its share of the heads (wqkv's q, k and v
    rows, wo's columns, its own KV cache) and of the MLP (w1 / w3 rows, w2 columns); a forward hook on
    wo and on w2 sums the partial outputs over the ranks with a functional all_reduce (it stays in the
    captured graph, and on ROCm runs on RCCL). Heads and the MLP width must divide by `world`."""
    import dataclasses

    from torch.distributed import _functional_collectives as funcol

    c = model.config
    if c.n_head % world or c.n_kv_head % world or c.intermediate % world:
        raise ValueError(f"{c.n_head} q / {c.n_kv_head} kv heads and MLP {c.intermediate} must divide by {world} ranks")
    hd = c.dim // c.n_head
    local = dataclasses.replace(c, n_head=c.n_head // world, n_kv_head=c.n_kv_head // world, dim=c.dim // world)

    def rows(w, start, n):
        return w[start + rank * n: start + (rank + 1) * n]

    def linear(weight):
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        lin.weight = nn.Parameter(weight.detach().clone())
        return lin

    def reduce(_mod, _inp, out):
        return funcol.all_reduce(out, "sum", group if group is not None else torch.distributed.group.WORLD)

    for layer in model.layers:
        att, ff = layer.attention, layer.feed_forward
        q, kv = local.n_head * hd, local.n_kv_head * hd
        w = att.wqkv.weight
        att.wqkv = linear(torch.cat([rows(w, 0, q), rows(w, c.dim, kv), rows(w, c.dim + c.n_kv_head * hd, kv)]))
        att.wo = linear(att.wo.weight[:, rank * q:(rank + 1) * q])
        att.c = local
        att.kv_cache = KVCache(c.max_batch, local.n_kv_head, c.max_seq, hd)
        ff.w1, ff.w3 = linear(rows(ff.w1.weight, 0, c.intermediate // world)), \
            linear(rows(ff.w3.weight, 0, c.intermediate // world))
        ff.w2 = linear(ff.w2.weight[:, rank * (c.intermediate // world):(rank + 1) * (c.intermediate // world)])
        att.wo.register_forward_hook(reduce)
        ff.w2.register_forward_hook(reduce)
    return model
