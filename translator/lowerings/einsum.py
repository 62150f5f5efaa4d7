"""Any einsum -> transposes and reshapes around `flydsl.gemm` / `flydsl.bmm`.

Forms and where they appear:
- ``torch.einsum("bhqd,bhkd->bhqk", q, k)`` / ``("bhqk,bhkd->bhqd", p, v)`` — attention
  written with einsum (Perceiver, lucidrains' x-transformers, many research repos).
- ``torch.einsum("bnd,de->bne", x, self.W)`` / ``("...d,ed->...e")`` / ``("bijl,lk->bijk")``
  — projections (Mamba, MLP-Mixer, KernelBench L1/11): a gemm with a translate-time
  preshuffled weight when the other operand is a parameter.
- ``("bhzc,bchpn->bzhpn")`` — one contracted letter, several free letters (Mamba-2's chunk
  state passing, KernelBench L3/48-49): the free letters of each side are flattened into one.
- ``("bclhn,bcshn,bhcls,bcshp->bclhp")`` — three or more operands (Mamba-2's SSD): contracted
  pairwise in the order opt_einsum's path search chooses (`opt_einsum.contract_path`,
  "auto" strategy), each pair then lowered as below.

A pair ``A, B -> out``: every letter is a batch letter (in A, B and out), a free letter of
one operand (M or N), a contracted letter (in A and B, not out: K), or summed out of one
operand alone (summed there first, by `aten.sum`). A is permuted to [batch, M..., K...] and
each group flattened, B to [batch, K..., N...]; one `flydsl.bmm` (or `flydsl.gemm` against a
parameter operand) multiplies them, and the [batch, M, N] result is unflattened and permuted
to `out`. A pair with no contracted letter is a broadcast product (`aten.mul`, which the
elementwise fusion takes). Declined, with the reason: a letter repeated within one operand
(a diagonal / trace), batch dims that broadcast (size 1 against n), and dtypes the kernels do
not take.
"""

from __future__ import annotations

import functools
import math

import torch

from ..graph import aten, arg, dtype_of, dtype_reason, static_int
from ..registry import Match, Stage, rule
from . import gemm  # noqa: F401,E402  (registers the bmm / gemm families these rules target)


def _expand_ellipsis(eq: str, ranks) -> tuple[list[str], str] | str:
    eq = eq.replace(" ", "")
    if "->" not in eq:
        return "implicit output (no '->'): write the output letters explicitly"
    lhs, out = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != len(ranks):
        return "equation does not match the number of operands"
    if "." in eq:
        extra = max((r - (len(s) - 3) for s, r in zip(ops, ranks) if "..." in s), default=0)
        letters = "".join(chr(0x3B1 + i) for i in range(extra))  # stand-ins for the ellipsis dims
        fill = lambda s, r: s.replace("...", letters[extra - (r - (len(s) - 3)):]) if "..." in s else s  # noqa: E731
        ops = [fill(s, r) for s, r in zip(ops, ranks)]
        out = out.replace("...", letters)
    for s, r in zip(ops, ranks):
        if len(s) != r:
            return f"operand '{s}' does not match its rank {r}"
        if len(set(s)) != len(s):
            return f"a letter repeats within operand '{s}' (a diagonal / trace)"
    return ops, out


def _operands(node):
    eq, operands = arg(node, "equation"), arg(node, "tensors")
    return eq, list(operands)


def einsum_supported(node, ctx):
    eq, operands = _operands(node)
    if len(operands) < 2 or not all(isinstance(o, torch.fx.Node) for o in operands):
        return "einsum of a single operand (a transpose or a sum) or with non-tensor operands"
    for i, o in enumerate(operands):
        r = dtype_reason(o, f"operand {i}")
        if r:
            return r
    if len({dtype_of(o) for o in operands}) > 1:
        return "operand dtypes differ"
    shapes = [tuple(o.meta["val"].shape) for o in operands]
    p = _expand_ellipsis(eq, [len(s) for s in shapes])
    if isinstance(p, str):
        return p
    ops, out = p
    sizes: dict = {}
    for s, shp in zip(ops, shapes):
        for c, d in zip(s, shp):
            if c in sizes and not _same(sizes[c], d):
                return f"letter {c!r} has sizes {sizes[c]} and {d} (broadcasting einsum dims stays in PyTorch)"
            sizes.setdefault(c, d)
    if any(c not in sizes for c in out):
        return "an output letter appears in no operand"
    return Match(operands=operands, ops=ops, out=out)


