"""The pieces of hand-written attention, one recognizer each (used by attention_patterns.py).

Each function reads one step of the graph between Q·Kᵀ and ·V and answers what it computes
in the kernel's terms, or None when the step is something else:

(The product finders, `product_of` and `find_qk`, are generic forms: translator/lowerings/forms.py.)
- `unexpand_kv`: K / V expanded from Hkv to H heads -> the Hkv-head tensor (the kernel reads
  head h // (H / Hkv), nothing repeated). Forms:
      repeat_kv(x, n) = x[:, :, None].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)  # HF Llama
      x.unsqueeze(2).expand(...).flatten(1, 2)
      x.repeat_interleave(n, dim=1)                                                   # GQA repos
      x.expand(b, h, s, d) with one KV head                                           # MQA
  ``x.repeat(1, n, 1, 1)`` is not undone (it lays heads out as h % Hkv): it stays a copy.
- `scalar_value`: a 0-dim tensor the scale is divided by, folded to a float when it depends
  only on constants (``torch.full([], d ** 0.5)``, ``torch.tensor(d).sqrt()``); a tensor that
  depends on a parameter or an input is passed to the kernel as `head_scale` instead.
- `per_head`: a multiplier that broadcasts over scores [.., H, Sq, Sk] along H only (Swin-V2's
  ``clamp(logit_scale, max=log(100)).exp()`` of shape [H, 1, 1]).
- `softcap_of`: ``tanh(s / c) * c`` (Gemma-2's attention logit soft-capping) -> c.
- `fill_value`: the value masked positions get (masked_fill / where); -inf or a very negative
  finite value (finfo.min, -1e4) counts as masked out.
- `causal_keep`: a boolean condition that is a lower-triangular buffer sliced to [:Sq, :Sk]
  (``bias[:, :, :T, :T]`` as keep-mask, or ``== 0`` / ``~`` of it as masked-out) -> causal.
- `computed_causal` / `causal_bias`: the causal mask computed in forward, at any sequence length:
      j > i, i >= j  with i = arange(Sq)[:, None], j = arange(Sk)[None, :]        # masked_fill / where
      torch.triu(torch.ones(Sq, Sk, dtype=bool), 1)  (tril(...) as keep-mask)    # masked_fill / where
      torch.triu(torch.full((S, S), float("-inf")), 1)   # added (nn.Transformer's square subsequent mask)
  are all "key <= row", the kernel's top-left causal: no mask tensor is built or read.
- `fixed_dim`: a dim's size where export's shape inference leaves an expression the code fixes.
  nn.MultiheadAttention's cross attention views K as ``k.view(Sk, bsz * H, head_dim)`` with
  bsz taken from the query; export keeps the two batch sizes apart, so K's head_dim reads
  ``(8*s70)//s77``, yet the view's literal 8 is the only size it can have at run time.
"""

from __future__ import annotations

import weakref

import torch

from ..graph import ASSERT, aten, arg, is_call, shape_of, static_int

RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
NEG_FILL = -1e4  # a fill at or below this is "masked out" (exp underflows against any real score)


def node_int(a):
    """An int argument's value (a graph node holding a SymInt that is fixed counts)."""
    if isinstance(a, torch.fx.Node):
        return static_int(a.meta.get("val"))
    return a if isinstance(a, int) and not isinstance(a, bool) else None


def full_slice(n) -> bool:
    start = 0 if arg(n, "start") is None else node_int(arg(n, "start"))
    end, step = arg(n, "end"), arg(n, "step")
    return start == 0 and (end is None or (isinstance(end, int) and end >= 2**62)) and step == 1


def _skip_full_slices(n, chain):
    while is_call(n, aten.slice.Tensor) and full_slice(n):
        chain.append(n)
        n = arg(n, "self")
    return n


_SAME_SHAPE = (aten.clone.default, aten.contiguous.default, aten._to_copy.default, aten.to.dtype, aten.alias.default,
               aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.masked_fill.Scalar,
               aten.masked_fill.Tensor, aten.add.Tensor, aten.add_.Tensor, aten.dropout.default, aten.softmax.int,
               aten._softmax.default, aten.type_as.default)


