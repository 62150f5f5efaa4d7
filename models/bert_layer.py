"""One BERT encoder layer, in the eager form of Hugging Face transformers.

Mirrors BertLayer (BertSelfAttention + BertSelfOutput + BertIntermediate +
BertOutput) with attn_implementation="eager": separate query/key/value
linears, heads via view + permute, `scores = q @ k^T / sqrt(head_size)`,
plus the additive extended attention mask, softmax, dropout, `@ v`; then
dense + dropout + LayerNorm(x + residual), an intermediate dense with GELU
and an output dense + dropout + LayerNorm(x + residual). The mask input is
what BertModel passes down: [B, 1, 1, T], 0 where attended and the dtype's
minimum where padded (the second sequence has 4 padding tokens). Sizes are
bert-tiny's: hidden 128, 2 heads of 64, intermediate 512.
"""

import math

import torch
import torch.nn as nn

batch_size = 2
seq_len = 16
hidden_size = 128
num_attention_heads = 2
intermediate_size = 512
layer_norm_eps = 1e-12
dropout_prob = 0.1


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, dropout_prob):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        self.key = nn.Linear(hidden_size, self.all_head_size)
        self.value = nn.Linear(hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(dropout_prob)

    def transpose_for_scores(self, x):
        # [B, T, all_head_size] -> [B, heads, T, head_size]
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))

        # raw attention scores: dot product of every query with every key
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            # the extended mask is additive: 0 for kept positions, a huge negative for padding
            attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)

        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(new_shape)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden_size, layer_norm_eps, dropout_prob):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(hidden_states + input_tensor)


class BertIntermediate(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, intermediate_size, hidden_size, layer_norm_eps, dropout_prob):
        super().__init__()
        self.dense = nn.Linear(intermediate_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(hidden_states + input_tensor)


class Model(nn.Module):
    """BertLayer: attention, then the feed-forward part."""

    def __init__(self, hidden_size, num_attention_heads, intermediate_size, layer_norm_eps, dropout_prob):
        super().__init__()
        self.self_attention = BertSelfAttention(hidden_size, num_attention_heads, dropout_prob)
        self.attention_output = BertSelfOutput(hidden_size, layer_norm_eps, dropout_prob)
        self.intermediate = BertIntermediate(hidden_size, intermediate_size)
        self.output = BertOutput(intermediate_size, hidden_size, layer_norm_eps, dropout_prob)

    def forward(self, hidden_states, attention_mask):
        self_outputs = self.self_attention(hidden_states, attention_mask)
        attention_output = self.attention_output(self_outputs, hidden_states)
        intermediate_output = self.intermediate(attention_output)
        return self.output(intermediate_output, attention_output)


def get_inputs():
    hidden_states = torch.randn(batch_size, seq_len, hidden_size)
    # 1 = real token, 0 = padding; BertModel turns it into an additive [B, 1, 1, T] mask
    padding_mask = torch.ones(batch_size, seq_len)
    padding_mask[1, seq_len - 4:] = 0
    extended = padding_mask[:, None, None, :]
    attention_mask = (1.0 - extended) * torch.finfo(torch.float32).min
    return [hidden_states, attention_mask]


def get_init_inputs():
    return [hidden_size, num_attention_heads, intermediate_size, layer_norm_eps, dropout_prob]
