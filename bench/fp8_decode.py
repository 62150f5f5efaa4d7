"""Bytes per decode token of Llama-3-8B under precision="fp8" against bf16: `python -m bench.fp8_decode`.

MODEL rows (arithmetic on the published Llama-3-8B shapes, no GPU): the weight bytes one decode token
reads (every linear of 32 layers once; the LM head kept bf16 by fp8_mode's rule; embedding rows and
the KV cache excluded), and the activation bytes around the per-token quantizations of one layer
(what the norm / elementwise producer writes and the quantize reads and writes) before and after the
producers write fp8 themselves (translator/lowerings/norm_fp8.py, quantize_fold.py), and the MLP's
intermediate with gate and up as two fp8 GEMMs or as one fp8 gated GEMM (translator/lowerings/gated_fp8.py).

With `--flysim` (slower, ~1 min): the same activation traffic MEASURED by flysim's counters (global
bytes read + written) for one decode token (M = 1) of the Llama-3-8B norm (N = 4096) and the
silu(gate) * up product (K = 14336), the unfused pair of kernels against the fused one, on gfx942.
Launch counts per layer come from the recorded launches of tests/e2e/test_fp8_precision.py (the
tiny llama_block).

With `--accuracy` (~1 min): the accuracy report (translator.api.fp8_report) of models/llama_block
translated with precision="fp8" on flysim (gfx942) against its fp32 eager run, and its launches.
"""

from __future__ import annotations

import argparse

import torch

# Llama-3-8B (config.json of meta-llama/Meta-Llama-3-8B)
LAYERS, HIDDEN, INTER, HEADS, KV_HEADS, VOCAB = 32, 4096, 14336, 32, 8, 128256
HEAD_DIM = HIDDEN // HEADS
GB = 1e9


def linears():
    """(name, N, K) of one decoder layer's linears."""
    kv = KV_HEADS * HEAD_DIM
    return [("q", HIDDEN, HIDDEN), ("k", kv, HIDDEN), ("v", kv, HIDDEN), ("o", HIDDEN, HIDDEN),
            ("gate", INTER, HIDDEN), ("up", INTER, HIDDEN), ("down", HIDDEN, INTER)]


def weight_bytes(precision: str) -> dict:
    """MODEL weight bytes per decode token: {part: bytes}."""
    params = LAYERS * sum(n * k for _, n, k in linears())
    head = VOCAB * HIDDEN * 2  # kept bf16 under fp8 (the LM head rule)
    if precision == "bf16":
        return {"linears": params * 2, "lm_head": head}
    scales = LAYERS * sum(n for _, n, _ in linears()) * 4  # fp32 per output channel
    return {"linears": params * 1, "scales": scales, "lm_head": head}


def activation_bytes(fused: bool) -> dict:
    """MODEL activation bytes of one layer's fp8 inputs for one token (bf16 activations, fp32 scales).
    Unfused: the producer writes y (2 B/value), the quantize reads y and writes q (1 B) + s (4 B).
    Fused: the producer writes q + s. The attention output's quantize stays a kernel of its own."""
    out = {}
    for name, k in (("input norm -> q/k/v", HIDDEN), ("post-attn norm -> gate/up", HIDDEN),
                    ("silu(gate)*up -> down", INTER), ("attention out -> o", HIDDEN)):
        standalone = not fused or name.startswith("attention")
        out[name] = (2 * k + 2 * k + k + 4) if standalone else (k + 4)
    return out


def mlp_bytes(gated: bool) -> tuple[int, int]:
    """MODEL (launches, activation bytes) of one token between the MLP's fp8 input and down_proj's: gate and up
    as two fp8 GEMMs writing g and u (bf16), silu(g) * u inside down's quantize kernel (reads g, u, writes q + s);
    or the fp8 gated GEMM (gated_fp8.py) writing h = silu(g) * u, down's quantize reading h and writing q + s."""
    k = INTER
    return (2, 2 * k + 2 * k + k + 4) if gated else (3, 2 * (2 * k) + 2 * (2 * k) + k + 4)


