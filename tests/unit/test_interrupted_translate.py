"""An interrupted first translate() leaves nothing behind (issue 24 item 3).

Before: a Ctrl-C while translate() imported the lowerings (its first call does) left the registry
half filled, and every later translate() of the process raised "op family 'gemm' registered twice"
or reported ops without a lowering. Now that import is all or nothing (translator.registry.populating).

Each case runs in a fresh interpreter (the state in question is built once per process): a trace
function counts the calls of functions in translator/ and translator_kernels/ and interrupts the
call number given, then the next translate() of the same process (interrupted again, for a
sequence) ... and a last one, uninterrupted, must give the report and the numerics of a clean
process. "signal" delivers a real SIGINT (a Ctrl-C: Python raises KeyboardInterrupt where the
handler runs); "raise" raises KeyboardInterrupt in the called function itself.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = '''
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(32, 64); s.b = nn.Linear(64, 16)
    def forward(s, x):
        return torch.softmax(s.b(torch.tanh(s.a(x))), -1) * 2
torch.manual_seed(0); m = M().eval(); x = torch.randn(4, 32)
def summary(tm):
    with torch.no_grad():
        y = tm(x)
        err = float((y - m(x)).abs().max())
    return dict(rows=[[r.node, r.where, r.detail] for r in tm.report.rows], launches=len(tm.last_launches), err=err,
                passed=tm.report.verification.passed)
'''

CHILD = MODEL + '''
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may inherit SIGINT ignored
ROOT = sys.argv[1]
DIRS = tuple(os.path.join(ROOT, d) + os.sep for d in ("translator", "translator_kernels"))
backend, steps = sys.argv[2], json.loads(sys.argv[3])
import translator
events = []
for mode, n in steps:
    count = [0]
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(DIRS):
            count[0] += 1
            if count[0] == n:
                sys.settrace(None)  # the rest of the attempt runs untraced (fast)
                if mode == "signal":
                    signal.raise_signal(signal.SIGINT)
                else:
                    raise KeyboardInterrupt
    sys.settrace(tracer)
    try:
        translator.translate(m, (x,), backend=backend)
        events.append("completed")
    except KeyboardInterrupt:
        events.append("interrupted")
    except Exception as e:  # a later attempt failing otherwise is what this test looks for
        events.append(f"{type(e).__name__}: {e}")
    finally:
        sys.settrace(None)
try:
    out = summary(translator.translate(m, (x,), backend=backend))
except Exception as e:
    out = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(dict(events=events, **out)))
'''


def _clean(backend):
    ns: dict = {}
    exec(MODEL, ns)
    from translator import translate

    return json.loads(json.dumps(ns["summary"](translate(ns["m"], (ns["x"],), backend=backend))))


def _interrupted(backend, steps):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "flysim", "src")]))
    out = subprocess.run([sys.executable, "-c", CHILD, ROOT, backend, json.dumps(steps)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check(backend, steps):
    got, want = _interrupted(backend, steps), _clean(backend)
    assert all(e in ("interrupted", "completed") for e in got["events"]), got["events"]
    assert "interrupted" in got["events"]
    assert "error" not in got, got["error"]
    assert got["rows"] == want["rows"]
    assert got["launches"] == want["launches"] and got["passed"]
    assert got["err"] < 1e-4


# (mode, call number) per attempt; a first translate on reference makes ~3300 such calls, of which
# ~1300 import the lowerings (the registry's population)
CASES = {
    "ctrl-c while the lowerings are imported, three times": [("signal", 60), ("signal", 300), ("signal", 900)],
    "interrupted in capture, passes and report": [("raise", 1700), ("signal", 200), ("raise", 1000)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_interrupted_translate_leaves_nothing_behind(case):
    _check("reference", CASES[case])


POINTS = [5, 20, 50, 100, 200, 300, 500, 800, 1100, 1400, 1700, 2000, 2400, 2800, 3200]


@pytest.mark.slow
@pytest.mark.parametrize("step", [("signal", n) for n in POINTS] + [
    ("raise", n) for n in POINTS], ids=str)
def test_interrupted_at_many_points(step):
    _check("reference", [list(step)])


@pytest.mark.slow
@pytest.mark.parametrize("n", [3400, 3800, 4200, 4600])
def test_interrupted_while_flysim_compiles_and_launches(n):
    """flysim's first translate also compiles and launches (launch caches, plans, flysim sessions)."""
    _check("flysim", [("raise", n)])