def fixed_dim(n, i: int, depth: int = 12):
    """Dim i of node n as an int: its meta size when fixed, else the literal a view / reshape
    gave it, followed back through transposes, permutes, same-shape ops and (for the last two
    dims) the products' operands; None when no code fixes it."""
    s = shape_of(n)
    if s is None or depth == 0:
        return None
    i %= len(s)
    if static_int(s[i]) is not None:
        return static_int(s[i])
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return None
    if is_call(n, *RESHAPES):
        size = arg(n, "shape" if n.target is aten.reshape.default else "size")
        lit = size[i] if len(size) == len(s) else None
        return lit if isinstance(lit, int) and lit >= 0 else None
    if is_call(n, aten.transpose.int):
        a, b = arg(n, "dim0") % len(s), arg(n, "dim1") % len(s)
        return fixed_dim(arg(n, "self"), b if i == a else a if i == b else i, depth - 1)
    if is_call(n, aten.permute.default):
        return fixed_dim(arg(n, "self"), arg(n, "dims")[i] % len(s), depth - 1)
    if is_call(n, aten.bmm.default, aten.matmul.default) and i >= len(s) - 2:
        right = arg(n, "mat2" if n.target is aten.bmm.default else "other")
        return fixed_dim(arg(n, "self"), -2, depth - 1) if i == len(s) - 2 else fixed_dim(right, -1, depth - 1)
    src = arg(n, "self") if n.target in _SAME_SHAPE else None
    if isinstance(src, torch.fx.Node) and len(shape_of(src) or ()) == len(s) and str(shape_of(src)[i]) == str(s[i]):
        return fixed_dim(src, i, depth - 1)
    return None


def _heads(n):
    s = shape_of(n)
    return static_int(s[1]) if s is not None and len(s) == 4 else None


def unexpand_kv(x, absorbed):
    """The [B, Hkv, S, D] tensor x was expanded from (the expansion nodes x alone read go to
    `absorbed`), else x."""
    chain = [x]
    base = None
    if is_call(x, aten.repeat_interleave.self_int):
        dim = arg(x, "dim")
        if dim is not None and dim % 4 == 1 and len(shape_of(arg(x, "self")) or ()) == 4:
            base = arg(x, "self")
    elif is_call(x, *RESHAPES, aten.flatten.using_ints):
        n = arg(x, "self")
        if is_call(n, aten.clone.default, aten.contiguous.default):
            chain.append(n)
            n = arg(n, "self")
        if is_call(n, aten.expand.default):
            chain.append(n)
            n = _skip_full_slices(arg(n, "self"), chain)
            if is_call(n, aten.unsqueeze.default) and arg(n, "dim") == 2:
                chain.append(n)
                b = _skip_full_slices(arg(n, "self"), chain)
                if len(shape_of(b) or ()) == 4:
                    base = b
    elif is_call(x, aten.expand.default) and _heads(arg(x, "self")) == 1:
        base = arg(x, "self")  # MQA: one KV head broadcast to every query head
    if base is None:
        return x
    h, hkv = _heads(x), _heads(base)
    if h is None or hkv is None or h % hkv or [str(d) for d in shape_of(base)[2:]] != [str(d) for d in shape_of(x)[2:]]:
        return x
    absorbed += [c for c in chain if len([u for u in c.users if u.target is not ASSERT]) <= 1]
    return base


# --- scalars and multipliers ----------------------------------------------------------------

_FOLDABLE = {aten.full.default, aten.scalar_tensor.default, aten.lift_fresh_copy.default, aten.detach.default,
             aten.detach_.default, aten.clone.default, aten._to_copy.default, aten.to.dtype, aten.sqrt.default,
             aten.rsqrt.default, aten.reciprocal.default, aten.exp.default, aten.log.default, aten.mul.Tensor,
             aten.div.Tensor, aten.pow.Tensor_Scalar, aten.neg.default, aten.add.Tensor, aten.sub.Tensor}


