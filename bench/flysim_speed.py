"""flysim speed: wall time and lane-ops/s for FlyDSL's own kernels under flysim.

Cases: softmax, preshuffle GEMM and flash attention (gfx942), and two that use the ops
flysim added last: the RMSNorm backward (llvm.atomicrmw into dweight, gfx942) and the gfx950
a16w16 GEMM (async buffer loads into LDS), plain and in its default half-tile-interleaved
schedule (gemm950hti: the wave groups run a barrier apart, so flysim runs one thread per wave
slot; see docs/flysim.md, Barriers).
FlyDSL's kernels come from an extracted copy of its source tree (never part of
this repo): set FLYDSL_SRC (default /tmp/flydsl-src). Usage:
    python bench/flysim_speed.py [softmax] [gemm] [attn] [rmsnorm_bwd] [gemm950] [gemm950hti] [--device cuda] [--races]
                                 [--threads N]
lane-ops = executed ops x active lanes (every lane of every workgroup). Each case
compiles and runs once, then times a second run; "cpu" is the process CPU time of
that run (on a shared machine wall time also measures the other tenants).
"""

import os
import sys
import time

import torch

import flysim

SRC = os.environ.get("FLYDSL_SRC", "/tmp/flydsl-src")
sys.path.insert(0, SRC)


SCALE = 1  # --scale k: softmax rows x k, GEMM M x k, attention S x k


def softmax(device):
    from kernels.norm.softmax_kernel import build_softmax_module

    M, N = 4096 * SCALE, 4096
    x = torch.randn(M, N, device=device)
    out = torch.empty_like(x)
    fn = build_softmax_module(M, N, "f32")
    return f"softmax {M}x{N} f32", lambda: fn(x, out, M), lambda: (out - torch.softmax(x, 1)).abs().max().item()


def gemm(device):
    from kernels.gemm.preshuffle_gemm import compile_preshuffle_gemm
    from tests.utils import shuffle_weight

    M, N, K = 512 * SCALE, 512, 512
    a = torch.randn(M, K, device=device).to(torch.bfloat16)
    b = torch.randn(N, K, device=device).to(torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16, device=device)
    bs = shuffle_weight(b, layout=(16, 16)).contiguous().view(-1)
    fn = compile_preshuffle_gemm(N=N, K=K, tile_m=64, tile_n=128, tile_k=64, in_dtype="bf16", out_dtype="bf16")
    e = torch.empty(0, device=device)
    run = lambda: fn(c.view(-1), a.view(-1), bs, e, e, torch.empty(0, dtype=torch.bfloat16, device=device), M, N, None)  # noqa: E731
    return f"preshuffle GEMM {M}x{N}x{K} bf16", run, lambda: ((c.float() - a.float() @ b.float().T).abs().max().item())


def attn(device):
    from kernels.attention.flash_attn_generic import build_flash_attn_func_module

    B, S, H, D = 1, 512 * SCALE, 8, 128
    q, k, v = (torch.empty(B, S, H, D, device=device).uniform_(-1, 1).to(torch.bfloat16) for _ in range(3))
    o = torch.zeros_like(q)
    fn = build_flash_attn_func_module(num_heads=H, head_dim=D, causal=True, dtype_str="bf16", num_kv_heads=H,
                                      cross_seqlen=False, block_m=128, flat_work_group_size=256, path_tag="auto",
                                      waves_per_eu=2, daz=True, return_lse=False)

    def err():
        t = lambda x: x.float().transpose(1, 2)  # noqa: E731
        ref = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True).transpose(1, 2)
        return (o.float() - ref).abs().max().item()

    return f"flash attn B{B} H{H} S{S} D{D} causal bf16", lambda: fn(q, k, v, o, B, S, lse=None, stream=None), err


def rmsnorm_bwd(device):
    from kernels.norm.rmsnorm_bwd_kernel import build_rmsnorm_bwd_module

    M, N = 256 * SCALE, 4096
    x, dy, w = torch.randn(M, N, device=device), torch.randn(M, N, device=device), torch.rand(N, device=device)
    rstd = torch.rsqrt((x * x).mean(1) + 1e-5)
    dx, dw = torch.empty_like(x), torch.zeros(N, device=device)
    fn = build_rmsnorm_bwd_module(N, "f32")

    def run():
        dw.zero_()
        fn(x, w, dy, rstd, dx, dw, M)

    def err():
        xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        gx, gw = torch.autograd.grad(xr * torch.rsqrt((xr * xr).mean(1, keepdim=True) + 1e-5) * wr, [xr, wr], dy)
        return max((dx - gx).abs().max().item(), (dw - gw).abs().max().item())

    return f"rmsnorm backward {M}x{N} f32 (atomics)", run, err


def gemm950(device, hti=False):
    import kernels.gemm.gemm_a16w16_gfx950 as G

    M, N, K = 256 * SCALE, 256, 256
    a, b = torch.randn(M, K, device=device).bfloat16(), torch.randn(K, N, device=device).bfloat16()
    c = torch.zeros(M, N, dtype=torch.bfloat16, device=device)
    flags = torch.zeros(1024, dtype=torch.int32, device=device)
    G.get_split_k_buffers = lambda stream, dev: (flags, flags)  # split_k = 1 never touches them
    G.run_cached = lambda fn, *args, dispatch_args, **kw: fn(*dispatch_args)  # the launcher itself, no HIP stream
    run = lambda: G.gemm_a16w16(a, b, c, stream=0, layout="nn", user_kwargs={"use_half_tile_interleaved": hti})  # noqa: E731
    what = "half-tile interleaved: wave groups a barrier apart, per-wave schedule" if hti else "async LDS"
    return f"gfx950 a16w16 GEMM {M}x{N}x{K} bf16 ({what})", run, lambda: (c.float() - a.float() @ b.float()).abs().max().item()


def gemm950hti(device):
    return gemm950(device, hti=True)


ARCH = {"gemm950": "gfx950", "gemm950hti": "gfx950"}


def main():
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    if not os.path.isdir(os.path.join(SRC, "kernels")):
        sys.exit(f"bench.flysim_speed runs FlyDSL's own kernels: FLYDSL_SRC={SRC} has no kernels/ folder; "
                 "set FLYDSL_SRC to a FlyDSL source checkout")
    device = args[args.index("--device") + 1] if "--device" in args else "cpu"
    cases = ("softmax", "gemm", "attn", "rmsnorm_bwd", "gemm950", "gemm950hti")
    which = [a for a in args if a in cases] or list(cases)
    global SCALE
    SCALE = int(args[args.index("--scale") + 1]) if "--scale" in args else 1
    if "--threads" in args:
        torch.set_num_threads(int(args[args.index("--threads") + 1]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    print("| case | device | launch wall (s) | cpu (s) | sim only (s) | lanes | lane-ops | lane-ops/s | max err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in which:
        with flysim.simulate(arch=ARCH.get(name, "gfx942"), check_races="--races" in args) as sim:
            title, run, err = globals()[name](device)
            run()  # compile + first run
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            sync()
            t, c = time.perf_counter(), time.process_time()
            run()
            sync()
            wall, cpu = time.perf_counter() - t, time.process_time() - c
        rec = sim.launches[-1]
        lanes = rec.grid[0] * rec.grid[1] * rec.grid[2] * rec.block[0] * rec.block[1] * rec.block[2]
        print(f"| {title} | {device} | {wall:.2f} | {cpu:.2f} | {rec.wall_s:.2f} | {lanes} | {rec.lane_ops:.3g} | "
              f"{rec.lane_ops / rec.wall_s:.3g} | {err():.3g} |", flush=True)


if __name__ == "__main__":
    main()
