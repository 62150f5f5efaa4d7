"""Hand-written attention -> `flydsl.attention`.

Anchored on the final ``P @ V`` product, the matcher walks back through what real code puts
between the two products and the softmax:

    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))       # nanoGPT / MinGPT
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))    #   tril buffer -> causal
    att = F.softmax(att, dim=-1); att = self.attn_dropout(att); y = att @ v

    w = torch.matmul(q, k.transpose(-1, -2))                               # HF GPT-2 eager (old)
    w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)               #   0-dim scale, folded
    w = torch.where(self.bias[:, :, :S, :S], w, torch.full([], finfo.min))  #   keep-mask -> causal

    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)          # HF BERT eager
    scores = scores + attention_mask                                       #   additive mask

    scores = torch.matmul(q, k.transpose(3, 2)); scores += position_bias   # HF T5 (in place)

    w = torch.matmul(q, repeat_kv(k, n).transpose(2, 3)) * self.scaling   # HF Llama / Gemma-2
    w = torch.tanh(w / softcap) * softcap                                  #   logit soft-cap
    w = w + causal_mask[:, :, :, : k.shape[-2]]
    w = softmax(w, dim=-1, dtype=torch.float32).to(q.dtype); out = torch.matmul(w, repeat_kv(v, n))

    attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)   # Swin-V2 cosine
    attn = attn * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()     #   per-head scale

    nn.MultiheadAttention (batch_first either way): q * scale, bmm over [B*H, S, D] operands.

    s = alibi.baddbmm(q, k, beta=1.0, alpha=inv_norm).view(b, h, sq, sk)  # HF Bloom (older)
    s = torch.masked_fill(s, mask, finfo.min)                              #   ALiBi in the [B*H] frame,
    p = softmax(s, -1, dtype=torch.float32).to(dt); torch.bmm(p.view(b * h, sq, sk), v)  # mask in [B, H]

    w = torch.baddbmm(torch.empty(..), q.reshape(-1, sq, d).float(),       # HF GPT-2 reorder_and_upcast_attn
                      k.transpose(-1, -2).reshape(-1, d, sk).float(), beta=0, alpha=scale)
    w = w.reshape(b, h, sq, sk) + mask; torch.matmul(softmax(w, -1).type(v.dtype), v)  # [B, H] q, k read

In computation order the kernel applies: scale (numbers and 0-dim constants fold into one
float; a per-head or runtime 0-dim tensor becomes `head_scale`), soft-cap, then the masks
(several additive masks add up; boolean masks from masked_fill / where combine into one
keep-mask; a tril buffer, or a causal mask built in forward from aranges or triu, becomes
causal). Casts, eval-mode dropout and contiguous copies are
absorbed anywhere on the way; K / V expansions for GQA / MQA are undone (attention_forms).
A step in another order (a mask before the soft-cap, a scale on the mask) is declined.

No silent miss: once a softmax over the key dim sits between a Q·Kᵀ product and a ·V
product, every way the match can fail returns a reason, and the report shows
"not taken by attention: <reason>" on the chain's products and softmax. Only what is not
such a chain (a softmax over router logits @ experts) is NO_MATCH.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..graph import ASSERT, arg, asserts, aten, dtype_of, dtype_reason, is_call, operand, shape_of, static_int
from ..registry import NO_MATCH, Reason, Stage, rule
from . import attention_softmax  # noqa: F401  (a softmax written out by hand -> aten.softmax first)
from .attention import HEAD_DIMS, PREFIX
from .attention_sinks import sink_cut, sink_logits, sink_scores
from .attention_unread import unread_chain
from .attention_forms import (RESHAPES, causal_bias, causal_keep, computed_causal, fill_value, fixed_dim, masks_out,
                              per_head, scalar_value, softcap_of, unexpand_kv)
from .forms import find_qk, product_of

MATMULS = (aten.matmul.default, aten.bmm.default)
SOFTMAX = (aten.softmax.int, aten._softmax.default)
CASTS = (aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default)
PASS = (*CASTS, aten.dropout.default, aten.clone.default, aten.contiguous.default, aten.alias.default)
MULS = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)
ADDS = (aten.add.Tensor, aten.add_.Tensor)
FILLS = (aten.masked_fill.Scalar, aten.masked_fill.Tensor)
WHERES = (aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf)
MASK, CAP, SCALE = 0, 1, 2  # walking back from the softmax: what is seen first was applied last


@dataclass
class Match:
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    scale: float = 1.0
    head_scale: list = field(default_factory=list)  # (node, divides): tensor multipliers -> head_scale
    softcap: float | None = None
    masks: list = field(default_factory=list)  # ("add" | "keep" | "drop", node, frame), applied last first
    causal: bool = False
    transpose_k: bool = False  # the product's right operand is Kᵀ itself (no transpose to undo)
    phase: int = MASK  # how far back the walk got: MASK, CAP (soft-cap seen) or SCALE
    frames: list = field(default_factory=list)  # (scores node, is a mask) wherever a mask or tensor scale applies
    heads: int | None = None  # [B*H, S, D] operands whose scores were viewed as [B, H, Sq, Sk]: H
    same_batch: bool = False  # both products are bmm / baddbmm: torch itself requires one batch size
    sink_cut: bool = False  # the softmax's last column (the sink's) is dropped before ·V
    sinks: torch.fx.Node | None = None  # [H] logits that join the denominator (attention_sinks.py)
    absorbed: list = field(default_factory=list)


def _op(n) -> str:
    t = n.target
    return f"aten.{t._opname}" if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


def _real_users(n) -> list:
    """Users that read n's values: not export's dtype asserts, nor a type_as that only reads its dtype."""
    return [u for u in n.users if u.target is not ASSERT
            and not (u.target is aten.type_as.default and arg(u, "other") is n and arg(u, "self") is not n)]


def _take(absorbed, *nodes):
    for n in nodes:
        absorbed += [n, *asserts(n)]


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


def _last_dim_softmax(n) -> bool:
    return is_call(n, *SOFTMAX) and arg(n, "dim") % len(shape_of(n)) == len(shape_of(n)) - 1


def chain_of(pv):
    """(softmax, Q·Kᵀ) when pv multiplies probabilities from a softmax over Q·Kᵀ scores by V, else None."""
    if product_of(pv) is None:
        return None
    start = product_of(pv)[0]
    last2 = [str(d) for d in (shape_of(start) or ())[-2:]]
    todo, seen = [(start, 0)], set()
    while todo:  # breadth first through what sits between the softmax and ·V (probabilities-shaped)
        p, depth = todo.pop(0)
        if not isinstance(p, torch.fx.Node) or p.op != "call_function" or p in seen or product_of(p) is not None:
            continue
        seen.add(p)
        if _last_dim_softmax(p):
            qk = find_qk(arg(p, "self"))
            if qk is None and sink_scores(arg(p, "self")) is not None:  # cat([scores, sinks], -1)
                qk = find_qk(sink_scores(arg(p, "self")))
            return (p, qk) if qk is not None else None
        if depth < 6:
            todo += [(a, depth + 1) for a in p.all_input_nodes
                     if [str(d) for d in (shape_of(a) or ())[-2:]] == last2 or sink_cut(p)]
    return None


def match(pv, ctx):
    """A Match, False when pv is not the end of an attention chain, or the reason it cannot be fused."""
    found = chain_of(pv)
    if found is None:
        return False
    sm, qk = found
    p, v, vt = product_of(pv)
    if vt:
        return "V enters the ·V product transposed"
    m = Match(q=None, k=None, v=v, absorbed=[pv])
    while p is not sm:
        if sink_cut(p) and not m.sink_cut and len(_real_users(p)) == 1:
            m.sink_cut = True
            _take(m.absorbed, p)
            p = operand(p)
            continue
        if not ((p.target in PASS or _keeps_last2(p)) and len(_real_users(p)) == 1):
            return f"{_op(p)} between the softmax and ·V is not a cast or eval-mode dropout"
        if p.target is aten.dropout.default and arg(p, "train"):
            return "dropout between softmax and @ v runs in training mode"
        _take(m.absorbed, p)
        p = operand(p)
    if len(_real_users(sm)) != 1:
        return "the attention probabilities are also used elsewhere (e.g. returned), so they must be materialized"
    if dtype_of(sm) not in (torch.float32, torch.bfloat16, torch.float16):
        return f"softmax output dtype {dtype_of(sm)} is not a float dtype the kernel takes"
    _take(m.absorbed, sm)
    s = arg(sm, "self")
    if m.sink_cut:
        found = sink_logits(s, fixed_dim(sm, 1) if len(shape_of(sm)) == 4 else None, m.absorbed)
        if isinstance(found, str):
            return found
        s, m.sinks = found
    s = _walk_scores(s, m, ctx)
    if isinstance(s, str):
        return s
    if s is not qk:
        return f"the scores come from {_op(s)}, not from the Q·Kᵀ product"
    reason = _baddbmm(m, qk) or _frame(m, qk)
    if reason:
        return reason
    if len(_real_users(qk)) != 1:
        return "the raw scores Q·Kᵀ are also used elsewhere"
    q, kt, bt = product_of(qk)
    m.same_batch = all(is_call(x, aten.bmm.default, aten.baddbmm.default) for x in (qk, pv))
    k = kt if bt else _untranspose(kt)
    _take(m.absorbed, qk)
    if k is None:
        k, m.transpose_k = kt, True
    elif not bt and len(kt.users) == 1:
        m.absorbed.append(kt)
    if is_call(q, aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar) and len(_real_users(q)) == 1 \
            and isinstance(arg(q, "other"), (int, float)) and arg(q, "other") > 0:  # q pre-scaled (nn.MHA)
        c = arg(q, "other")
        m.scale *= c if q.target in (aten.mul.Tensor, aten.mul.Scalar) else 1.0 / c
        _take(m.absorbed, q)
        q = arg(q, "self")
    m.q = q
    m.k = unexpand_kv(k, m.absorbed) if not m.transpose_k else k
    m.v = unexpand_kv(m.v, m.absorbed)
    if len(_dims(m.v)) == 4 and len(_dims(m.q)) == 3 and len(_dims(sm)) == 4 and fixed_dim(sm, 1):
        _unmerge_heads(m, fixed_dim(sm, 1))
    return m


def _merged(x, heads, chain):
    """The [B, H, .., ..] tensor a [B*H, .., ..] product operand x was reshaped from (through an
    upcast to fp32: products of 16-bit values are exact in fp32, as the kernel accumulates),
    else None."""
    while is_call(x, aten._to_copy.default, aten.to.dtype) and dtype_of(x) == torch.float32 \
            and dtype_of(operand(x)) in (torch.float32, torch.bfloat16, torch.float16):
        chain.append(x)
        x = operand(x)
    if not is_call(x, *RESHAPES) or len(_dims(arg(x, "self"))) != 4:
        return None
    src = arg(x, "self")
    if fixed_dim(src, 1) != heads or _dims(src)[-2:] != _dims(x)[-2:]:
        return None
    chain.append(x)
    return src


def _unmerge_heads(m: Match, heads: int):
    """q / Kᵀ reshaped from [B, H, S, D] to [B*H, S, D] for a bmm / baddbmm whose scores are viewed
    back as [B, H, Sq, Sk] and multiply a [B, H, Sk, D] V (HF GPT-2's reorder_and_upcast_attn):
    the kernel reads the [B, H, ...] tensors themselves."""
    chain = []
    q, k = _merged(m.q, heads, chain), _merged(m.k, heads, chain)
    if q is None or k is None:
        return
    m.q, m.heads = q, heads  # masks given on the [B*H, Sq, Sk] scores are split as the operands are
    kk = _untranspose(k) if m.transpose_k else None
    if kk is not None:
        chain.append(k)
        k, m.transpose_k = kk, False
    m.k = k if m.transpose_k else unexpand_kv(k, m.absorbed)
    m.absorbed += [c for c in chain if len(_real_users(c)) <= 1]


def _keeps_last2(n) -> bool:
    """n is a view / reshape that keeps the last two dims (it only splits or merges leading dims)."""
    if not is_call(n, *RESHAPES) or not isinstance(arg(n, "self"), torch.fx.Node):
        return False
    a, b = shape_of(arg(n, "self")), shape_of(n)
    return a is not None and b is not None and [str(d) for d in a[-2:]] == [str(d) for d in b[-2:]]


def _frame(m: Match, qk):
    """Where the masks and tensor scales apply on views of the scores: the product's own shape,
    and at most one [B, H, Sq, Sk] split of a [B*H, Sq, Sk] product (sets m.heads; masks in the
    product's frame are split with it, as older HF Bloom adds ALiBi by baddbmm before its view)."""
    own = _dims(qk)
    split = {tuple(_dims(f)): (f, is_mask) for f, is_mask in m.frames if _dims(f) != own}
    if not split:
        return None
    if len(split) > 1:
        return f"masks or scales apply to different views of the scores ({sorted(split)})"
    ((f, _),) = split.values()
    if len(own) == 3 and len(_dims(f)) == 4 and fixed_dim(f, 1) is not None:
        if any(not is_mask and _dims(x) == own for x, is_mask in m.frames):
            return "a per-head scale applies to the [B*H, Sq, Sk] product, a mask to its [B, H, Sq, Sk] view"
        m.heads = fixed_dim(f, 1)  # the view keeps Sq, Sk: at run time its dims 0, 1 split the product's dim 0
        return None
    return f"masks apply to the scores viewed as {_dims(f)}, not a [B, H, Sq, Sk] split of the product's {own}"


def _chain_first(n, s_shape):
    """(chain operand, other operand) of a binary op on the scores."""
    a, b = arg(n, "self"), arg(n, "other")
    sa = [str(d) for d in shape_of(a) or ()] if isinstance(a, torch.fx.Node) else None
    sb = [str(d) for d in shape_of(b) or ()] if isinstance(b, torch.fx.Node) else None
    if sa != s_shape and sb == s_shape:
        return b, a
    return a, b


def _walk_scores(s, m: Match, ctx):
    """Walk back from the softmax input, filling m; returns the node reached (the product) or a reason."""
    phase = m.phase
    while product_of(s) is None:
        if not isinstance(s, torch.fx.Node) or s.op != "call_function":
            return f"the scores come from {s}, not from the Q·Kᵀ product"
        shape = [str(d) for d in shape_of(s)]
        if len(_real_users(s)) != 1:
            return f"the scores after {_op(s)} are also used elsewhere"
        t = s.target
        cap = softcap_of(s)
        if t in CASTS:
            if dtype_of(s) not in (torch.float32, torch.bfloat16, torch.float16):
                return f"the scores are cast to {dtype_of(s)}"
            _take(m.absorbed, s)
            s = operand(s)
        elif cap is not None:
            if phase == SCALE:
                return "a scale is applied after the soft-cap (the kernel scales before capping)"
            if m.softcap is not None:
                return "the scores are soft-capped twice"
            m.softcap, phase = cap[0], CAP
            _take(m.absorbed, s, cap[1], cap[2])
            s = arg(cap[2], "self")
        elif t in MULS:
            divides = t in (aten.div.Tensor, aten.div.Scalar)
            chain, other = (arg(s, "self"), arg(s, "other")) if divides else _chain_first(s, shape)
            reason = _scale_step(m, other, divides, s, ctx)
            if reason:
                return reason
            phase = SCALE
            _take(m.absorbed, s)
            s = chain
        elif t in ADDS and isinstance(arg(s, "other"), torch.fx.Node) and arg(s, "alpha") == 1:
            if phase != MASK:
                return "an additive mask is applied before the " + ("soft-cap" if phase == CAP else
                                                                   "scale (softmax(c * (qk + mask)))")
            chain, mk = _chain_first(s, shape)
            if dtype_of(mk) not in (torch.float32, torch.bfloat16, torch.float16):
                return f"additive mask dtype {dtype_of(mk)} is not a float dtype"
            if causal_bias(mk, s, m.absorbed):
                m.causal = True
            else:
                m.masks.append(("add", mk, s))
                m.frames.append((s, True))
            _take(m.absorbed, s)
            s = chain
        elif _keeps_last2(s):  # a view of the scores that splits or merges batch and heads
            _take(m.absorbed, s)
            s = arg(s, "self")
        elif t in FILLS or t in WHERES:
            step = _fill_step(s, t, m, phase, ctx)
            if isinstance(step, str):
                return step
            _take(m.absorbed, s)
            s = step
        else:
            return f"{_op(s)} between Q·Kᵀ and the softmax is not a scale, mask, bias, soft-cap or cast"
        m.phase = phase
    return s


def _baddbmm(m: Match, qk):
    """baddbmm(mask, q, kᵀ, beta=1, alpha=c): the additive mask and the scale c (beta=0: no mask),
    or a reason."""
    if not is_call(qk, aten.baddbmm.default):
        return None
    beta, alpha = arg(qk, "beta"), arg(qk, "alpha")
    if beta not in (0, 1) or not isinstance(alpha, (int, float)) or alpha <= 0:
        return f"baddbmm with beta={beta}, alpha={alpha} (only beta 1 or 0 and a positive alpha are a mask and a scale)"
    if beta == 0:  # the input is ignored (HF GPT-2's reorder_and_upcast_attn passes torch.empty)
        m.scale *= alpha
        m.absorbed += _consts(arg(qk, "self"))
        return None
    if m.phase != MASK:
        return "the mask is added (baddbmm) before the " + ("soft-cap" if m.phase == CAP else "scale")
    mask = arg(qk, "self")
    if dtype_of(mask) not in (torch.float32, torch.bfloat16, torch.float16):
        return f"additive mask dtype {dtype_of(mask)} is not a float dtype"
    m.scale *= alpha
    m.masks.append(("add", mask, qk))
    m.frames.append((qk, True))
    return None


def _consts(n) -> list:
    """n and what only it reads (a folded constant's nodes: they die with the rewrite)."""
    out, todo = [], [n]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.fx.Node) and x.op == "call_function" and len(x.users) <= 1 and x not in out:
            out.append(x)
            todo += x.all_input_nodes
    return out


def _scale_step(m: Match, other, divides: bool, at, ctx):
    """Fold `other` (the scores are multiplied or divided by it) into m; a reason when it is no scale."""
    c = scalar_value(other, ctx)
    if c is not None:
        if c <= 0:
            return f"score scale {c} is not positive"
        m.scale *= 1.0 / c if divides else c
        m.absorbed += _consts(other)
        return None
    if isinstance(other, torch.fx.Node) and per_head(other, at) and not dtype_reason(other):
        m.head_scale.append((other, divides))
        m.frames.append((at, False))
        return None
    what = list(shape_of(other)) if isinstance(other, torch.fx.Node) else other
    how = "divided" if divides else "multiplied"
    return f"the scores are {how} by {what} (not a number, one element or one per head)"


def _fill_step(s, t, m: Match, phase, ctx):
    """A masked_fill / where on the scores: returns the scores it reads, or a reason."""
    if t in FILLS:
        chain, cond, fill, keep = arg(s, "self"), arg(s, "mask"), fill_value(arg(s, "value"), ctx), False
    else:
        cond, a, b = arg(s, "condition"), arg(s, "self"), arg(s, "other")
        fa, fb = fill_value(a, ctx), fill_value(b, ctx)
        if fb is not None and fa is None and isinstance(a, torch.fx.Node):
            chain, fill, keep = a, fb, True
        elif fa is not None and fb is None and isinstance(b, torch.fx.Node):
            chain, fill, keep = b, fa, False
        else:
            return "torch.where on the scores without a constant fill value"
    if not masks_out(fill):
        return f"masked positions get {fill}, not -inf or a very negative value (<= -1e4)"
    if phase == CAP:
        return "a mask is applied before the soft-cap (tanh would undo it)"
    if phase == SCALE and m.head_scale:
        return "a tensor scale of unknown sign is applied after the mask"
    if dtype_of(cond) is not torch.bool:
        return f"the mask condition has dtype {dtype_of(cond)}, not bool"
    if causal_keep(cond, keep, ctx, s, m.absorbed) or computed_causal(cond, keep, s, m.absorbed):
        m.causal = True
    else:
        m.masks.append(("keep" if keep else "drop", cond, s))
        m.frames.append((s, True))
    fill_node = arg(s, "value") if t in FILLS else (b if keep else a)
    if isinstance(fill_node, torch.fx.Node):
        m.absorbed += _consts(fill_node)
    return chain


# --- the rule --------------------------------------------------------------------------------

def _dims(n) -> list[str]:
    return [str(d) for d in shape_of(n)]


def _k_dims(m: Match) -> list[str]:
    d = _dims(m.k)
    return d[:-2] + [d[-1], d[-2]] if m.transpose_k else d


def _k_dim(m: Match, i: int):
    """Dim i (-1: head_dim, -2: keys) of K as [.., Sk, D], fixed where the code fixes it."""
    return fixed_dim(m.k, {-1: -2, -2: -1}.get(i, i) if m.transpose_k else i)


def _same(a, b, fa, fb) -> bool:
    """Two dims agree: printed alike, or both fixed to one int."""
    return a == b or (fa is not None and fa == fb)


def _checks(m: Match):
    """The kernel's limits on a matched chain: None, or the reason it cannot run it."""
    for t, nm in ((m.q, "query"), (m.k, "key"), (m.v, "value")):
        r = dtype_reason(t, nm)
        if r:
            return r
    if not (dtype_of(m.q) == dtype_of(m.k) == dtype_of(m.v)):
        return f"query/key/value dtypes differ ({dtype_of(m.q)}, {dtype_of(m.k)}, {dtype_of(m.v)})"
    q, k, v = _dims(m.q), _k_dims(m), _dims(m.v)
    if not (len(q) == len(k) == len(v) and len(q) in (3, 4)):
        return f"attention operands of ranks {len(q)}/{len(k)}/{len(v)} are not all 4-D [batch, heads, seq, " \
               "head_dim] or all 3-D [batch*heads, seq, head_dim]"
    d, dv = fixed_dim(m.q, -1), fixed_dim(m.v, -1)
    if d not in HEAD_DIMS or dv != d:
        return f"head_dim={q[-1]} (value {v[-1]}) is outside {HEAD_DIMS.start}..{HEAD_DIMS.stop - 1} or differs"
    if _k_dim(m, -1) != d or not _same(k[-2], v[-2], _k_dim(m, -2), fixed_dim(m.v, -2)):
        return f"key {k} and query {q} / value {v} shapes disagree"
    if not m.same_batch and (q[0] != k[0] or k[0] != v[0]):
        return f"batch sizes differ: query {q[0]}, key {k[0]}, value {v[0]} (broadcast batch)"
    if len(q) == 4:
        h, hkv = fixed_dim(m.q, 1), fixed_dim(m.v, 1)
        if h is None or hkv is None or h % hkv or not _same(k[1], v[1], _k_dim(m, -3), hkv):
            return f"head counts {q[1]} / {k[1]} / {v[1]} are not a multiple of each other"
    if any(len(shape_of(x)) > 4 for _, x, _ in m.masks):
        return "mask has more than 4 dims"
    return None


def handwritten_supported(node, ctx):
    """The Match, or the reason the chain stays: the report shows it on the chain's products and
    softmax, whatever runs them."""
    m = match(node, ctx)
    if m is False:
        return NO_MATCH
    reason = m if isinstance(m, str) else ctx.denied(m.absorbed) or _checks(m)
    if reason:
        sm, qk = chain_of(node)
        return Reason(reason, also=(qk, sm), prefix=PREFIX)
    return m


def _split(ctx, m: Match, mask, frame, at):
    """A mask given in the [B*H, Sq, Sk] product's frame, made to broadcast on its [B, H, ..] split."""
    if not m.heads or len(_dims(frame)) != 3 or len(shape_of(mask)) < 3 or str(shape_of(mask)[-3]) == "1":
        return mask
    return ctx.insert(aten.unflatten.int, mask, -3, [-1, m.heads], before=at)


def _mask(ctx, m: Match, at):
    """The matched masks as the one mask the kernel takes (None, additive float or bool keep-mask)."""
    adds = [_split(ctx, m, n, f, at) for kind, n, f in reversed(m.masks) if kind == "add"]
    keeps = [_split(ctx, m, n if kind == "keep" else ctx.insert(aten.logical_not.default, n, before=at), f, at)
             for kind, n, f in reversed(m.masks) if kind != "add"]
    add = keep = None
    for n in adds:  # several additive masks add up to one (broadcast as eager does)
        add = n if add is None else ctx.insert(aten.add.Tensor, add, n, before=at)
    for n in keeps:
        keep = n if keep is None else ctx.insert(aten.logical_and.default, keep, n, before=at)
    if add is not None and keep is not None:
        return ctx.insert(aten.where.ScalarOther, keep, add, float("-inf"), before=at)
    return ctx.cast_in(add, at) if add is not None else keep


def _head_scale(ctx, m: Match, at):
    hs = None
    for n, divides in m.head_scale:
        if divides:
            n = ctx.insert(aten.reciprocal.default, n, before=at)
        hs = n if hs is None else ctx.insert(aten.mul.Tensor, hs, n, before=at)
    return hs


@rule(Stage.PATTERN, *MATMULS, aten.einsum.default, family="attention", supported=handwritten_supported,
      name="attention_handwritten", doc="q @ kᵀ · scale (soft-cap, + mask | masked_fill | where) -> softmax -> @ v")
def lower_handwritten(node, ctx, m):
    q, k, v = m.q, m.k, m.v
    if m.transpose_k:
        k = ctx.insert(aten.transpose.int, k, -2, -1, before=node)
    rank3 = len(shape_of(q)) == 3
    if rank3 and m.heads:  # [B*H, S, D] whose scores were viewed per head: [B, H, S, D]
        q, k, v = (ctx.insert(aten.unflatten.int, x, 0, [-1, m.heads], before=node) for x in (q, k, v))
    elif rank3:  # [B*H, S, D] (nn.MultiheadAttention's bmm) as one batch of B*H heads
        q, k, v = (ctx.insert(aten.unsqueeze.default, x, 0, before=node) for x in (q, k, v))
    args = (ctx.cast_in(q, node), ctx.cast_in(k, node), ctx.cast_in(v, node), _mask(ctx, m, node), m.causal,
            float(m.scale))
    hs = _head_scale(ctx, m, node)
    if m.softcap is not None or hs is not None or m.sinks is not None:
        args += (None if m.softcap is None else float(m.softcap), hs)
    if m.sinks is not None:
        args += (None, None, m.sinks)  # out_order, q_pos, sinks
    new = ctx.emit("attention", args, lowering="attention_handwritten", sources=m.absorbed, anchor=node, before=node)
    out = new
    if rank3:
        out = ctx.insert(aten.flatten.using_ints, new, 0, 1, before=node) if m.heads else \
            ctx.insert(aten.squeeze.dim, new, 0, before=node)
    node.replace_all_uses_with(ctx.cast(out, dtype_of(node), node))
    ctx.erase_unused(m.absorbed)
    return new


@rule(Stage.PATTERN, *MATMULS, aten.einsum.default, family="attention", name="attention_unread",
      supported=lambda node, ctx: unread_chain(node, chain_of(node) is not None),
      doc="an attention chain the matcher cannot read: its reason on the report (attention_unread.py)")
def lower_unread(node, ctx, m):  # never applied: the check returns NO_MATCH or a reason
    return node