def const_tensor(n, ctx, depth: int = 8):
    """The value of a small tensor computed from constants only (never a parameter, which a
    user may still change: those stay tensors), else None."""
    if isinstance(n, (int, float)) and not isinstance(n, bool):
        return n
    if not isinstance(n, torch.fx.Node) or depth == 0:
        return None
    if n.op == "get_attr":
        t = ctx.constant(n)
        if t is None or isinstance(t, torch.nn.Parameter) or t.numel() != 1:
            return None
        return t.detach().clone()
    if n.op != "call_function" or n.target not in _FOLDABLE:
        return None
    args = []
    for a in n.args:
        if isinstance(a, torch.fx.Node):
            a = const_tensor(a, ctx, depth - 1)
            if a is None:
                return None
        args.append(a)
    kwargs = {k: v for k, v in n.kwargs.items() if k != "device"}
    try:
        out = n.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 — not foldable here: the tensor stays as it is
        return None
    return out if isinstance(out, (int, float)) or (isinstance(out, torch.Tensor) and out.numel() == 1) else None


def scalar_value(n, ctx):
    """n as a Python float: a number, or a one-element tensor computed from constants."""
    t = const_tensor(n, ctx)
    if t is None:
        return None
    return float(t) if isinstance(t, (int, float)) else float(t.reshape(()).item())


def per_head(m, scores) -> bool:
    """m broadcasts against scores [.., H, Sq, Sk] along the head dim only (or is one element)."""
    ms, ss = shape_of(m), shape_of(scores)
    if ms is None or ss is None or len(ms) > len(ss) or len(ss) not in (3, 4):
        return False
    pad = [1] * (len(ss) - len(ms)) + [static_int(d) for d in ms]
    want = [1] * len(ss)
    want[-3] = static_int(ss[-3])
    return all(p in (1, w) for p, w in zip(pad, want))


def softcap_of(n):
    """c when n = tanh(x / c) * c (or tanh(x * (1 / c)) * c), with the inner node x, else None."""
    if not is_call(n, aten.mul.Tensor, aten.mul.Scalar):
        return None
    a, c = arg(n, "self"), arg(n, "other")
    if isinstance(a, (int, float)):
        a, c = c, a
    if not (isinstance(c, (int, float)) and c > 0 and is_call(a, aten.tanh.default)):
        return None
    inner = arg(a, "self")
    if not is_call(inner, aten.div.Tensor, aten.div.Scalar, aten.mul.Tensor, aten.mul.Scalar):
        return None
    d = arg(inner, "other")
    if not isinstance(d, (int, float)):
        return None
    if inner.target in (aten.div.Tensor, aten.div.Scalar) and abs(d - c) <= 1e-6 * c:
        return c, a, inner
    if inner.target in (aten.mul.Tensor, aten.mul.Scalar) and abs(d * c - 1) <= 1e-6:
        return c, a, inner
    return None


def fill_value(v, ctx):
    """A masked_fill / where fill as a float, or None."""
    return scalar_value(v, ctx)


def masks_out(fill) -> bool:
    return fill is not None and (fill == float("-inf") or fill <= NEG_FILL)


# --- causal masks ---------------------------------------------------------------------------

_TRIL_SEEN: dict = {}  # id(buffer) -> (weakref to it, its _version, answer)


def is_tril(buf: torch.Tensor) -> bool:
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


def _tril_slice(n, ctx, scores, chain) -> bool:
    """n = tril_buffer[..., :Sq, :Sk] (every slice starts at 0), shaped as the scores' last two dims."""
    top = n
    while is_call(n, aten.slice.Tensor):
        start = 0 if arg(n, "start") is None else node_int(arg(n, "start"))
        if start != 0 or arg(n, "step") != 1:
            return False
        chain.append(n)
        n = arg(n, "self")
    if is_call(n, aten._to_copy.default, aten.to.dtype):  # bias.bool()
        chain.append(n)
        n = arg(n, "self")
    buf = ctx.constant(n)
    if buf is None or buf.dim() < 2 or buf.shape[-1] != buf.shape[-2] or not is_tril(buf):
        return False
    return [str(s) for s in shape_of(top)[-2:]] == [str(s) for s in shape_of(scores)[-2:]]