def _same(a, b) -> bool:
    sa, sb = static_int(a), static_int(b)
    if sa is not None and sb is not None:
        return sa == sb
    return a is b or str(a) == str(b)


@rule(Stage.CANONICAL, aten.einsum.default, family="bmm", supported=einsum_supported,
      doc="einsum: pairwise (opt_einsum path) bmm / gemm with transposes and reshapes")
def lower_einsum(node, ctx, m):
    operands, ops, out = m.operands, m.ops, m.out
    if len(ops) == 2:
        res = _pair(ctx, node, operands[0], ops[0], operands[1], ops[1], out)
    else:
        res = _chain(ctx, node, operands, ops, out)
    node.replace_all_uses_with(res)
    ctx.gm.graph.erase_node(node)
    return res


def _chain(ctx, node, operands, ops, out):
    """Three or more operands: pairwise, in opt_einsum's order; the last pair writes `out`."""
    import opt_einsum

    shapes = [tuple(_hint(d) for d in o.meta["val"].shape) for o in operands]
    eq = ",".join(ops) + "->" + out
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="auto")
    live = list(zip(operands, ops))
    for inds, _idx, sub_eq, _rest, _blas in info.contraction_list:
        picked = [live.pop(i) for i in inds]  # opt_einsum lists the positions to pop, in order
        lhs, res_letters = sub_eq.split("->")
        a_letters, b_letters = lhs.split(",")
        (a, _), (b, _) = picked
        live.append((_pair(ctx, node, a, a_letters, b, b_letters, res_letters), res_letters))
    (res, letters), = live
    return _permute(ctx, res, [letters.index(c) for c in out], node)


def _hint(d) -> int:
    s = static_int(d)
    return s if s is not None else int(d.node.hint) if isinstance(d, torch.SymInt) else int(d)


def _pair(ctx, before, A, a: str, B, b: str, out: str):
    """A (letters a) x B (letters b) -> a node with letters `out`, inserted before `before`."""
    A, a = _sum_private(ctx, A, a, b, out, before)
    B, b = _sum_private(ctx, B, b, a, out, before)
    if ctx.constant(A) is not None and ctx.constant(B) is None:
        A, a, B, b = B, b, A, a  # the parameter goes to the right: a gemm weight
    batch = [c for c in a if c in b and c in out]
    k = [c for c in a if c in b and c not in out]
    m = [c for c in a if c not in b]
    n = [c for c in b if c not in a]
    if not k:  # no contraction: a broadcast product
        return _mul(ctx, before, A, a, B, b, out)
    wb = ctx.constant(B)
    if wb is not None and not batch:
        g = _gemm(ctx, before, A, a, wb, b, m, n, k, out)
        if g is not None:
            return g
    a3 = _grouped(ctx, A, a, [batch, m, k], before)
    b3 = _grouped(ctx, B, b, [batch, k, n], before)
    temp = _call(ctx, before, aten.bmm.default, (a3, b3))
    got = _lowered(ctx, before, temp,
                   lambda t: ctx.replace(t, "bmm", "einsum", (ctx.cast_in(a3, t), ctx.cast_in(b3, t)), [t]))
    got = _ungroup(ctx, got, [(batch, A, a), (m, A, a), (n, B, b)], before)
    return _permute(ctx, got, [(batch + m + n).index(c) for c in out], before)


def _to_nk(perm, n_size, wb):
    """The einsum's parameter as W[N, K] (remade when the parameter changes: state.prepared)."""
    return wb.detach().permute(perm).reshape(n_size, -1).contiguous()


