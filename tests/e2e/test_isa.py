"""Per-kernel ISA statistics: the shared compile/parse module and the report's kernels list.

Parsing and the occupancy model are checked on a hand-written ISA snippet; compiling, the
child's per-job isolation and the cached-launcher retry on real GPU-less compiles; the report
on a small model translated with isa=True (terminal, Markdown, JSON, HTML, CLI --isa).
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from translator import translate
from translator.frontends import cli
from translator.report import isa as isa_report
from translator.report.html import render_html
from translator_kernels import isa

SNIPPET = """\
\t.text
my_kernel:
\ts_load_dwordx4 s[0:3], s[0:1], 0x0
\tbuffer_load_dwordx4 v[0:3], v4, s[8:11], 0 offen
\tbuffer_load_dword v5, v4, s[8:11], 0 offen lds
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]
\tv_add_f32_e32 v1, v2, v3
\tds_read_b128 v[0:3], v6
\tds_write_b64 v6, v[0:1]
\ts_waitcnt vmcnt(0)
\ts_barrier
\tglobal_store_short v[0:1], v2, off
\ts_endpgm
amdhsa.kernels:
  - .agpr_count:     4
    .group_segment_fixed_size: 16384
    .max_flat_workgroup_size: 256
    .name:           my_kernel
    .sgpr_count:     40
    .sgpr_spill_count: 0
    .vgpr_count:     130
    .vgpr_spill_count: 2
