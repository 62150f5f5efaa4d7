"""Hand-written attention -> `flydsl.attention`.

Anchored on the final ``P @ V`` matmul, the matcher walks back through what real code puts
between the two matmuls and the softmax:

    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))       # nanoGPT / MinGPT
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))    #   tril buffer -> causal
    att = F.softmax(att, dim=-1); att = self.attn_dropout(att); y = att @ v

    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)          # HF BERT eager
    scores = scores + attention_mask                                       #   additive mask
    probs = nn.functional.softmax(scores, dim=-1); ctx = torch.matmul(probs, v)

    w = torch.matmul(q, repeat_kv(k, n).transpose(2, 3)) * self.scaling   # HF Llama eager
    w = w + causal_mask[:, :, :, : k.shape[-2]]
    w = softmax(w, dim=-1, dtype=torch.float32).to(q.dtype); out = torch.matmul(w, repeat_kv(v, n))

Accepted between the matmuls, in any order: a scalar mul/div (the scale; 1.0 when absent),
additive float masks (several add up to one: T5's position bias + padding mask), masked_fill with -inf or a finfo.min-like value (boolean mask; a
lower-triangular ones buffer sliced to [:Sq, :Sk] is recognized as causal), the softmax over
the last dim (optionally in fp32), then casts and eval-mode dropout. Llama's repeat_kv
(unsqueeze/expand/reshape of K and V) is undone so GQA runs without repeated K/V.
A masked_fill with finfo.min instead of -inf differs from -inf only on fully masked rows.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ..graph import ASSERT, arg, asserts, aten, dtype_of, dtype_reason, operand, shape_of, static_int
from ..registry import NO_MATCH, Stage, rule
from .attention import HEAD_DIMS

MATMULS = (aten.matmul.default, aten.bmm.default)
SOFTMAX = (aten.softmax.int, aten._softmax.default)
PASS = (aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.dropout.default, aten.clone.default,
        aten.contiguous.default, aten.type_as.default, aten.alias.default)


@dataclass
class Match:
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    scale: float = 1.0
    mask: torch.fx.Node | None = None  # additive float mask node
    more_masks: list = field(default_factory=list)  # further additive masks (T5: position bias + padding mask)
    keep_if_not: torch.fx.Node | None = None  # masked_fill condition: True = masked out
    causal: bool = False
    absorbed: list = field(default_factory=list)


def _scalar(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _only_user(n, user) -> bool:
    return isinstance(n, torch.fx.Node) and [u for u in n.users if u.target is not ASSERT] == [user]


def _real_users(n) -> list:
    """Users that read n's values: not export's dtype asserts, nor a type_as that only reads its dtype."""
    return [u for u in n.users if u.target is not ASSERT
            and not (u.target is aten.type_as.default and arg(u, "other") is n and arg(u, "self") is not n)]


def _mm_operands(n):
    """(left, right) of a matmul (self, other) or bmm (self, mat2)."""
    return arg(n, "self"), arg(n, "other" if n.target is aten.matmul.default else "mat2")


def _untranspose(kt):
    """k such that kt == k.transpose(-2, -1), else None."""
    if kt.op != "call_function":
        return None
    r = len(shape_of(kt) or ())
    if kt.target is aten.transpose.int:
        dims = {arg(kt, "dim0") % r, arg(kt, "dim1") % r}
        return arg(kt, "self") if dims == {r - 1, r - 2} else None
    if kt.target is aten.permute.default:
        p = [d % r for d in arg(kt, "dims")]
        return arg(kt, "self") if p == list(range(r - 2)) + [r - 1, r - 2] else None
    return None


def _unrepeat_kv(x, absorbed):
    """Undo HF repeat_kv: x[:, :, None].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d) -> x."""
    n = x
    chain = []
    if n.op == "call_function" and n.target in (aten.reshape.default, aten.view.default, aten._unsafe_view.default):
        chain.append(n)
        n = arg(n, "self")
        if n.op == "call_function" and n.target is aten.clone.default:
            chain.append(n)
            n = arg(n, "self")
        if n.op == "call_function" and n.target is aten.expand.default:
            chain.append(n)
            n = arg(n, "self")
            while n.op == "call_function" and n.target is aten.slice.Tensor and _full_slice(n):
                chain.append(n)
                n = arg(n, "self")
            if n.op == "call_function" and n.target is aten.unsqueeze.default and arg(n, "dim") == 2:
                chain.append(n)
                base = arg(n, "self")
                while base.op == "call_function" and base.target is aten.slice.Tensor and _full_slice(base):
                    chain.append(base)
                    base = arg(base, "self")
                if len(shape_of(base) or ()) == 4:
                    absorbed += [c for c in chain if len(c.users) == 1]
                    return base
    return x


def _full_slice(n):
    start, end, step = arg(n, "start"), arg(n, "end"), arg(n, "step")
    return start in (None, 0) and (end is None or (isinstance(end, int) and end >= 2**62)) and step == 1


_TRIL_SEEN: dict = {}  # id(buffer) -> (weakref to it, its _version, answer)


def _is_tril(buf: torch.Tensor) -> bool:
    """Every [..., n, n] plane of buf is nonzero exactly on and below the diagonal (remembered per
    buffer until it is written to: the support check and the rewrite ask about the same one)."""
    seen = _TRIL_SEEN.get(id(buf))
    if seen is not None and seen[0]() is buf and seen[1] == buf._version:
        return seen[2]
    planes = buf.reshape(-1, *buf.shape[-2:]).bool()
    ok = torch.equal(planes, torch.tril(torch.ones_like(planes[0])).expand_as(planes))
    if len(_TRIL_SEEN) > 256:
        _TRIL_SEEN.clear()
    _TRIL_SEEN[id(buf)] = (weakref.ref(buf), buf._version, ok)
    return ok


def _causal_buffer(cond, ctx, scores, absorbed) -> bool:
    """cond == (tril_buffer[..., :Sq, :Sk] == 0): the nanoGPT causal mask."""
    if not (cond.op == "call_function" and cond.target in (aten.eq.Scalar,) and arg(cond, "other") == 0):
        return False
    chain = [cond]
    n = arg(cond, "self")
    while n.op == "call_function" and n.target is aten.slice.Tensor:
        start, step = arg(n, "start"), arg(n, "step")
        if start not in (None, 0) or step != 1:
            return False
        chain.append(n)
        n = arg(n, "self")
    buf = ctx.constant(n)
    if buf is None or buf.dim() < 2 or buf.shape[-1] != buf.shape[-2]:
        return False
    if not _is_tril(buf):
        return False
    if [str(s) for s in shape_of(cond)[-2:]] != [str(s) for s in shape_of(scores)[-2:]]:
        return False
    absorbed += [c for c in chain if len(c.users) == 1]
    return True


def match(pv, ctx):
    """A Match, False when this is not attention, or a reason string when it is but cannot be fused."""
    if pv.target not in MATMULS:
        return False
    p, v = _mm_operands(pv)
    absorbed = [pv]
    while p.op == "call_function" and p.target in PASS and _only_user(p, absorbed[-1]):
        if p.target is aten.dropout.default and arg(p, "train"):
            return "dropout between softmax and @ v runs in training mode"
        absorbed += [p, *asserts(p)]
        p = operand(p)
    if not (p.op == "call_function" and p.target in SOFTMAX):
        return False
    rank = len(shape_of(p))
    if arg(p, "dim") % rank != rank - 1:
        return False
    if not _only_user(p, absorbed[-1]):
        return "the attention probabilities are also used elsewhere (e.g. returned), so they must be materialized"
    absorbed += [p, *asserts(p)]
    m = Match(q=None, k=None, v=v)
    s = arg(p, "self")
    seen_mask = seen_scale = False  # walking backwards: what was applied later is seen first
    while s.op == "call_function" and len(_real_users(s)) == 1:
        t = s.target
        if t in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar) \
                and _scalar(arg(s, "other")) is not None:
            c = _scalar(arg(s, "other"))
            if c <= 0:
                return f"score scale {c} is not positive"
            seen_scale = True
            m.scale *= c if t in (aten.mul.Tensor, aten.mul.Scalar) else 1.0 / c
            absorbed.append(s)
            s = arg(s, "self")
        elif t in (aten._to_copy.default, aten.to.dtype) and dtype_of(s) in (torch.float32, torch.bfloat16,
                                                                         torch.float16):
            absorbed += [s, *asserts(s)]  # scores.float() before the softmax (T5, HF fp32 softmax)
            s = arg(s, "self")
        elif t in (aten.add.Tensor, aten.add_.Tensor) and isinstance(arg(s, "other"), torch.fx.Node) \
                and m.keep_if_not is None \
                and not m.causal:
            mk = arg(s, "other")
            if dtype_of(mk) not in (torch.float32, torch.bfloat16, torch.float16):
                return f"additive mask dtype {dtype_of(mk)} is not a float dtype"
            if seen_scale:
                return "the scale multiplies the additive mask too (softmax(c * (qk + mask)))"
            if m.mask is not None:
                m.more_masks.append(m.mask)
            m.mask, seen_mask = mk, True
            absorbed.append(s)
            s = arg(s, "self")
        elif t in (aten.masked_fill.Scalar,) and not seen_mask:
            fill = _scalar(arg(s, "value"))
            if fill is None or not (fill == float("-inf") or fill <= -1e30):
                return f"masked_fill value {arg(s, 'value')} is not -inf or a finfo.min-like value"
            seen_mask = True
            if _causal_buffer(arg(s, "mask"), ctx, s, absorbed):
                m.causal = True
            else:
                m.keep_if_not = arg(s, "mask")
            absorbed.append(s)
            s = arg(s, "self")
        else:
            break
    if not (s.op == "call_function" and s.target in MATMULS and len(s.users) == 1):
        return False
    q, kt = _mm_operands(s)
    k = _untranspose(kt)
    if k is None:
        return False
    absorbed.append(s)
    if len(kt.users) == 1:
        absorbed.append(kt)
    m.q, m.absorbed = q, absorbed
    m.k = _unrepeat_kv(k, absorbed)
    m.v = _unrepeat_kv(v, absorbed)
    return m


def handwritten_supported(node, ctx):
    m = match(node, ctx)
    if m is False:
        return NO_MATCH
    if isinstance(m, str):
        return m
    for t, nm in ((m.q, "query"), (m.k, "key"), (m.v, "value")):
        r = dtype_reason(t, nm)
        if r:
            return r
    if not (dtype_of(m.q) == dtype_of(m.k) == dtype_of(m.v)):
        return "query/key/value dtypes differ"
    if not (len(shape_of(m.q)) == len(shape_of(m.k)) == len(shape_of(m.v)) == 4):
        return "attention operands are not 4-D [batch, heads, seq, head_dim]"
    d = static_int(shape_of(m.q)[-1])
    h, hkv = static_int(shape_of(m.q)[1]), static_int(shape_of(m.k)[1])
    if d not in HEAD_DIMS or static_int(shape_of(m.v)[-1]) != d:
        return f"head_dim={shape_of(m.q)[-1]} is outside {HEAD_DIMS.start}..{HEAD_DIMS.stop - 1} (or V differs)"
    if h is None or hkv is None or h % hkv or static_int(shape_of(m.v)[1]) != hkv:
        return f"head counts {shape_of(m.q)[1]} / {shape_of(m.k)[1]} are not a multiple of each other"
    if m.mask is not None and any(len(shape_of(x)) > 4 for x in [m.mask, *m.more_masks]):
        return "mask has more than 4 dims"
    return None


@rule(Stage.PATTERN, *MATMULS, family="attention", supported=handwritten_supported, name="attention_handwritten",
      doc="q @ kᵀ · scale (+ mask | masked_fill) -> softmax -> @ v")
def lower_handwritten(node, ctx):
    m = match(node, ctx)
    mask = m.mask
    if m.keep_if_not is not None:
        mask = ctx.insert(aten.logical_not.default, m.keep_if_not, before=node)
    elif mask is not None:
        for other in m.more_masks:  # several additive masks add up to one (broadcast as eager does)
            mask = ctx.insert(aten.add.Tensor, mask, other, before=node)
        mask = ctx.cast_in(mask, node)
    args = (ctx.cast_in(m.q, node), ctx.cast_in(m.k, node), ctx.cast_in(m.v, node), mask, m.causal, float(m.scale))
    return ctx.replace(node, "attention", "attention_handwritten", args, m.absorbed)