def _gemm(ctx, before, A, a, wb, b, m, n, k, out):
    """A (activation) x a parameter with no batch letters: one gemm against the parameter,
    reshaped to W[N, K] and preshuffled at translate time. None when the gemm declines it."""
    from .gemm import _emit_gemm, _gemm_reason

    n_size = math.prod(wb.shape[b.index(c)] for c in n)
    to_nk = functools.partial(_to_nk, [b.index(c) for c in n + k], n_size)
    w = to_nk(wb)
    a2 = _grouped(ctx, A, a, [m, k], before, batch_dim=False)  # [M..., K]: m letters stay leading dims
    if _gemm_reason(a2, w):
        return None
    w_node = ctx.add_constant(w, "einsum_w", before)  # only for the stand-in below; cleanup drops it
    temp = _call(ctx, before, aten.linear.default, (a2, w_node))
    got = _lowered(ctx, before, temp, lambda t: _emit_gemm(t, ctx, a2, w, None, "einsum", [t], w_from=(wb, to_nk)))
    got = _ungroup(ctx, got, [(n, None, None)], before, sizes={c: wb.shape[b.index(c)] for c in n}, start=len(m))
    return _permute(ctx, got, [(m + n).index(c) for c in out], before)


def _lowered(ctx, einsum, temp, emit):
    """Lower the stand-in aten node `temp` with `emit` (the gemm / bmm lowering), attribute the
    FlyDSL node to the einsum, and return the node that carries the value (the op or its cast)."""
    new = emit(temp)
    new.meta["flydsl"]["sources"] = [einsum.meta.get("orig_name", einsum.name)]  # its value is part of the einsum's
    users = list(new.users)
    return users[0] if len(users) == 1 and users[0].target == aten._to_copy.default else new


def _mul(ctx, before, A, a, B, b, out):
    """out[...] = A[...] * B[...]: each permuted to out's order with size-1 dims for its missing letters."""
    def view(x, s):
        mine = [c for c in out if c in s]
        x = _permute(ctx, x, [s.index(c) for c in mine], before)
        for i, c in enumerate(out):
            if c not in s:
                x = _call(ctx, before, aten.unsqueeze.default, (x, i))
        return x
    return _call(ctx, before, aten.mul.Tensor, (view(A, a), view(B, b)))


def _sum_private(ctx, x, s, other, out, before):
    """Letters of one operand that appear nowhere else are summed out first."""
    private = [i for i, c in enumerate(s) if c not in other and c not in out]
    if not private:
        return x, s
    x = _call(ctx, before, aten.sum.dim_IntList, (x, private))
    return x, "".join(c for c in s if c not in [s[i] for i in private])


def _grouped(ctx, x, s, groups, before, batch_dim=True):
    """Permute x (letters s) to the concatenated groups and flatten each group into one dim
    (an empty group becomes a size-1 dim). batch_dim=False keeps the first group's dims as they are."""
    order = [c for g in groups for c in g]
    x = _permute(ctx, x, [s.index(c) for c in order], before)
    dim = 0
    for gi, g in enumerate(groups):
        if gi == 0 and not batch_dim:
            dim += len(g)
            continue
        if not g:
            x = _call(ctx, before, aten.unsqueeze.default, (x, dim))
        elif len(g) > 1:
            x = _call(ctx, before, aten.flatten.using_ints, (x, dim, dim + len(g) - 1))
        dim += 1
    return x


def _ungroup(ctx, x, groups, before, sizes=None, start=0):
    """Undo _grouped on the result: each (letters, operand, operand letters) group's single dim is
    unflattened into its letters' sizes (an empty group's size-1 dim is squeezed)."""
    dim = start
    for letters, src, src_letters in groups:
        if not letters:
            x = _call(ctx, before, aten.squeeze.dim, (x, dim))
            continue
        if len(letters) > 1:
            dims = [sizes[c] if sizes else _size(ctx, src, src_letters.index(c), before) for c in letters]
            x = _call(ctx, before, aten.unflatten.int, (x, dim, dims))
        dim += len(letters)
    return x


def _size(ctx, x, d, before):
    s = static_int(x.meta["val"].shape[d])
    return s if s is not None else _call(ctx, before, aten.sym_size.int, (x, d))


def _permute(ctx, x, order, before):
    if order == list(range(len(order))):
        return x
    return _call(ctx, before, aten.permute.default, (x, order))


def _call(ctx, before, target, args):
    with ctx.gm.graph.inserting_before(before):
        n = ctx.gm.graph.call_function(target, args)
    return ctx.infer(n)