def _flysim_bytes():
    import flysim

    from translator_kernels.codegen.elementwise import fused_elementwise
    from translator_kernels.gemm.quantize import quantize_program, quantize_rows
    from translator_kernels.rows import norm

    silu_mul = ('{"n":2,"ops":[["cast",[0],["f32"]],["silu",[2],[]],["cast",[1],["f32"]],["mul",[3,4],[]],'
                '["cast",[5],["bf16"]]],"out":[[6,"bf16"]]}')
    g = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(1, HIDDEN, generator=g).to(torch.bfloat16) for _ in range(3))
    a, b = (torch.randn(1, INTER, generator=g).to(torch.bfloat16) for _ in range(2))
    w = w.reshape(-1)
    cases = {
        "add + RMSNorm -> fp8 (N=4096)": (lambda: quantize_rows(norm.add_rms_norm(x, r, w, 1e-5)[1]),
                                          lambda: norm.add_norm_fp8(x, r, "rms", w, None, 1e-5)),
        "silu(gate)*up -> fp8 (K=14336)": (lambda: quantize_rows(fused_elementwise([a, b], silu_mul)[0]),
                                           lambda: quantize_program([a, b], silu_mul)),
    }
    rows = []
    for name, (unfused, fused) in cases.items():
        got = []
        for fn in (unfused, fused):
            with flysim.simulate(arch="gfx942") as sim:
                fn()
            got.append((len(sim.launches), sum(x.counters["global_bytes_read"] + x.counters["global_bytes_written"]
                                               for x in sim.launches)))
        rows.append((name, *got[0], *got[1]))
    return rows


def _accuracy():
    import collections
    import importlib.util
    from pathlib import Path

    from translator import translate
    from translator.api import fp8_report

    spec = importlib.util.spec_from_file_location("llama_block", Path(__file__).resolve().parents[1] / "models"
                                                  / "llama_block.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model, inputs = mod.Model(*mod.get_init_inputs()).eval(), tuple(mod.get_inputs())
    tm = translate(model, inputs, arch="gfx942", backend="flysim", precision="fp8", verify=False)
    rep = fp8_report(model, tm, inputs)
    tm(*inputs)
    fams = collections.Counter(c.family for c in tm.last_calls for _ in c.launches)
    return rep, len(tm.last_launches), dict(sorted(fams.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flysim", action="store_true", help="also measure the activation traffic under flysim")
    ap.add_argument("--accuracy", action="store_true", help="also print llama_block's fp8 accuracy report")
    args = ap.parse_args(argv)

    bf, f8 = weight_bytes("bf16"), weight_bytes("fp8")
    print("## Llama-3-8B, bytes per decode token (MODEL: weights one token reads; KV cache excluded)\n")
    print("| precision | linears GB | scales GB | LM head GB | total GB | vs bf16 |")
    print("|---|---|---|---|---|---|")
    for name, d in (("bf16", bf), ('fp8 (precision="fp8")', f8)):
        tot = sum(d.values())
        print(f"| {name} | {d['linears'] / GB:.2f} | {d.get('scales', 0) / GB:.4f} | {d['lm_head'] / GB:.2f} | "
              f"{tot / GB:.2f} | {tot / sum(bf.values()):.2f}x |")
    print("\n## per-token fp8 inputs of one layer, activation bytes per token (MODEL: the bytes of y, q and s; "
          "the producer's own inputs and outputs are the same either way)\n")
    print("| GEMM input | before: producer + quantize kernel | after: producer writes fp8 |")
    print("|---|---|---|")
    before, after = activation_bytes(False), activation_bytes(True)
    for k in before:
        print(f"| {k} | {before[k]} | {after[k]} |")
    print(f"| per layer | {sum(before.values())} | {sum(after.values())} |")
    print(f"| x {LAYERS} layers (MB) | {LAYERS * sum(before.values()) / 1e6:.2f} | "
          f"{LAYERS * sum(after.values()) / 1e6:.2f} |")
    print("\n## the MLP between gate/up and down's fp8 input, one token and layer (MODEL: launches, bytes of g, u, "
          "h, q and s)\n")
    print("| gate / up as | launches | activation bytes |")
    print("|---|---|---|")
    for name, gated in (("two fp8 GEMMs + silu*up in down's quantize", False), ("one fp8 gated GEMM + down's quantize",
                                                                                 True)):
        launches, nbytes = mlp_bytes(gated)
        print(f"| {name} | {launches} | {nbytes} |")
    if args.flysim:
        print("\n## the same, MEASURED by flysim (gfx942, M = 1 token, global bytes read + written)\n")
        print("| producer -> fp8 | unfused launches | unfused bytes | fused launches | fused bytes |")
        print("|---|---|---|---|---|")
        for name, l0, b0, l1, b1 in _flysim_bytes():
            print(f"| {name} | {l0} | {b0} | {l1} | {b1} |")
    if args.accuracy:
        rep, launches, fams = _accuracy()
        print('\n## models/llama_block, precision="fp8" against fp32 eager (flysim gfx942, MEASURED)\n')
        print(rep.table())
        print(f"\n{rep.message}\nlaunches: {launches} ({fams})")


if __name__ == "__main__":
    main()
