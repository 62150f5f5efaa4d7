"""Top-k gating: router logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int64).

One lane per token, 64 lanes per workgroup, the last workgroup masked. A lane reads its token's E
logits once (E is a compile-time constant: the whole row lives in registers, so E <= 256), scores
them in fp32 and picks the k best by k passes of an arg-max over the row, each pass skipping the
experts already taken; a tie goes to the lower expert id, as torch.topk on the CPU does.

exp is llvm.exp (a hardware sequence; no ocml call, which this toolchain cannot link: device_math's rule).
Scoring: "softmax": p_e = exp(l_e - max) / sum_e exp(l_e - max) (the HF Mixtral / Qwen-MoE / OLMoE
router: softmax in fp32, then topk of the probabilities); "sigmoid": p_e = 1 / (1 + exp(-l_e))
(DeepSeek-V3 style scores). renormalize: the k weights are divided by their sum (Mixtral always,
Qwen-MoE / OLMoE when `norm_topk_prob`).

Group-limited routing (DeepSeek-V3, `n_group` / `topk_group`): the E experts form `groups` equal
groups; a group's score is its best expert's score (its two best summed with `group_score="top2"`,
DeepSeek-V3's choice); only the `topk_group` best groups stay eligible, and the k experts are chosen
among them. The ids are written as int64 (the low word, then a zero high word): what aten.topk
returns, so the graph around the op keeps its dtypes.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from translator_kernels import launch as kl

BLOCK = 64
MAX_EXPERTS = 256
_ELEM = {"f32": fx.Float32, "bf16": fx.BFloat16, "f16": fx.Float16}


def _argmax(vals, allowed):
    """(best value, its index) over the allowed entries, the first one on ties."""
    best, bi = fx.Float32(float("-inf")), fx.Int32(-1)
    for e in range_constexpr(len(vals)):
        better = (vals[e] > best) & allowed[e] if allowed[e] is not True else vals[e] > best
        best = better.select(vals[e], best)
        bi = better.select(fx.Int32(e), bi)
    return best, bi


@kl.builder
def build_topk_gating(e: int, k: int, dt: str, scoring: str, renormalize: bool, groups: int, topk_group: int,
                      group_score: str, arch: str):
    """Launcher `launch(Logits, W, Ids32, t)`: Logits [t, e] of dtype `dt`, W [t, k] fp32, Ids32 the
    [t, k] int64 ids viewed as [t, 2k] int32. arch keys the cache."""
    elem = _ELEM[dt]
    per_group = e // groups

    @flyc.kernel(known_block_size=[BLOCK, 1, 1])
    def topk_gating_kernel(Logits: fx.Tensor, W: fx.Tensor, Ids: fx.Tensor, t: fx.Int32):
        raw = fx.Int32(fx.block_idx.x) * BLOCK + fx.Int32(fx.thread_idx.x)
        live = raw < t
        tok = live.select(raw, 0)
        lp = fx.get_iter(fx.rocdl.make_buffer_tensor(Logits))
        wp = fx.get_iter(fx.rocdl.make_buffer_tensor(W))
        ip = fx.get_iter(fx.rocdl.make_buffer_tensor(Ids))
        logit = [fx.Float32(fx.ptr_load(lp + fx.Int64(tok * e + j), result_type=elem).to(fx.Float32)) if dt != "f32"
                 else fx.Float32(fx.ptr_load(lp + fx.Int64(tok * e + j), result_type=fx.Float32))
                 for j in range_constexpr(e)]
        if const_expr(scoring == "sigmoid"):
            score = [fx.Float32(1.0) / (fx.Float32(1.0) + fx.math.exp(fx.Float32(0.0) - x)) for x in logit]
        else:
            mx = logit[0]
            for j in range_constexpr(1, e):
                mx = fx.arith.maximumf(mx, logit[j])
            ex = [fx.math.exp(x - mx) for x in logit]
            tot = ex[0]
            for j in range_constexpr(1, e):
                tot = tot + ex[j]
            inv = fx.Float32(1.0) / tot
            score = [x * inv for x in ex]
        allowed = [True] * e
        if const_expr(groups > 1):  # group-limited: only the topk_group best groups stay eligible
            gsc = []
            for g in range_constexpr(groups):
                part = score[g * per_group:(g + 1) * per_group]
                b1, i1 = _argmax(part, [True] * per_group)
                if const_expr(group_score == "top2"):
                    b2, _ = _argmax(part, [i1 != j for j in range(per_group)])
                    b1 = b1 + b2
                gsc.append(b1)
            gok = [fx.Boolean(False)] * groups
            for _ in range_constexpr(topk_group):
                _, gi = _argmax(gsc, [~x for x in gok])
                gok = [gok[g] | (gi == g) for g in range(groups)]
            allowed = [gok[j // per_group] for j in range(e)]
        taken = [fx.Boolean(False)] * e
        ws, ids = [], []
        for _ in range_constexpr(k):
            best, bi = _argmax(score, [(~taken[j]) & allowed[j] if allowed[j] is not True else ~taken[j]
                                       for j in range(e)])
            taken = [taken[j] | (bi == j) for j in range(e)]
            ws.append(best)
            ids.append(bi)
        if const_expr(renormalize):
            s = ws[0]
            for j in range_constexpr(1, k):
                s = s + ws[j]
            inv_s = fx.Float32(1.0) / s
            ws = [w * inv_s for w in ws]
        if live:
            for j in range_constexpr(k):
                fx.ptr_store(ws[j], wp + fx.Int64(tok * k + j))
                fx.ptr_store(ids[j], ip + fx.Int64((tok * k + j) * 2))
                fx.ptr_store(fx.Int32(0), ip + fx.Int64((tok * k + j) * 2 + 1))

    @flyc.jit
    def launch(Logits: fx.Tensor, W: fx.Tensor, Ids: fx.Tensor, t: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        topk_gating_kernel(Logits, W, Ids, t).launch(grid=((t + (BLOCK - 1)) // BLOCK, 1, 1), block=(BLOCK, 1, 1),
                                                     stream=stream)

    return launch
