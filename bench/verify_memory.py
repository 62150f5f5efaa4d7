"""What verification costs in memory: peak RSS of translate(verify=True) against eager's own peak and
against translate(verify=False), on activation-heavy conv models (KernelBench level-2 style, re-typed
from their well-known form and shrunk to this machine) and a small CNN from models/.

    python -m bench.verify_memory

Each (model, verify) point runs in its own child process. Peaks are Linux's VmHWM over the call,
less the RSS before it (the process with the model built and its inputs made, after a warm-up
translation of a tiny model and one eager forward, so that lazy imports and one-time allocations
count nowhere): "eager" is one forward of the model under no_grad; "translate" the whole translate(..., backend="reference") call.
Goal (issue 24 item 11): translate(verify=True) within 2x of eager's own peak on the same inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torch.nn as nn

from bench.scale import ROOT, _reset_peak, _status

MiB = 1 << 20


class ConvTransposeMeanSoftmax(nn.Module):
    """KernelBench L2/13's form: ConvTranspose3d -> mean over channels -> + bias -> softmax -> tanh -> scale."""

    def __init__(self, cin=8, cout=16, k=3, stride=2, padding=1, scale=2.0):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(cin, cout, k, stride=stride, padding=padding)
        self.bias = nn.Parameter(torch.randn(1, 1, 1, 1, 1))
        self.scale = scale

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.softmax(x + self.bias, dim=1)
        return torch.tanh(x) * self.scale


class ConvGeluPool(nn.Module):
    """KernelBench level-2's Conv2d -> GELU -> global average pool form."""

    def __init__(self, cin=8, cout=64, k=3):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.conv(x))
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)


def build(name: str):
    torch.manual_seed(0)
    if name == "l2_13_convtranspose3d":
        return ConvTransposeMeanSoftmax(), (torch.randn(8, 8, 16, 32, 32),)
    if name == "conv2d_gelu_pool":
        return ConvGeluPool(), (torch.randn(16, 8, 128, 128),)
    if name == "small_cnn":
        sys.path.insert(0, os.path.join(ROOT, "models"))
        import small_cnn

        return small_cnn.Model(3, 10, width=32, hidden=256).eval(), (torch.randn(64, 3, 64, 64),)
    raise KeyError(name)


MODELS = ["l2_13_convtranspose3d", "conv2d_gelu_pool", "small_cnn"]


def child(name: str, verify: bool) -> dict:
    import translator

    # lazy imports and one-time allocations (export, the lowerings, oneDNN) before anything is measured
    translator.translate(nn.Sequential(nn.Conv2d(2, 2, 3), nn.Flatten(), nn.Linear(8, 4)), (torch.randn(2, 2, 4, 4),),
                         backend="reference")
    m, inputs = build(name)
    m.eval()
    with torch.no_grad():
        m(*inputs)
    base = _status("VmRSS")
    _reset_peak()
    with torch.no_grad():
        out = m(*inputs)
    eager = _status("VmHWM") - base
    del out
    base = _status("VmRSS")
    _reset_peak()
    tm = translator.translate(m, inputs, backend="reference", verify=verify)
    peak = _status("VmHWM") - base
    v = tm.report.verification
    return dict(model=name, verify=verify, eager=eager, translate=peak, passed=v.passed, calibration=v.calibration)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], argv[2] == "1")))
        return 0
    print("bench.verify_memory: peak RSS over the process before the call (MiB); backend reference")
    print("| model | eager peak | translate, verify=False | translate, verify=True | verify=True / eager | verified |")
    print("|---|---|---|---|---|---|")
    for name in MODELS:
        rows = {}
        for verify in (False, True):
            p = subprocess.run([sys.executable, "-m", "bench.verify_memory", "--child", name, "1" if verify else "0"],
                               cwd=ROOT, capture_output=True, text=True)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            rows[verify] = json.loads(lines[-1]) if lines else {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        if any("error" in r for r in rows.values()):
            print(f"| {name} | failed: {[r.get('error') for r in rows.values()]} |||||")
            continue
        e, f, t = rows[True]["eager"], rows[False]["translate"], rows[True]["translate"]
        goal = "met" if t <= 2 * e else "NOT met"
        print(f"| {name} | {e / MiB:.0f} | {f / MiB:.0f} | {t / MiB:.0f} | {t / max(e, 1):.2f}x (goal <= 2x: {goal}) "
              f"| {rows[True]['passed']} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
