"""translator_kernels.jit_memo: a repeated compile-only call is skipped; a real launch, a flysim
session, or a different argument signature never is."""

from __future__ import annotations

import torch

import flysim
from translator_kernels import jit_memo


class Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1


def test_compile_only_repeat_is_skipped(monkeypatch):
    monkeypatch.setenv("COMPILE_ONLY", "1")
    f = Counting()
    x = torch.zeros(4, 8)
    jit_memo.call(f, x, 3)
    jit_memo.call(f, torch.ones(4, 8), 3)  # same signature: the compile would be identical
    assert f.calls == 1
    jit_memo.call(f, torch.zeros(4, 9), 3)  # another shape: compiled
    jit_memo.call(f, x, 4)  # another scalar value: compiled
    assert f.calls == 3


def test_real_launch_is_never_skipped(monkeypatch):
    monkeypatch.delenv("COMPILE_ONLY", raising=False)
    f = Counting()
    for _ in range(3):
        jit_memo.call(f, torch.zeros(2, 2))
    assert f.calls == 3


def test_flysim_session_is_never_skipped():
    f = Counting()
    with flysim.simulate(arch="gfx942"):  # sets COMPILE_ONLY, but every call must execute
        for _ in range(2):
            jit_memo.call(f, torch.zeros(2, 2))
    assert f.calls == 2