"""


def test_parse_isa_metadata_and_mix():
    (s,) = isa.parse_isa(SNIPPET, "gfx942")
    assert s.kernel == "my_kernel"
    assert s.meta == {"vgpr": 130, "agpr": 4, "sgpr": 40, "vgpr_spill": 2, "sgpr_spill": 0, "lds": 16384,
                      "block": 256}
    assert s.mix == {"SMEM": 1, "vmem_load": 2, "MFMA": 2, "VALU": 1, "LDS_read": 1, "LDS_write": 1, "wait": 1,
                     "barrier": 1, "vmem_store": 1, "SALU": 1}
    assert s.vmem_loads == {128: 1, "lds": 1} and s.vmem_stores == {16: 1}
    assert s.mnemonics("v_mfma") == ["v_mfma_f32_16x16x16_bf16"] and s.ops["v_mfma_f32_16x16x16_bf16"] == 2
    assert s.spills == 2
    # 130 VGPRs -> 136 -> 512 // 136 = 3 waves; LDS 64 KiB / 16 KiB = 4 workgroups of one wave per SIMD
    assert s.occupancy == (3, "VGPR")
    row = s.summary()
    assert row["waves/SIMD"] == 3 and row["limit"] == "VGPR" and row["spills (v/s)"] == "2/0"
    assert row["VMEM loads"] == "1x128 1xlds" and row["LDS r/w"] == "1/1"


def test_occupancy_rules():
    assert isa.occupancy(49, 14, 32, 256, "gfx942") == (8, "waves")
    assert isa.occupancy(40, 200, 0, 256, "gfx942") == (3, "SGPR")  # 200 -> 208 SGPRs: 800 // 208 = 3
    assert isa.occupancy(40, 20, 40000, 256, "gfx942") == (1, "LDS")
    assert isa.occupancy(40, 20, 40000, 256, "gfx950") == (4, "LDS")  # 160 KiB LDS on gfx950
    assert isa.occupancy(40, 20, 0, 512, "gfx942") == (8, "waves")  # 2 waves per SIMD per workgroup
    assert isa.occupancy(300, 20, 0, 512, "gfx942") == (0, "VGPR")  # 304 regs: 1 wave, not a whole 2-wave WG


def test_compile_many_isolates_jobs_and_retries_cached_launchers(monkeypatch):
    """One child runs every job: a failing job does not sink the others, and a job whose launcher the
    child already built (same softmax specialization, another M) is recompiled in a fresh child."""
    monkeypatch.delenv(isa.MEMO_ENV, raising=False)  # every job in the child, none from the session's memo
    x4, x8 = isa.TensorSpec((4, 512), "bfloat16"), isa.TensorSpec((8, 512), "bfloat16")
    jobs = [("translator_kernels.rows.softmax:softmax", (x4,), {}),
            ("translator_kernels.rows.softmax:no_such_entry", (), {}),
            ("translator_kernels.rows.softmax:softmax", (x8,), {})]
    first, bad, again = isa.compile_many(jobs, "gfx950")
    assert isinstance(bad, isa.IsaCompileError) and bad.error_type == "AttributeError"
    for c in (first, again):
        assert isinstance(c, isa.Compiled), c
        s = c.main
        assert s.arch == "gfx950" and s.meta["vgpr"] > 0 and s.spills == 0
        assert s.vmem_loads.get(128, 0) > 0 and s.mix["VALU"] > 0
    assert first.main.meta == again.main.meta


def test_compile_isa_raises_with_the_child_error():
    with pytest.raises(isa.IsaCompileError, match="KernelInputError"):
        isa.compile_isa("translator_kernels.rows.softmax:softmax", (isa.TensorSpec((4, 8), "float64"),), arch="gfx942")
    with pytest.raises(ValueError, match="gfx1100"):
        isa.compile_isa("translator_kernels.rows.softmax:softmax", (), arch="gfx1100")


def test_ld_lld_comes_from_flysim_toolchain_and_the_library_imports_without_flysim(monkeypatch):
    import os
    import subprocess
    import sys

    import flysim.toolchain
    from translator import runtime

    monkeypatch.setattr(flysim.toolchain, "find_ld_lld", lambda: None)  # the one finder: nothing else looks
    with pytest.raises(isa.IsaCompileError, match="lld-19"):
        isa.compile_env("gfx942", "unused")
    assert "no ld.lld" in runtime.flysim_available()
    code = ("import sys; sys.modules['flysim'] = None\n"
            "import translator_kernels.isa as isa, translator_kernels.gemm, translator_kernels.rows.softmax\n"
            "try:\n    isa.compile_env('gfx942', 'unused')\nexcept isa.IsaCompileError as e:\n    print('raised', e)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       env=dict(os.environ, PYTHONPATH=root))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "raised" in p.stdout and "flydsl-flysim" in p.stdout


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return torch.softmax(self.norm(self.b(torch.relu(self.a(x)))), -1)


def test_translate_isa_report(monkeypatch):
    isa_report.clear_cache()
    x = (torch.randn(2, 8, 64),)
    plain = translate(TwoLinears(), x, backend="reference", verify=False)
    assert plain.report.kernels == []
    assert "Per-kernel ISA statistics" not in render_html(plain.report)
    assert "ISA" not in plain.report.to_markdown()

    tm = translate(TwoLinears(), x, backend="reference", verify=False, isa=True, arch="gfx942")
    rows = tm.report.kernels
    ops = [r["op"] for r in rows]
    assert set(ops) == {"flydsl.gemm", "flydsl.layer_norm", "flydsl.softmax"}, rows
    assert ops.count("flydsl.gemm") == 2  # same shapes, but only the first carries the relu epilogue
    flydsl_nodes = [n.name for n in tm.gm.graph.nodes if "flydsl" in n.meta]
    assert sorted(n for r in rows for n in r["nodes"].split(", ")) == sorted(flydsl_nodes)
    for r in rows:
        assert "error" not in r, r
        assert r["VGPR"] > 0 and r["spills (v/s)"] == "0/0" and 1 <= r["waves/SIMD"] <= 8, r
        assert r["inputs"].startswith("2x8x64 float32"), r
    gemm = [r for r in rows if r["op"] == "flydsl.gemm"]
    assert all(r["MFMA"] > 0 for r in gemm)  # fp32 GEMM runs on MFMA (xf32 / f32 ops)

    md = tm.report.to_markdown()
    assert "## Per-kernel ISA statistics (gfx942" in md and "gemm_kernel" in md
    d = json.loads(tm.report.to_json())
    assert d["kernels"] == rows
    page = render_html(tm.report)
    assert "Per-kernel ISA statistics (gfx942)" in page and "<th>waves/SIMD</th>" in page

    # cached per specialization: a second translation compiles nothing
    def no_compile(*a, **k):
        raise AssertionError("compiled again")

    monkeypatch.setattr(isa_report, "compile_many", no_compile)
    again = translate(TwoLinears(), x, backend="reference", verify=False, isa=True, arch="gfx942")
    assert again.report.kernels == rows


def test_identical_specializations_share_a_row():
    class Twice(torch.nn.Module):
        def forward(self, x, y):
            return torch.softmax(x, -1) + torch.softmax(y, -1)

    tm = translate(Twice(), (torch.randn(4, 96), torch.randn(4, 96)), backend="reference", verify=False,
                   dynamic_shapes=None)
    specs = [s for s in isa_report.specializations(tm.gm) if s["family"] == "softmax"]
    assert len(specs) == 1 and len(specs[0]["nodes"]) == 2


def test_cli_isa_flag(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x, -1)

        def get_inputs():
            return [torch.randn(4, 256)]

        def get_init_inputs():
            return []
    """))
    out = tmp_path / "o"
    code = cli.main(["convert", str(script), "--backend", "reference", "--arch", "gfx950", "--isa", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    (k,) = json.loads((out / "report.json").read_text())["kernels"]
    assert k["op"] == "flydsl.softmax" and k["VGPR"] > 0
    assert "per-kernel ISA statistics (gfx950" in stdout
    assert "Per-kernel ISA statistics (gfx950)" in (out / "report.html").read_text()


def test_session_memo_returns_the_compile_without_a_child(monkeypatch, tmp_path):
    """With the memo on (tests/conftest.py sets it per session), an equal job reads the first compile's ISA
    through both child paths (compile_many, hotloop.compile_isa_texts) and starts no child; another child
    environment is another key."""
    from translator_kernels import hotloop

    monkeypatch.setenv(isa.MEMO_ENV, str(tmp_path))
    job = ("translator_kernels.rows.softmax:softmax", (isa.TensorSpec((4, 256), "float32"),), {})
    (first,) = isa.compile_many([job], "gfx942")
    assert len(list(tmp_path.iterdir())) == 1

    def no_child(*a, **k):
        raise AssertionError("a child started for a memoized job")

    monkeypatch.setattr(isa.subprocess, "run", no_child)
    monkeypatch.setattr(hotloop.subprocess, "run", no_child)
    (again,) = isa.compile_many([job], "gfx942")
    assert again.main.meta == first.main.meta and again.main.ops == first.main.ops
    texts = hotloop.compile_isa_texts(job[0], job[1], arch="gfx942")
    assert [s.meta for t in texts for s in isa.parse_isa(t, "gfx942")] == [k.meta for k in first.kernels]
    assert hotloop.compile_isa_texts_many([job], "gfx942") == [texts] == [first.texts]
    env = isa.compile_env("gfx942", "")
    assert isa.memo_key(job, "gfx942", env) != isa.memo_key(job, "gfx942", dict(env, FLYDSL_DEBUG="1"))
    assert isa.memo_key(job, "gfx950", env) != isa.memo_key(job, "gfx942", env)
    monkeypatch.setenv(isa.MEMO_ENV, "")
    assert isa.memo_key(job, "gfx942", env) is None
