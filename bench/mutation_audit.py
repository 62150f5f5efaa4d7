"""Mutation audit: do the default tests fail when the code breaks?

    python -m bench.mutation_audit            # every seeded bug (minutes each on a loaded machine)
    python -m bench.mutation_audit --list     # the seeded bugs and the tests run for each
    python -m bench.mutation_audit --only softmax-no-max-subtraction --only verify-first-output-only

Each seeded bug is a text patch (an exact snippet and its broken replacement) applied to a
temporary copy of this checkout (the files git tracks plus untracked ones it does not ignore,
so uncommitted work is audited as it stands). The tests named for it run there in a fresh
process (this checkout's packages first on sys.path, a private generated-kernel cache), and
the bug counts as caught when they fail. A baseline run of the same tests on the unpatched
copy comes first: a test that already fails proves nothing. A patch whose snippet is no
longer in the file is reported as "stale" (the code moved: update the snippet), never as
caught.

The tests named per bug are the ones meant to catch it, all in the default suite (not
`slow`); the audit says whether they do. Prints one line per bug and a total.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # file to patch, relative to the checkout
    old: str  # exact snippet, must occur once
    new: str
    tests: tuple  # pytest node ids / paths (relative to the checkout)
    what: str


MUTATIONS = (
    Mutation(
        "rmsnorm-without-eps", "translator_kernels/rows/norm.py",
        "rstd = fx.math.rsqrt(total * INV_N + eps, fastmath=AFN)",
        "rstd = fx.math.rsqrt(total * INV_N, fastmath=AFN)",
        ("tests/kernels/test_numeric_edges.py::test_rms_norm_where_eps_matters",),
        "RMSNorm kernel drops eps from rsqrt(mean(x^2) + eps)"),
    Mutation(
        "layernorm-without-eps", "translator_kernels/rows/norm.py",
        "var = block_allreduce(rc.lane_sum(acc2, VEC), s_b) * INV_N\n                rstd = fx.math.rsqrt(var + eps,",
        "var = block_allreduce(rc.lane_sum(acc2, VEC), s_b) * INV_N\n                rstd = fx.math.rsqrt(var,",
        ("tests/kernels/test_numeric_edges.py::test_layer_norm_where_eps_matters",),
        "LayerNorm kernel drops eps from rsqrt(var + eps)"),
    Mutation(
        "softmax-no-max-subtraction", "translator_kernels/rows/softmax.py",
        "d = xs[t] - rmax\n", "d = xs[t]\n",
        ("tests/kernels/test_numeric_edges.py::test_softmax_of_shifted_rows",),
        "softmax kernel exponentiates x instead of x - max(x)"),
    Mutation(
        "fusion-swallows-smaller-shape", "translator/passes/partition.py",
        "if any(u not in region for u in m.users) and [str(d) for d in shape_of(m)] != full:",
        "if any(u not in region for u in m.users) and False:",
        ("tests/unit/test_fusion_shapes.py",),
        "an elementwise region takes in a smaller-shaped value that is used outside it"),
    Mutation(
        "verify-first-output-only", "translator/verify.py",
        "for i, (e, g) in enumerate(zip(exp, got)):",
        "for i, (e, g) in enumerate(zip(exp[:1], got[:1])):",
        ("tests/unit/test_verify.py::test_every_output_is_compared",
         "tests/unit/test_verify.py::test_a_wrong_second_output_fails_translate"),
        "verification compares only the first output"),
    Mutation(
        "model-tolerances-100x", "translator/tolerances.py",
        "    return MODEL_TOLERANCES[precision]\n",
        "    return tuple(100 * t for t in MODEL_TOLERANCES[precision])\n",
        ("tests/unit/test_verify.py",),
        "whole-model tolerances loosened 100x where they are read"),
    Mutation(
        "op-tolerances-100x", "translator/tolerances.py",
        "        atol, rtol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])\n",
        "        atol, rtol = (100 * t for t in TOLERANCES.get(dtype, TOLERANCES[torch.float32]))\n",
        ("tests/unit/test_verify.py::test_tolerance_tables_are_pinned",),
        "per-op tolerances loosened 100x where they are read"),
    Mutation(
        "flysim-buffer-load-ignores-soffset", "flysim/src/flysim/ops_mem.py",
        "        off, soffset = _buffer_offsets(ex, voff, soff, 0)\n        base = base + soffset\n        m = ex.mask\n"
        "        ex.lds.vm_issue(ex)\n        if _all_inside(off, nrec, es * cnt, m):\n            ex.R[out] = _from_bits(",
        "        off, soffset = _buffer_offsets(ex, voff, soff, 0)\n        m = ex.mask\n"
        "        ex.lds.vm_issue(ex)\n        if _all_inside(off, nrec, es * cnt, m):\n            ex.R[out] = _from_bits(",
        ("flysim/tests",),
        "flysim's raw buffer load adds voffset but not soffset"),
    Mutation(
        "attention-flops-halved", "translator/report/cost.py",
        "    return 2 * b * q.shape[-2] * k.shape[-2] * q.shape[-1] + 2 * b * q.shape[-2] * k.shape[-2] * v.shape[-1]",
        "    return b * q.shape[-2] * k.shape[-2] * q.shape[-1] + b * q.shape[-2] * k.shape[-2] * v.shape[-1]",
        ("tests/unit/test_report_flops.py",),
        "the report counts half of attention's FLOPs"),
    # ---- issue 24: state a fault can poison, the plan key ----------------------------------------------
    Mutation(
        "plan-key-without-strides", "translator_kernels/replay.py",
        "            tensors.append(a)\n            out.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 63))",
        "            tensors.append(a)\n            out.append((a.dtype, a.shape, a.device, a.data_ptr() & 63))",
        ("tests/kernels/test_replay_key.py",),
        "a per-call replay's signature leaves out a tensor argument's strides (a transposed input replays "
        "the contiguous plan)"),
    Mutation(
        "plan-key-without-dtype", "translator_kernels/replay.py",
        "            tensors.append(a)\n            out.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 63))",
        "            tensors.append(a)\n            out.append((a.shape, a.stride(), a.device, a.data_ptr() & 63))",
        ("tests/kernels/test_replay_key.py",),
        "a per-call replay's signature leaves out a tensor argument's dtype (an fp32 plan reads bf16 data)"),
    Mutation(
        "plan-key-nested-without-strides", "translator_kernels/replay.py",
        "        tensors.append(a)\n        out.append((a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 63))",
        "        tensors.append(a)\n        out.append((a.dtype, a.shape, a.device, a.data_ptr() & 63))",
        ("tests/kernels/test_replay_key.py::test_property_one_plan_never_serves_another_layout",),
        "the signature of a tensor inside a list argument (fused_elementwise's inputs) leaves out its strides"),
    Mutation(
        "plan-key-same-object-forgotten", "translator_kernels/replay.py",
        "        if j is not None:\n            out.append((\"same\", j))\n            return\n",
        "",
        ("tests/kernels/test_replay.py::test_same_object_twice_is_its_own_signature",),
        "the signature no longer tells f(x, x) from f(x, y)"),
    Mutation(
        "bmm-batch-stride-without-k-padding", "translator_kernels/gemm/__init__.py",
        "m, batch, m * k_eff, w_bs,", "m, batch, m * k, w_bs,",
        ("tests/kernels/test_replay_key.py::test_bmm_batch_stride_with_a_k_tail",),
        "bmm's activation batch stride uses K (38) instead of the padded K (40)"),
    Mutation(
        "bmm-weight-batch-stride-unpadded", "translator_kernels/gemm/__init__.py",
        "w_bs = (n_pad * k_pad if w_layout", "w_bs = (n * k if w_layout",
        ("tests/kernels/test_replay_key.py::test_bmm_batch_stride_with_a_k_tail",),
        "bmm's preshuffled operand batch stride uses N x K instead of the padded N_pad x K_pad"),
    Mutation(
        "splitk-counters-shared-after-fault", "translator_kernels/gemm/splitk.py",
        "            cnt = free.pop()\n", "            cnt = free[-1]\n",
        ("tests/kernels/test_splitk_faults.py",),
        "split-K ticket counters stay shared between launches (left dirty by a launch that raised)"),
    Mutation(
        "splitk-counters-baked-into-plan", "translator_kernels/gemm/splitk.py",
        "replay_value(take_counters, device,", "take_counters(device,",
        ("tests/kernels/test_splitk_faults.py", "tests/kernels/test_replay.py::test_rocm_path_split_k_plan_takes_counters_per_call"),
        "a per-call replay replays the counter array its recording took (a fault on a replay leaves it dirty)"),
    Mutation(
        "splitk-counters-given-back-before-the-launch", "translator_kernels/gemm/splitk.py",
        "    return p, replay_value(take_counters, device, tiles * (WAVES // cfg.kw))\n",
        "    cnt = replay_value(take_counters, device, tiles * (WAVES // cfg.kw))\n    give_back(cnt)\n    return p, cnt\n",
        ("tests/kernels/test_splitk_faults.py",),
        "split-K counters go back to the pool before the launch ran, so a launch that raised leaves them dirty there"),
    Mutation(
        "backend-pushed-before-its-try", "translator/runtime/__init__.py",
        "    try:  # pushed inside the try, popped only if pushed: an interrupt anywhere leaves the stack as it was\n"
        "        stack.append(state)\n",
        "    stack.append(state)\n    try:\n",
        ("tests/kernels/test_interrupts.py::test_an_interrupt_at_any_line_leaves_no_state[first-sight-each-step]",),
        "use_backend pushes its state before the try that pops it: a Ctrl-C in between leaves the backend on"),
    Mutation(
        "plan-recording-set-before-its-try", "translator_kernels/replay.py",
        "    try:  # set inside the try: a Ctrl-C right after it must not leave this thread recording into `rec`\n"
        "        _local.replay_rec = rec\n",
        "    _local.replay_rec = rec\n    try:\n",
        ("tests/kernels/test_interrupts.py::test_an_interrupt_at_any_line_leaves_no_state[plan-build-each-step]",),
        "a plan's recording state is set before the try that clears it: a Ctrl-C in between leaves the thread "
        "recording forever"),
    Mutation(
        "model-fp32-atol-100x-unpinned", "translator/tolerances.py",
        '    "fp32": (1e-5, 1e-5, 1e-5),', '    "fp32": (1e-3, 1e-5, 1e-5),',
        ("tests/unit/test_verify.py", "--deselect", "tests/unit/test_verify.py::test_tolerance_tables_are_pinned"),
        "fp32 whole-model atol 100x, with the test that pins the table left out: only a behavioural "
        "tolerance test can catch it (test_one_element_off_by_5e4_at_unit_scale_fails)"),
    # ---- issue 31 and its leftovers: prepared weights, calibration, localization, folded constants -------
    Mutation(
        "fold-shapes-stamp-without-identity", "translator/passes/fold_shapes.py",
        "        if tref() is not t or sref() is None or t.data_ptr() != ptr",
        "        if t.data_ptr() != ptr",
        ("tests/unit/test_fold_shapes.py::test_a_constant_freed_and_remade_at_the_same_address_is_seen",),
        "a folded region's cache matches a constant by address and version alone (a tensor freed and remade "
        "where it was serves the old results)"),
    Mutation(
        "lazy-weights-kept-for-a-kernel-backend", "translator/state.py",
        '    if backend != "reference" or sum(', "    if sum(",
        ("tests/unit/test_lazy_prepared.py",),
        "prepared weights stay unmade for flysim / rocm too (every kernel call remakes its weight)"),
    Mutation(
        "calibration-never-run", "translator/verify.py",
        "        if v.passed:\n            calibration.note = (",
        "        if True:\n            calibration.note = (",
        ("tests/unit/test_verify.py::test_the_fp64_run_is_made_only_when_an_output_fails_the_table",),
        "the fp64 calibration is never run, so an ill-conditioned model's correct translation fails"),
    Mutation(
        "localization-skips-merged-qkv-slices", "translator/verify.py",
        "        for u in n.users:\n            if _replaces(u) in ref and u.name in got:",
        "        for u in ():\n            if _replaces(u) in ref and u.name in got:",
        ("tests/unit/test_verify_low_precision.py::test_a_seeded_bug_fails_at_every_depth[2-bias dropped]",),
        "localization does not judge the merged QKV GEMM by its slices (a bug in it is named at attention)"),
)


def tree_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (root / f).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    for f in tree_files(root):
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)


def run_tests(tree: Path, tests, timeout: float) -> tuple[int | None, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "flysim" / "src")])
    env["FLYDSL_TRANSLATOR_KERNEL_CACHE"] = str(tree.parent / "kcache")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    lines = [ln for ln in (p.stdout + p.stderr).strip().splitlines() if ln.strip()]
    return p.returncode, lines[-1] if lines else ""


def audit(m: Mutation, timeout: float, baseline: bool) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutation-audit-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(ROOT, tree)
        if baseline:
            rc, last = run_tests(tree, m.tests, timeout)
            if rc != 0:
                return "baseline fails", last, time.perf_counter() - t0
        f = tree / m.path
        text = f.read_text()
        if text.count(m.old) != 1:
            return "stale", f"snippet found {text.count(m.old)} times in {m.path}", time.perf_counter() - t0
        f.write_text(text.replace(m.old, m.new))
        rc, last = run_tests(tree, m.tests, timeout)
    verdict = {0: "NOT CAUGHT", 1: "caught"}.get(rc, "timeout" if rc is None else f"error (pytest rc {rc})")
    return verdict, last, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the seeded bugs and their tests, run nothing")
    ap.add_argument("--only", action="append", default=[], help="run only this bug (repeatable)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unpatched run of each bug's tests")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per pytest run (default 1200)")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        ap.error(f"unknown bug(s) {', '.join(sorted(unknown))}; --list shows them")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n    {m.path}; tests: {' '.join(m.tests)}")
        return 0
    caught, survivors = 0, []
    for m in chosen:
        verdict, last, secs = audit(m, args.timeout, not args.no_baseline)
        caught += verdict == "caught"
        if verdict != "caught":
            survivors.append((m, verdict, last))
        print(f"{verdict:>14}  {m.name:<36} {secs:6.0f} s  {last[:100]}", flush=True)
    share = 100 * caught / max(len(chosen), 1)
    print(f"{caught} of {len(chosen)} seeded bugs caught ({share:.0f}%; goal >= 95%)")
    if survivors:
        print("survivors:")
    for m, verdict, last in survivors:
        print(f"  {m.name} ({m.what}): {_reason(verdict, m, last)}")
    return 0 if caught == len(chosen) else 1


def _reason(verdict: str, m: Mutation, last: str) -> str:
    tests = " ".join(t for t in m.tests if not t.startswith("--"))
    return {"NOT CAUGHT": f"its tests ({tests}) pass with the bug in ({last})",
            "baseline fails": f"its tests fail without the bug, so they prove nothing ({last})",
            "stale": f"the code moved ({last}): update the snippet",
            "timeout": "its tests did not finish in the time given (--timeout)",
            "error (pytest rc 5)": f"no test ran: its tests ({tests}) are deselected by the default suite's "
                                   f"markers (marked slow), so the default suite cannot catch it ({last})"}.get(
        verdict, f"{verdict}: {last}")


if __name__ == "__main__":
    sys.exit(main())
