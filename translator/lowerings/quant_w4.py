"""Weight-only group-wise int4 linears -> `flydsl.gemm_w4` (translator_kernels.gemm.w4: the codes packed 8 per
32-bit word, dequantized q * s + b per group of 32 / 64 / 128 along K in the GEMM's load path).

Forms matched (where they appear):
- gpt-fast's int4 linear on the CPU: ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, w_int4pack, groupsize,
  scales_and_zeros)`` with the packed weight and ``scales_and_zeros`` [K / G, N, 2] buffers (W = (q - 8) * scale +
  zero). The packed layout is torch's: the codes are read back at translate time by running that op on an
  identity (scale 1, zero 8), whatever the layout (PATTERN ``int4pack_mm``).
- the hand-written unpack (GPTQ / AWQ / HQQ-style modules): ``F.linear(x, ((q - z) * s).reshape(N, K).to(x.dtype))``
  (either operand order of the product) where q, z and s are computed from buffers alone, e.g. q from nibbles
  ``torch.stack([p & 0xF, p >> 4], -1).reshape(N, K)``, z and s per (row, group) broadcast over the group
  (``[N, K / G, 1]`` against q viewed ``[N, K / G, G]``, or ``repeat_interleave``). q, z and s are evaluated at
  translate time from those buffers (and again when a buffer changes); the group G is the largest of 128 / 64 / 32
  over which both z and s are constant; q must hold codes 0..15 (or -8..7) (PATTERN ``w4_linear``).

Eager rounds W to x's dtype before the matmul (the hand-written form) or keeps it in fp32 (int4pack); the kernel
rounds q * s + b once to x's dtype. Stays in PyTorch, with the reason: an fp32 activation, a group that is not
32 / 64 / 128, codes outside 0..15, scales or zeros that change within a group.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch.fx import Node

from translator_kernels.gemm.w4 import GROUPS, pack_weight_w4, ref_gemm_w4, unpack_weight_w4

from ..graph import CASTS, aten, arg, dtype_of, shape_of
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch


@torch.library.custom_op("flydsl::gemm_w4", mutates_args=())
def gemm_w4(a: torch.Tensor, w: torch.Tensor, n: int, k: int, group: int, s: torch.Tensor, b: torch.Tensor,
            bias: Optional[torch.Tensor]) -> torch.Tensor:
    return dispatch("gemm_w4", a, w, n, k, group, s, b, bias)


@gemm_w4.register_fake
def _(a, w, n, k, group, s, b, bias):
    return a.new_empty((*a.shape[:-1], n))


def ref_gemm_w4_op(a, w, n, k, group, s, b, bias):
    return ref_gemm_w4(a, unpack_weight_w4(w, n, k), s, b, group, bias)


def kernel_gemm_w4(a, w, n, k, group, s, b, bias):
    from translator_kernels.gemm.w4 import gemm_w4 as run

    return run(a, w, n, k, group, s, b, bias=bias)


def _sample(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (24, 128), generator=g)
    return (torch.randn(5, 128, generator=g).to(torch.bfloat16), pack_weight_w4(q), 24, 128, 64,
            torch.rand(2, 24, generator=g) / 50, torch.randn(2, 24, generator=g) / 20, None)


register_family(OpFamily(
    name="gemm_w4", description="C = A @ W.T + bias, W = q * s + b per group of K (int4 codes, dequantized in the load path)",
    reference=ref_gemm_w4_op, kernel=kernel_gemm_w4, kernel_entry="translator_kernels.gemm.w4:gemm_w4",
    sample_inputs=_sample,
    tolerance_overrides={torch.float32: (2e-2, 2e-2, "bf16 / fp16 activations only: its output is bf16 in any model")},
))


def _x_reason(x, w_dtype=None) -> str | None:
    dt = dtype_of(x)
    if dt not in (torch.bfloat16, torch.float16):
        return f"int4 weights: the activation is {dt}; the int4 GEMM takes bf16 / fp16 (cast the model)"
    if w_dtype is not None and w_dtype != dt:
        return f"int4 weights: the dequantized weight is {w_dtype}, the activation {dt}"
    return None


def _emit(node, ctx, x, n, k, group, prep, sources, bias, lowering, drop):
    parts = [functools.partial(_part, prep, i) for i in range(3)]
    w_node, s_node, b_node = (ctx.add_constant(p(*sources), h, node, derive=p, sources=sources)
                              for p, h in zip(parts, ("w4", "w4scale", "w4zero")))
    return ctx.replace(node, "gemm_w4", lowering, (x, w_node, n, k, group, s_node, b_node, bias), drop)


def _part(prep, i, *tensors):
    return prep(*tensors)[i]


# ---- gpt-fast: aten._weight_int4pack_mm_for_cpu --------------------------------------------------------------
def _int4pack_prep(n, k, group, packed, sz):
    """(packed codes, s, b) from torch's CPU int4pack weight and scales_and_zeros [K / G, N, 2]."""
    one = torch.stack([torch.ones(k // group, n), torch.full((k // group, n), 8.0)], -1).to(sz.dtype)
    eye = torch.eye(k, dtype=torch.bfloat16)
    q = aten._weight_int4pack_mm_for_cpu(eye, packed.detach(), group, one).t().round().to(torch.uint8)
    s = sz[..., 0].detach().float()
    return pack_weight_w4(q), s.contiguous(), (sz[..., 1].detach().float() - 8 * s).contiguous()


def int4pack_supported(node, ctx):
    x, group = arg(node, "self"), arg(node, "qGroupSize")
    packed, sz = ctx.constant(arg(node, "mat2")), ctx.constant(arg(node, "qScaleAndZeros"))
    if packed is None or sz is None:
        return "int4pack: the packed weight or scales_and_zeros is not a buffer (no translate-time unpack)"
    r = _x_reason(x)
    if r:
        return r
    k = shape_of(x)[-1]
    if group not in GROUPS or not isinstance(k, int) or k % group or sz.dim() != 3 or sz.shape[0] != k // group:
        return f"int4pack: group {group} with K={k} (scales_and_zeros {list(sz.shape)}); want a group in {GROUPS}"
    return Match(x=x, packed=packed, sz=sz, n=sz.shape[1], k=k, group=group)


@rule(Stage.CANONICAL, aten._weight_int4pack_mm_for_cpu.default, family="gemm_w4", supported=int4pack_supported,
      doc="gpt-fast's int4 linear: aten._weight_int4pack_mm_for_cpu(x, w_int4pack, G, scales_and_zeros)")
def lower_int4pack_mm(node, ctx, m):
    prep = functools.partial(_int4pack_prep, m.n, m.k, m.group)
    return _emit(node, ctx, m.x, m.n, m.k, m.group, prep, (m.packed, m.sz), None, "int4pack_mm", [node])


# ---- the hand-written unpack: F.linear(x, ((q - z) * s).reshape(N, K).to(x.dtype)) ----------------------------
_PURE = {aten.__and__.Scalar, aten.bitwise_and.Scalar, aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor_Scalar,
         aten.__lshift__.Scalar, aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.stack.default, aten.cat.default,
         aten.reshape.default, aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default, aten.squeeze.dim,
         aten.permute.default, aten.transpose.int, aten.t.default, aten.flatten.using_ints, aten.unflatten.int,
         aten.select.int, aten.slice.Tensor, aten.expand.default, aten.repeat_interleave.self_int, aten.clone.default,
         aten.contiguous.default, aten.detach.default, aten.lift_fresh_copy.default, aten.alias.default,
         aten.sub.Tensor, aten.add.Tensor, aten.neg.default, *CASTS}
_SHAPES = {aten.reshape.default, aten.view.default, aten._unsafe_view.default, aten.flatten.using_ints}


class _Consts:
    """The nodes of a subgraph computed from buffers alone, in order; `run(*leaves)` evaluates them again."""

    def __init__(self, ctx):
        self.ctx, self.order, self.leaves = ctx, [], []

    def add(self, n, depth=24) -> bool:
        if not isinstance(n, Node):
            return True
        if n in self.order or n in self.leaves:
            return True
        if n.op == "get_attr":
            if self.ctx.constant(n) is None:
                return False
            self.leaves.append(n)
            return True
        if depth == 0 or n.op != "call_function" or n.target not in _PURE:
            return False
        ins = [a for a in (*n.args, *n.kwargs.values()) for a in (a if isinstance(a, (list, tuple)) else [a])]
        if not all(self.add(a, depth - 1) for a in ins):
            return False
        self.order.append(n)
        return True

    def run(self, outs, *leaves):
        env = dict(zip(self.leaves, leaves))
        for n in self.order:
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
            env[n] = n.target(*args, **{kk: v for kk, v in kwargs.items() if kk != "device"})
        return [env[o] if isinstance(o, Node) else o for o in outs]


def _strip(n, targets):
    chain = []
    while isinstance(n, Node) and n.op == "call_function" and n.target in targets and len(n.users) == 1:
        chain.append(n)
        n = arg(n, "self")
    return n, chain


def _w4_prep(consts, qn, zn, sn, prod_shape, n, k, *leaves):
    """(packed codes, s [K / G, N], b [K / G, N], G) of W = (q - z) * s, or a reason string."""
    q, z, s = (torch.as_tensor(v).detach().float() for v in consts.run([qn, zn, sn], *leaves))
    try:
        q, z, s = (torch.broadcast_to(v, prod_shape).reshape(n, k) for v in (q, z, s))
    except RuntimeError:
        return f"int4: q, z and s do not broadcast to the product's shape {list(prod_shape)}"
    if not torch.equal(q, q.round()) or q.min() < -8 or q.max() > 15:
        return "int4: the codes are not integers in 0..15 (or -8..7)"
    if q.min() < 0:
        q, z = q + 8, z + 8
    for g in sorted(GROUPS, reverse=True):
        if k % g == 0:
            zg, sg = z.view(n, k // g, g), s.view(n, k // g, g)
            if torch.equal(zg, zg[..., :1].expand_as(zg)) and torch.equal(sg, sg[..., :1].expand_as(sg)):
                s1, z1 = sg[..., 0].t().contiguous(), zg[..., 0].t().contiguous()
                return pack_weight_w4(q.to(torch.uint8)), s1, (-z1 * s1).contiguous(), g
    return f"int4: the scales / zeros are not constant over groups of {' / '.join(map(str, GROUPS))} along K={k}"


def w4_linear_supported(node, ctx):
    x, w, bias = arg(node, "input"), arg(node, "weight"), arg(node, "bias")
    if ctx.constant(w) is not None:
        return NO_MATCH
    prod, chain = _strip(w, set(CASTS) | _SHAPES)
    if not (isinstance(prod, Node) and prod.op == "call_function" and prod.target == aten.mul.Tensor
            and len(prod.users) == 1):
        return NO_MATCH
    a, c = arg(prod, "self"), arg(prod, "other")
    sub, s_node = (a, c) if isinstance(a, Node) and a.target == aten.sub.Tensor else (c, a)
    if not (isinstance(sub, Node) and sub.op == "call_function" and sub.target == aten.sub.Tensor):
        return NO_MATCH
    consts = _Consts(ctx)
    qn, zn = arg(sub, "self"), arg(sub, "other")
    if not all(consts.add(v) for v in (qn, zn, s_node)) or not consts.leaves:
        return NO_MATCH
    shp = shape_of(w)
    if len(shp) != 2 or not all(isinstance(d, int) for d in shp):
        return NO_MATCH
    r = _x_reason(x, dtype_of(w))
    if r:
        return r
    n, k = shp
    leaves = tuple(ctx.constant(lf) for lf in consts.leaves)
    prep = functools.partial(_w4_prep, consts, qn, zn, s_node, tuple(shape_of(prod)), n, k)
    got = prep(*leaves)
    if isinstance(got, str):
        return got
    return Match(x=x, bias=bias, n=n, k=k, group=got[3], prep=prep, leaves=leaves, drop=[node, *chain, prod, sub])


@rule(Stage.PATTERN, aten.linear.default, family="gemm_w4", supported=w4_linear_supported,
      doc="F.linear(x, ((q - z) * s).reshape(N, K).to(x.dtype)) with q, z, s from buffers (hand-written int4)")
def lower_w4_linear(node, ctx, m):
    return _emit(node, ctx, m.x, m.n, m.k, m.group, m.prep, m.leaves, m.bias, "w4_linear", m.drop)
