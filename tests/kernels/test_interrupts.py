"""A Ctrl-C at any line of the kernel library's host path leaves nothing behind (issue 24, item 1:
"look for any other state like this").

The host path keeps per-thread state (launch mode, launch log, the plan being recorded, the backend
stack, the environment a GPU-less rocm compile sets) and process-wide tables (compiled
specializations, plans, split-K counter pools). A trace function raises KeyboardInterrupt at the
n-th line run in those modules (but inside a `finally:` cleanup), for every n of a split-K GEMM call on the rocm host path (device
call recorded: host code only, milliseconds a call): on first sight, while its plan is built, on a
replay. After each interrupt the thread state, the environment, the execution lock and torch's dispatch
stack are as before (CPython 3.11 runs a line event on a `with` line before `__exit__`, where the with
does not protect: hence no `with lock:` / `with mode:` on this path), the next two calls
(a plan built or replayed) record the same device calls, and at the end the GEMM under flysim equals torch.

The same for a translated module's call on the rocm host path: TranslatedModule.forward (grad mode,
backend, the generated-kernel recorder, the execution lock), the build of its fast forward
(runtime.fastpath's lock) and a folded shape region's cache (its lock), with the interrupt kept
alive as Python's REPL keeps the last one.
"""

import ast
import os
import sys
from pathlib import Path

import pytest
import torch

from translator import runtime
from translator.runtime import fastpath
from translator.runtime.stub import rocm_recorded
from translator.tolerances import op_tol
from translator_kernels import launch as kl
from translator_kernels import replay
from translator_kernels.codegen import host as codegen_host
from translator_kernels.gemm import gemm, splitk
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import GemmConfig

ARCH = "gfx942"
WATCHED = {"translator_kernels.replay", "translator_kernels.launch", "translator_kernels.gemm",
           "translator_kernels.gemm.splitk", "translator_kernels.packer", "translator.runtime",
           "translator.runtime.stub", "translator.runtime.ops"}
CFG = GemmConfig(16, 64, 64, split=2)  # split-K: counters taken and given back per launch


def _cleanup_lines(filename: str) -> frozenset:
    """Lines inside the `finally:` suites of a module: an interrupt there stops the cleanup itself,
    which no Python code can guard against (CPython delivers a signal between bytecodes), so those
    lines are not interrupted."""
    got = _CLEANUP.get(filename)
    if got is None:
        path = Path(filename)  # generated code (a plan's run function, dataclass methods) has none
        tree = ast.parse(path.read_text()) if path.is_file() else ast.Module(body=[], type_ignores=[])
        got = _CLEANUP[filename] = frozenset(
            line for node in ast.walk(tree) if isinstance(node, ast.Try)
            for stmt in node.finalbody for line in range(stmt.lineno, stmt.end_lineno + 1))
    return got


_CLEANUP: dict = {}


class _Interrupt:
    """sys.settrace hook: KeyboardInterrupt at the `at`-th line run in a `watched` module (default
    WATCHED), cleanup lines left out. When `at` is None it only counts, and `steps` lists the n at which each distinct
    step (file, the frame's previous line, line) is first run: a loop's later turns repeat steps, and
    the exit of a `with` (a second event on its line, after the body's last) is a step of its own."""

    def __init__(self, at=None, watched=WATCHED):
        self.at, self.lines, self.where, self.steps, self._seen = at, 0, None, [], set()
        self.watched = watched

    def __call__(self, frame, event, arg):
        if frame.f_globals.get("__name__") not in self.watched:
            return None
        prev = None

        def line(frame, event, arg):
            nonlocal prev
            if event == "line" and frame.f_lineno not in _cleanup_lines(frame.f_code.co_filename):
                self.lines += 1
                step = (frame.f_code.co_filename, prev, frame.f_lineno)
                if step not in self._seen:
                    self._seen.add(step)
                    self.steps.append(self.lines)
                if self.lines == self.at:
                    self.where = f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"
                    raise KeyboardInterrupt(f"interrupted at {self.where}")
            if event == "line":
                prev = frame.f_lineno
            return line
        return line


def _state():
    env = {k: os.environ.get(k) for k in ("COMPILE_ONLY", "ARCH", "FLYDSL_GPU_ARCH", "ROCM_PATH")}
    return (getattr(kl._local, "mode", None), getattr(kl._local, "log", None), getattr(kl._local, "replay_rec", None),
            list(getattr(runtime._state, "stack", None) or []), env, torch.is_grad_enabled(),
            list(getattr(codegen_host._RECORDERS, "stack", None) or []))


def _operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(3, 256, generator=g), torch.randn(48, 256, generator=g)
    return a, w, shuffle_weight(w)


def _locks_held(tm=None):
    """Which of the host path's locks this thread still holds (and of `tm`'s folded shape region)."""
    folded = _folded_lock(tm)
    return [name for name, held in (("runtime.EXECUTION_LOCK", runtime.EXECUTION_LOCK._is_owned()),
                                    ("launch._LOCK", kl._LOCK._is_owned()), ("replay._LOCK", replay._LOCK.locked()),
                                    ("fastpath._LOCK", fastpath._LOCK.locked()),
                                    ("folded._lock", folded is not None and folded.locked()))
            if held]


