"""Ours vs FlyDSL's own kernel: global bytes moved under flysim at the same shape.

    FLYDSL_SRC=/tmp/flydsl-src python -m bench.flydsl_traffic [--arch gfx942]

FlyDSL's kernels come from an extracted copy of its public source (never part of this repo;
FLYDSL_SRC names it). For each case both kernels run under flysim on CPU tensors at a
flysim-countable size; the table gives global bytes read + written, the compulsory bytes
(each input read once, each output written once) and their ratio, and each kernel's output
error against torch. GEMM: both use a 128x128 output tile so the re-read factors compare.
Attention (causal, B1 H1 D128, S=1024 by default, --seq): both kernels take 128 query rows
per workgroup, so both re-read K/V once per query block up to its causal bound.
Without FLYDSL_SRC it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import flysim


def _moved(sim):
    c = sim.launches[-1].counters
    return c["global_bytes_read"] + c["global_bytes_written"]


def gemm_case(arch, m=256, n=512, k=512):
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm
    from tests.utils import shuffle_weight as flydsl_shuffle

    from translator_kernels.gemm import GemmConfig, gemm, register_config, m_bucket
    from translator_kernels.gemm.preshuffle import shuffle_weight

    torch.manual_seed(0)
    a = torch.randn(m, k).to(torch.bfloat16)
    b = torch.randn(n, k).to(torch.bfloat16)
    ref = a.float() @ b.float().T
    compulsory = (m * k + n * k + m * n) * 2
    rows = []
    register_config(m_bucket(m), n, k, torch.bfloat16, arch, GemmConfig(128, 128, 64))
    with flysim.simulate(arch=arch) as sim:
        ours = gemm(a, shuffle_weight(b), n, k)
    rows.append(("gemm bf16", f"{m}x{n}x{k}", "ours", "128x128x64", _moved(sim), compulsory,
                 (ours.float() - ref).abs().max().item()))
    c = torch.empty(m, n, dtype=torch.bfloat16)
    bs = flydsl_shuffle(b, layout=(16, 16)).contiguous().view(-1)
    e = torch.empty(0)
    with flysim.simulate(arch=arch, strict_oob=False) as sim:
        fn = compile_preshuffle_gemm(N=n, K=k, tile_m=128, tile_n=128, tile_k=64, in_dtype="bf16", out_dtype="bf16")
        fn(c.view(-1), a.view(-1), bs, e, e, torch.empty(0, dtype=torch.bfloat16), m, n, None)
    rows.append(("gemm bf16", f"{m}x{n}x{k}", "flydsl", "128x128x64", _moved(sim), compulsory,
                 (c.float() - ref).abs().max().item()))
    return rows


def softmax_case(arch, m=64, n=4096):
    from kernels.norm.softmax_kernel import build_softmax_module

    from translator_kernels.rows.softmax import softmax

    torch.manual_seed(0)
    x = torch.randn(m, n)
    ref = torch.softmax(x, -1)
    compulsory = 2 * m * n * 4
    with flysim.simulate(arch=arch) as sim:
        ours = softmax(x)
    rows = [("softmax f32", f"{m}x{n}", "ours", "-", _moved(sim), compulsory, (ours - ref).abs().max().item())]
    out = torch.empty_like(x)
    with flysim.simulate(arch=arch, check_races=False) as sim:  # FlyDSL's softmax has a real LDS race (docs/flysim.md)
        build_softmax_module(m, n, "f32")(x, out, m)
    rows.append(("softmax f32", f"{m}x{n}", "flydsl", "-", _moved(sim), compulsory, (out - ref).abs().max().item()))
    return rows


def attention_case(arch, s=1024, h=1, d=128):
    """Causal bf16 flash attention, B1: ours (q/k/v [B, H, S, D] views of FlyDSL's [B, S, H, D]
    buffers, read in place) against FlyDSL's generic kernel with its own block_m=128 tile."""
    from kernels.attention.flash_attn_generic import build_flash_attn_func_module

    from translator_kernels.attention import attention, attention_config

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, s, h, d).to(torch.bfloat16) for _ in range(3))
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(t(q).float(), t(k).float(), t(v).float(), is_causal=True)
    compulsory = 4 * s * h * d * 2
    cfg = attention_config("bf16", d, s)
    shape = f"B1 S{s} H{h} D{d} causal"
    with flysim.simulate(arch=arch) as sim:
        ours = attention(t(q), t(k), t(v), causal=True)
    rows = [("attention bf16", shape, "ours", f"{cfg['block_m']}x{cfg['block_n']}", _moved(sim), compulsory,
             (ours.float() - ref).abs().max().item())]
    o = torch.zeros_like(q)
    fn = build_flash_attn_func_module(num_heads=h, head_dim=d, causal=True, dtype_str="bf16", num_kv_heads=h,
                                      cross_seqlen=False, block_m=128, flat_work_group_size=256, path_tag="auto",
                                      waves_per_eu=2, daz=True, return_lse=False)
    with flysim.simulate(arch=arch, strict_oob=False) as sim:
        fn(q, k, v, o, 1, s, lse=None, stream=None)
    rows.append(("attention bf16", shape, "flydsl", "128 rows", _moved(sim), compulsory,
                 (t(o).float() - ref).abs().max().item()))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flydsl_traffic", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="gfx942", choices=["gfx942", "gfx950"])
    p.add_argument("--only", choices=["gemm", "softmax", "attention"], help="one case")
    p.add_argument("--seq", type=int, default=1024, help="attention sequence length")
    a = p.parse_args(argv)
    src = os.environ.get("FLYDSL_SRC")
    if not src or not os.path.isdir(os.path.join(src, "kernels")):
        print("FLYDSL_SRC is not set to a FlyDSL source checkout: nothing to compare (exit 0)")
        return 0
    sys.path.insert(0, src)
    print(f"## flysim global traffic, ours vs FlyDSL ({a.arch}; measured by flysim on CPU)\n")
    print("| kernel | shape | impl | tile | bytes moved | compulsory | moved / compulsory | max abs err |")
    print("|---|---|---|---|---|---|---|---|")
    cases = {"gemm": gemm_case, "softmax": softmax_case, "attention": lambda arch: attention_case(arch, a.seq)}
    for name, case in cases.items():
        if a.only and name != a.only:
            continue
        for kern, shape, impl, tile, moved, comp, err in case(a.arch):
            print(f"| {kern} | {shape} | {impl} | {tile} | {moved:,} | {comp:,} | {moved / comp:.3f} | {err:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
