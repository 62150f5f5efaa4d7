"""translator_kernels.launch: one compile per specialization, no trace on later calls, on the
flysim backend and on the rocm path (device call recorded), and what the key keeps and drops."""

import logging

import pytest
import torch
from translator.tolerances import model_tol

import executors  # the session's executor (tests/executors.py)
from flydsl.compiler import jit_function as JF
from translator.runtime.stub import rocm_recorded
from translator_kernels import launch as kl
from translator_kernels.gemm import gemm
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.rows.norm import layer_norm
from translator_kernels.rows.softmax import build_softmax, softmax


@pytest.fixture
def traces(monkeypatch):
    """Every FlyDSL trace, as the origin of the launcher traced ("module.builder(args)"). The
    launch module's in-process cache starts empty, so a count never depends on earlier tests."""
    kl.clear()
    seen = []
    orig = JF.JitFunction._trace

    def counting(self, *a, **k):
        seen.append(kl.origin(self))
        return orig(self, *a, **k)

    monkeypatch.setattr(JF.JitFunction, "_trace", counting)
    return seen


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path / "flydsl"))


@pytest.mark.flysim_only("flysim's compile path and each launch's grid")
def test_flysim_compiles_once_and_new_row_count_traces_nothing(traces):
    x = torch.randn(3, 256)
    with executors.current().run("gfx942") as sim:
        softmax(x)
        before = len(traces)
        for rows in (3, 50, 7):
            y = torch.randn(rows, 256)
            torch.testing.assert_close(softmax(y), torch.softmax(y, -1))
    assert before <= 1 and len(traces) == before  # M is a run-time Int32: no new trace
    assert len(sim.launches) == 4 and sim.launches[-1].grid[0] >= 1


@pytest.mark.flysim_only("the key of flysim's compile target")
def test_key_keeps_dtype_layout_and_target_drops_sizes(monkeypatch):
    monkeypatch.setenv("FLYDSL_GPU_ARCH", "gfx942")
    launcher = build_softmax(256, "f32", 4, False, "gfx942")
    a, b = torch.randn(4, 256), torch.randn(64, 256)
    assert kl.key(launcher, a, a, 4) == kl.key(launcher, b, b, 64)
    assert kl.key(launcher, a, a, 4) != kl.key(launcher, a.half(), a, 4)
    assert kl.key(launcher, a, a, 4) != kl.key(launcher, a.t(), a, 4)  # unit stride moved
    assert kl.key(launcher, a, a, 4) != kl.key(launcher, a, a, 4.0)
    target = kl.key(launcher, a, a, 4)[1]
    monkeypatch.setenv("FLYDSL_GPU_ARCH", "gfx950")
    assert kl.key(launcher, a, a, 4)[1] != target and "gfx950" in kl.key(launcher, a, a, 4)[1][0]
    with executors.current().run("gfx950"):
        assert "flysim" in kl.key(launcher, a, a, 4)[1][0]
    with pytest.raises(TypeError, match="takes 3 arguments"):
        kl.key(launcher, a, a)


def test_rocm_path_recorded_compiles_once(traces, disk_cache, caplog):
    """The code a GPU user runs: CompiledFunction + FlyDSL's argument packing; only the call of
    the host function pointer is recorded instead of executed."""
    w = torch.randn(96, 64)
    ws = shuffle_weight(w)
    with caplog.at_level(logging.INFO, logger="translator_kernels.launch"), rocm_recorded("gfx942") as rec:
        gemm(torch.randn(5, 64), ws, 96, 64)
        layer_norm(torch.randn(5, 64), torch.ones(64), torch.zeros(64))
        first = len(traces)
        for m in (5, 9, 16):  # one M bucket: run-time sizes only
            gemm(torch.randn(m, 64), ws, 96, 64)
            layer_norm(torch.randn(m, 64), torch.ones(64), torch.zeros(64))
    assert len(rec) == 8 and all(n > 0 for _name, n in rec)
    assert [name for name, _n in rec[:2]] == ["gemm", "row_norm"]
    assert first == 2 and len(traces) == first
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled")]
    assert len(compiled) == 2 and "rocm" in compiled[0] and "build_gemm" in compiled[0]


def test_compile_only_compiles_once_and_runs_nothing(traces, monkeypatch, disk_cache):
    from flysim.toolchain import compile_env

    for k, v in compile_env("gfx950").items():
        monkeypatch.setenv(k, v)
    x = torch.randn(4, 128)
    out1 = softmax(x)
    out2 = softmax(torch.randn(9, 128))
    assert len(traces) == 1 and out1.shape == (4, 128) and out2.shape == (9, 128)