def _folded_lock(tm):
    region = getattr(getattr(tm, "gm", None), "_flydsl_folded_0", None)
    return region._lock if region is not None else None


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["each-step", "every-line"])
@pytest.mark.parametrize("stage", [0, 1, 2], ids=["first-sight", "plan-build", "replay"])
def test_an_interrupt_at_any_line_leaves_no_state(stage, every):
    """The default run interrupts at the first run of each distinct step (~1,000 points over the
    three stages, ~20 s); -m slow interrupts at every line run (~2,300)."""
    a, w, ws = _operands()

    def call(hook=None):
        sys.settrace(hook)  # entering and leaving the backend is traced too
        try:
            with rocm_recorded(ARCH) as rec:
                gemm(a, ws, 48, 256, _config=CFG)
        finally:
            sys.settrace(None)
        return list(rec)

    def setup():
        replay.clear_replays()
        return [call() for _ in range(stage)]

    before = _state()
    want = call()  # compiles outside the trace
    setup()
    counter = _Interrupt()
    assert call(counter) == want
    assert counter.lines > 20
    for at in range(1, counter.lines + 1) if every else counter.steps:
        setup()
        hook = _Interrupt(at)
        try:
            call(hook)
        except KeyboardInterrupt:
            pass
        assert _state() == before, f"an interrupt in {hook.where} left thread state or the environment behind"
        # process-wide: a leaked EXECUTION_LOCK hangs every other thread's translated call, a recorder
        # left on torch's dispatch stack records (and so plans) nothing again
        assert _locks_held() == [], f"an interrupt in {hook.where} left a lock held"
        assert torch._C._len_torch_dispatch_stack() == 0, f"an interrupt in {hook.where} left a dispatch mode on"
        assert [call() for _ in range(2)] == [want] * 2, f"after an interrupt in {hook.where}"
    replay.clear_replays()


# a translated module's call on top: its forward (grad mode, backend, kernel recorder, the execution
# lock) and the fast forward's build (fastpath._LOCK)
WATCHED_CALL = WATCHED | {"translator.translated", "translator.runtime.fastpath", "translator_kernels.codegen.host",
                          "translator.passes.fold_shapes"}


class _Folded(torch.nn.Module):
    """A shape-only region (positions from the input's size: folded, its cache behind a lock) before the GEMM."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(256, 48)

    def forward(self, x):
        return self.lin(x * torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(-1).cos())


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["each-step", "every-line"])
@pytest.mark.parametrize("built,folded", [(True, False), (False, True), pytest.param(False, False, marks=pytest.mark.slow)],
                         ids=["fast-forward-built", "folded-region", "fast-forward-cached"])  # cached: folded-region's too
def test_an_interrupt_in_a_translated_call_leaves_no_state(built, folded, every):
    """TranslatedModule.forward on the rocm host path (device calls recorded), interrupted at each step
    of its own lines, the fast forward's build (`built`: the fast forward made in the call), a folded
    shape region's cache (`folded`) and the kernels' host path below them."""
    from translator import translate

    torch.manual_seed(0)
    model = (_Folded() if folded else torch.nn.Linear(256, 48)).eval()
    x = torch.randn(3, 256)
    tm = translate(model, (x,), backend="reference", verify=False)
    tm.backend = "rocm"

    def call(hook=None):
        if built:
            fastpath._FAST.pop(tm.gm, None)
        with rocm_recorded(ARCH) as rec:
            sys.settrace(hook)
            try:
                tm(x)
            finally:
                sys.settrace(None)
        return list(rec)

    def setup():  # the GEMM's per-call replay recorded: every counted call takes the same lines
        replay.clear_replays()
        call()
        call()

    before = _state()
    want = call()
    setup()
    counter = _Interrupt(watched=WATCHED_CALL)
    assert call(counter) == want and [n for n, _ in want] == ["elementwise"] * folded + ["gemm"]
    for at in range(1, counter.lines + 1) if every else counter.steps:
        setup()
        hook = _Interrupt(at, WATCHED_CALL)
        kept = None
        try:
            call(hook)
        except KeyboardInterrupt as e:
            # kept, as Python's REPL keeps the last one (sys.last_exc): its frames keep a context manager
            # that was entered and never exited alive, which would otherwise close it when collected
            kept = e
        assert hook.where is not None, f"line {at} of the counted call was not reached"
        assert _state() == before, f"an interrupt in {hook.where} left thread state, grad mode or the environment behind"
        held = _locks_held(tm)
        for name, lock in (("fastpath._LOCK", fastpath._LOCK), ("folded._lock", _folded_lock(tm))):
            if name in held:  # not re-entrant: released, so that a failure here hangs no later call or test
                lock.release()
        assert held == [], f"an interrupt in {hook.where} left {held} held"
        assert torch._C._len_torch_dispatch_stack() == 0, f"an interrupt in {hook.where} left a dispatch mode on"
        assert [call() for _ in range(2)] == [want] * 2, f"after an interrupt in {hook.where}"
        del kept
    replay.clear_replays()


def test_after_the_interrupts_flysim_still_equals_torch():
    a, w, ws = _operands(1)
    tol = op_tol(torch.float32, "gemm", reduction_length=256, scale=10.0)
    with runtime.use_backend("flysim", ARCH):
        for _ in range(3):
            torch.testing.assert_close(gemm(a, ws, 48, 256, _config=CFG), a @ w.T, **tol)
    assert all(not c.any() for c in splitk._POOL.get((torch.device("cpu"), None), []))
