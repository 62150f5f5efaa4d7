"""How many data-movement ops of small models written the way real code writes them stay in
PyTorch per forward, and how many FlyDSL launches one forward makes (flysim, verified).

    python -m bench.layout_coverage            # the models, on flysim
    python -m bench.layout_coverage --host     # host us per layout call, rocm path (device call recorded)

Models: a Swin-style shifted-window block (roll, pad, window partition), a hand-written GQA
attention with repeat_interleave of K / V, a sliding-window feature (unfold), and masking glue
(masked_fill outside attention, clamp with tensor bounds, zeros_like, index_select, expand_as).
Counted from the report's rows: ops left in PyTorch that move data or compute (views that alias
their input are free and not counted), and the kernels one forward launched.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import translator
from translator.report.cost import is_view


class ShiftedWindows(nn.Module):
    def __init__(self, c=32, w=4):
        super().__init__()
        self.w, self.norm, self.proj = w, nn.LayerNorm(c), nn.Linear(c, c)

    def forward(self, x):  # [B, H, W, C]
        b, h, w_, c = x.shape
        y = torch.roll(self.norm(x), shifts=(-2, -2), dims=(1, 2))
        y = F.pad(y, (0, 0, 0, 2, 0, 2))
        hp, wp = h + 2, w_ + 2
        win = y.view(b, hp // self.w, self.w, wp // self.w, self.w, c).permute(0, 1, 3, 2, 4, 5)
        out = self.proj(win.reshape(-1, self.w * self.w, c))
        return out.sum(1)


class GQA(nn.Module):
    def __init__(self, d=64, h=4, kv=2):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, kv * self.hd), nn.Linear(d, kv * self.hd)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.h // self.kv, dim=1)
        v = self.v(x).view(b, s, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.h // self.kv, dim=1)
        w = torch.softmax(q @ k.transpose(-1, -2) / self.hd ** 0.5, -1)
        return (w @ v).transpose(1, 2).reshape(b, s, -1)


class SlidingWindows(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.fc = nn.Linear(n, 16)

    def forward(self, x):  # [B, T]
        return self.fc(F.pad(x, (3, 4)).unfold(1, 8, 2))


class MaskGlue(nn.Module):
    def forward(self, x, keep, lo, ids):
        y = x.masked_fill(~keep, 0.0)
        y = torch.clamp(y, min=lo, max=lo + 1.0)
        z = torch.zeros_like(y) + lo.expand_as(y)
        return torch.index_select(y + z, 1, ids)


def models():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 10)
    return {
        "shifted windows": (ShiftedWindows(), (torch.randn(2, 6, 6, 32),)),
        "gqa repeat_interleave": (GQA(), (torch.randn(2, 8, 64),)),
        "sliding windows": (SlidingWindows(), (torch.randn(3, 21),)),
        "mask glue": (MaskGlue(), (x, x > -0.5, torch.randn(2, 6, 1), torch.tensor([0, 3, 5, 5]))),
    }


def _view(op: str) -> bool:
    packet = getattr(torch.ops.aten, op.split(".")[1])
    return is_view(getattr(packet, packet.overloads()[0]))


def measure(name, model, inputs) -> dict:
    tm = translator.translate(model.eval(), inputs, backend="flysim")
    tm(*inputs)
    torch_rows = [r for r in tm.report.rows if r.where == "pytorch" and r.op.startswith("aten.") and not _view(r.op)]
    return {"model": name, "verified": tm.report.verification.passed,
            "pytorch ops per forward": len(torch_rows), "flydsl launches": len(tm.last_launches),
            "left in PyTorch": ", ".join(sorted(r.op.removeprefix("aten.") for r in torch_rows))}


def host_table(repeat: int = 100) -> None:
    """Median CPU us per call of the layout entry points on the rocm path with the device call recorded
    (bench.host_overhead's method), beside eager's dispatch on zero-row tensors."""
    import translator_kernels.layout as L
    from bench.host_overhead import _launch_share, _median_us
    from translator.runtime.stub import rocm_recorded

    x, ids = torch.randn(128, 768), torch.randint(0, 128, (64,))
    cases = [("pad 128x768 (8, 8)", lambda: L.pad(x, [8, 8]), lambda: F.pad(x[:0], (8, 8))),
             ("roll 128x768", lambda: L.roll(x, [3], [0]), lambda: torch.roll(x[:0], 3, 0)),
             ("expand 128x1 -> 128x768", lambda: L.expand(x[:, :1], [128, 768]),
              lambda: x[:0, :1].expand(0, 768).contiguous()),
             ("index_select 128x768, 64 ids", lambda: L.index_select(x, 0, ids), lambda: x[:0].index_select(1, ids[:0]))]
    print("| op | ours us | of which launch.call us | eager us (zero rows) |\n|---|---|---|---|")
    for label, ours, eager in cases:
        with rocm_recorded("gfx942") as rec:
            ours()
            rec.clear()
            t, t_launch = _median_us(ours, repeat), _launch_share(ours, repeat)
        print(f"| {label} | {t:.1f} | {t_launch:.1f} | {_median_us(eager, repeat):.1f} |")


if __name__ == "__main__":
    import sys

    if "--host" in sys.argv:
        host_table()
        raise SystemExit
    rows = [measure(n, m, i) for n, (m, i) in models().items()]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