@pytest.mark.flysim_only("a flysim compiled function handed to the device-call recorder")
def test_recorder_refuses_a_flysim_compiled_function():
    x = torch.randn(4, 128)
    with executors.current().run("gfx942"), kl.record_device_calls():
        with pytest.raises(RuntimeError, match="stands in for a GPU launch"):
            softmax(x)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.ln = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)

    def forward(self, x):
        return torch.softmax(self.ln(self.fc(x)), -1)


def test_translated_model_repeated_and_new_batch_trace_nothing(traces, disk_cache, caplog):
    from translator import translate

    torch.manual_seed(0)
    model = _Mlp().eval()
    tm = translate(model, (torch.randn(2, 8, 64),), backend="flysim", verify=False)
    warm = len(traces)
    assert warm == 3  # precompiled at translate time: gemm, layer_norm, softmax (nothing ran yet)
    for b in (3, 2, 1):  # M = 24, 16, 8: one GEMM tile (16 x 64; M = 17..32 takes it too)
        x = torch.randn(b, 8, 64)
        torch.testing.assert_close(tm(x), model(x), **model_tol())
        assert len(tm.last_launches) == 3
    assert len(traces) == warm
    with caplog.at_level(logging.INFO, logger="translator_kernels.launch"):
        tm(torch.randn(9, 8, 64))  # M = 72: past the 64-row bucket, another GEMM tile, a new specialization
    assert len(traces) == warm + 1 and "build_gemm" in traces[-1]
    assert any("compiled translator_kernels.gemm.kernel.build_gemm" in r.getMessage() for r in caplog.records)
    with rocm_recorded(tm.arch) as rec:
        tm.gm(torch.randn(2, 8, 64))
        cold = len(traces)
        tm.gm(torch.randn(2, 8, 64))
        tm.gm(torch.randn(1, 8, 64))
    assert len(traces) == cold and [n for n, _ in rec] == ["gemm", "row_norm", "softmax"] * 3


_SECOND_PROCESS = """
import json, sys, torch
from flydsl.compiler import jit_function as JF
from translator import translate
from translator.runtime.precompile import precompile
from translator.runtime.stub import rocm_compile_env
count = {"compiles": 0}
orig = JF.MlirCompiler.__dict__["compile"].__func__
def counting(cls, *a, **k):
    count["compiles"] += 1
    return orig(cls, *a, **k)
JF.MlirCompiler.compile = classmethod(counting)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Softmax(-1)).eval()
tm = translate(model, (torch.randn(2, 8, 64),), backend="reference", verify=False)
with rocm_compile_env("gfx942"):
    count["specializations"] = len(precompile(tm, backend="rocm"))
print(json.dumps(count))
"""


@pytest.mark.slow
def test_second_process_compiles_nothing(tmp_path):
    """FlyDSL's disk cache serves a new process: its specializations are traced, never compiled."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLYDSL_RUNTIME_CACHE_DIR=str(tmp_path / "flydsl"))
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["specializations"] == 3 and runs[0]["compiles"] == 3
    assert runs[1] == {"compiles": 0, "specializations": 3}


def test_rocm_path_records_device_launches_for_the_report():
    """On the rocm backend the launch path itself records each device launch (no sync, one list
    append), so report rows say flydsl-kernel there too, from launches, never from the name."""
    from translator import translate
    from translator.runtime.stub import rocm_compile_env
    from translator_kernels import launch

    torch.manual_seed(0)
    tm = translate(_Mlp().eval(), (torch.randn(2, 8, 64),), backend="reference", verify=False)
    assert not any(r.where == "flydsl-kernel" for r in tm.report.rows)
    tm.backend = "rocm"  # what translate(backend="rocm") picks on an AMD GPU
    with rocm_compile_env(tm.arch), launch.record_device_calls() as rec:
        tm(torch.randn(2, 8, 64))
    assert [n for n, _ in rec] == ["gemm", "row_norm", "softmax"]
    assert [r.kernel for r in tm.last_launches] == ["gemm", "row_norm", "softmax"]
    kernel_rows = {r.op for r in tm.report.rows if r.where == "flydsl-kernel"}
    assert {"aten.linear", "aten.layer_norm", "aten.softmax"} <= kernel_rows, \
        [(r.op, r.where, r.detail) for r in tm.report.rows]