def causal_keep(cond, keep: bool, ctx, scores, absorbed) -> bool:
    """cond (True = keep when `keep`, else True = masked out) is the nanoGPT / GPT-2 tril buffer."""
    chain = []
    n = cond
    if not keep:
        if is_call(n, aten.eq.Scalar) and arg(n, "other") == 0:
            chain.append(n)
            n = arg(n, "self")
        elif is_call(n, aten.logical_not.default, aten.bitwise_not.default):
            chain.append(n)
            n = arg(n, "self")
        else:
            return False
    elif is_call(n, aten.ne.Scalar) and arg(n, "other") == 0:
        chain.append(n)
        n = arg(n, "self")
    if not _tril_slice(n, ctx, scores, chain):
        return False
    absorbed += [c for c in chain if len(c.users) == 1]
    return True


def _arange_index(n, chain):
    """'row' when n is arange(Sq) (from 0, step 1) shaped [Sq, 1], 'col' when [1, Sk] or [Sk]."""
    shape = shape_of(n)
    if shape is None or len(shape) not in (1, 2):
        return None
    seen = []
    x = _skip_full_slices(n, seen)
    if is_call(x, aten.unsqueeze.default):
        seen.append(x)
        x = _skip_full_slices(arg(x, "self"), seen)
    start = 0 if is_call(x, aten.arange.default) else arg(x, "start") if is_call(x, aten.arange.start) else None
    if start != 0 or len(shape_of(x) or ()) != 1:
        return None
    chain += [*seen, x]
    if len(shape) == 1 or str(shape[0]) == "1":
        return "col"
    return "row" if str(shape[1]) == "1" else None


_MASKED = {aten.gt.Tensor: ("col", "row"), aten.lt.Tensor: ("row", "col")}  # key index > query index
_KEPT = {aten.ge.Tensor: ("row", "col"), aten.le.Tensor: ("col", "row")}  # key index <= query index


def _ones(n) -> bool:
    return is_call(n, aten.ones.default) or (is_call(n, aten.full.default) and arg(n, "fill_value") in (1, True))


def _last2(n, scores) -> bool:
    s = shape_of(n)
    return s is not None and len(s) == 2 and [str(d) for d in s] == [str(d) for d in shape_of(scores)[-2:]]


def computed_causal(cond, keep: bool, scores, absorbed) -> bool:
    """cond (True = keep when `keep`, else True = masked out) is the causal mask built in forward
    from aranges or torch.triu / tril of ones, shaped as the scores' last two dims."""
    if not _last2(cond, scores):
        return False
    chain = [cond]
    if cond.target in (_KEPT if keep else _MASKED):
        a, b = (_arange_index(x, chain) for x in (arg(cond, "self"), arg(cond, "other")))
        ok = (a, b) == (_KEPT if keep else _MASKED)[cond.target]
    else:
        tri, diag = (aten.tril.default, 0) if keep else (aten.triu.default, 1)
        ok = is_call(cond, tri) and (arg(cond, "diagonal") or 0) == diag and _ones(arg(cond, "self"))
        chain += [arg(cond, "self")] if ok else []
    if ok:
        absorbed += chain
    return ok


def causal_bias(mask, scores, absorbed) -> bool:
    """mask = torch.triu(torch.full((Sq, Sk), -inf or a very negative value), diagonal=1), added."""
    if not (_last2(mask, scores) and is_call(mask, aten.triu.default) and arg(mask, "diagonal") == 1):
        return False
    full = arg(mask, "self")
    if not (is_call(full, aten.full.default) and isinstance(arg(full, "fill_value"), (int, float))
            and masks_out(float(arg(full, "fill_value")))):
        return False
    absorbed += [mask, full]
    return True
