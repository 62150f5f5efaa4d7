"""flydsl-translate: exit codes, one-line errors, the files `convert` writes.

Most cases call `translator.frontends.cli.main(argv)` in-process (it returns the exit code);
a few run the installed console script, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from translator.frontends import cli

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
EXE = Path(sys.executable).parent / "flydsl-translate"

GOOD = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return self.fc(x)

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return [8]
"""


def write_script(tmp_path: Path, body: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def run_main(capsys, *argv) -> tuple:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    line = lines[0]
    assert line.startswith("flydsl-translate: error: "), line
    assert "Traceback" not in err
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


# Each case: script body (None = use the path as given), the words the error line must name.
BAD_SCRIPTS = {
    "syntax_error": ("def f(:\n    pass\n", ["syntax error", "model.py:1"]),
    "import_error": ("import not_a_real_module_xyz\n", ["failed to import", "not_a_real_module_xyz", "install"]),
    "raises_on_load": ("x = 1 / 0\n", ["ZeroDivisionError", "model.py:1", "while being loaded"]),
    "exits_on_load": ("import sys\nsys.exit(3)\n", ["sys.exit()", "__main__"]),
    "no_model": (GOOD.replace("class Model(", "class Net("), ["defines no `Model`", "class Model(torch.nn.Module)"]),
    "model_not_module": (GOOD + "\nModel = lambda n: None\n", ["not a torch.nn.Module subclass"]),
    "no_get_inputs": (GOOD.replace("def get_inputs(", "def make_inputs("), ["no `get_inputs()`", "def get_inputs():"]),
    "no_get_init_inputs": (
        GOOD.replace("def get_init_inputs(", "def init_args("),
        ["no `get_init_inputs()`", "def get_init_inputs():"],
    ),
    "get_init_inputs_raises": (
        GOOD + "\ndef get_init_inputs():\n    raise RuntimeError('no config')\n",
        ["get_init_inputs()", "RuntimeError: no config"],
    ),
    "get_init_inputs_not_list": (GOOD + "\ndef get_init_inputs():\n    return 8\n", ["returned int", "list"]),
    "model_ctor_raises": (
        GOOD + "\ndef get_init_inputs():\n    return [8, 9, 10]\n",
        ["Model(*get_init_inputs())", "TypeError", "arguments Model.__init__ takes"],
    ),
    "get_inputs_raises": (
        GOOD + "\ndef get_inputs():\n    raise ValueError('bad shape')\n",
        ["get_inputs()", "ValueError: bad shape"],
    ),
    "get_inputs_single_tensor": (GOOD + "\ndef get_inputs():\n    return torch.randn(4, 8)\n", ["single tensor", "[x]"]),
    "get_inputs_not_a_list": (GOOD + "\ndef get_inputs():\n    return None\n", ["returned NoneType", "list"]),
    "get_inputs_empty": (GOOD + "\ndef get_inputs():\n    return []\n", ["empty list"]),
    "get_inputs_string_item": (
        GOOD + "\ndef get_inputs():\n    return [torch.randn(4, 8), 'fast']\n",
        ["input 1 is a str", "get_init_inputs()"],
    ),
    "get_inputs_nested_list": (
        GOOD + "\ndef get_inputs():\n    return [[torch.randn(4, 8), torch.randn(4, 8)]]\n",
        ["input 0 is a list", "nested inputs are not supported"],
    ),
    "forward_rejects_inputs": (
        GOOD + "\ndef get_inputs():\n    return [torch.randn(4, 5)]\n",
        ["forward(*get_inputs())", "RuntimeError"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SCRIPTS))
def test_bad_script_exits_2_with_one_line(case, tmp_path, capsys):
    body, needles = BAD_SCRIPTS[case]
    script = write_script(tmp_path, body)
    modules_before = set(sys.modules)
    code, out, err = run_main(capsys, "convert", script, "--backend", "reference", "--out", tmp_path / "out")
    assert code == 2, (out, err)
    assert_one_error_line(err, *needles)
    assert not (tmp_path / "out").exists()
    # the script's private module is gone again
    assert not [m for m in set(sys.modules) - modules_before if m.startswith("_flydsl_translate_script_")]


def test_missing_file(tmp_path, capsys):
    code, _, err = run_main(capsys, "convert", tmp_path / "nope.py")
    assert code == 2
    assert_one_error_line(err, "nope.py", "no such file", "get_inputs()")


def test_not_a_python_file(tmp_path, capsys):
    path = tmp_path / "model.txt"
    path.write_text(GOOD)
    code, _, err = run_main(capsys, "convert", path)
    assert code == 2
    assert_one_error_line(err, "not a Python file", ".py")


def test_directory_is_not_a_script(tmp_path, capsys):
    code, _, err = run_main(capsys, "convert", tmp_path)
    assert code == 2
    assert_one_error_line(err, "is a directory")


@pytest.mark.parametrize(
    "option, value",
    [("--arch", "gfx90a"), ("--backend", "cuda"), ("--precision", "fp8")],
)
def test_invalid_option_value(option, value, tmp_path, capsys):
    script = write_script(tmp_path, GOOD)
    code, _, err = run_main(capsys, "convert", script, option, value)
    assert code == 2
    assert_one_error_line(err, option, repr(value), "convert --help")


def test_unknown_option_and_missing_argument(capsys):
    code, _, err = run_main(capsys, "convert", "--frobnicate")
    assert code == 2
    assert_one_error_line(err, "--frobnicate")
    code, _, err = run_main(capsys, "convert")
    assert code == 2
    assert_one_error_line(err, "Missing argument")


def test_out_is_a_file(tmp_path, capsys, monkeypatch):
    import translator.api

    monkeypatch.setattr(translator.api, "translate", fake_translate(passed=True), raising=False)
    script = write_script(tmp_path, GOOD)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    code, _, err = run_main(capsys, "convert", script, "--out", blocker)
    assert code == 2
    assert_one_error_line(err, "--out", "is a file")


def test_debug_shows_traceback(tmp_path, capsys):
    script = write_script(tmp_path, GOOD + "\ndef get_inputs():\n    raise ValueError('bad shape')\n")
    code, _, err = run_main(capsys, "convert", script, "--debug")
    assert code == 2
    assert "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("flydsl-translate: error: get_inputs()")


def test_version(capsys):
    code, out, _ = run_main(capsys, "--version")
    assert code == 0
    assert out.startswith("flydsl-translate 0.1.0") and "flydsl 0.5.0" in out


# ---------------------------------------------------------------- the translate() side, with a stand-in
# These check the CLI's plumbing (arguments passed, files written, exit codes per error class)
# without depending on the translator core; the real run is test_convert_mlp_reference.


class FakeReport:
    def __init__(self, passed):
        self.verification = SimpleNamespace(passed=passed)

    def render(self):
        return "FAKE REPORT TABLE"

    def to_markdown(self):
        return "# fake report\n"

    def to_json(self):
        return json.dumps({"fake": True})


def fake_translate(passed=True, raises=None, calls=None):
    def translate(model, inputs, **options):
        if calls is not None:
            calls.append((model, inputs, options))
        if raises is not None:
            raise raises
        return SimpleNamespace(report=FakeReport(passed), code="# translated graph\n")

    return translate


def test_options_reach_translate(tmp_path, capsys, monkeypatch):
    import torch

    import translator.api

    calls = []
    monkeypatch.setattr(translator.api, "translate", fake_translate(calls=calls), raising=False)
    script = write_script(tmp_path, GOOD)
    out = tmp_path / "o"
    code, stdout, err = run_main(
        capsys, "convert", script, "--arch", "gfx950", "--backend", "flysim", "--precision", "bf16",
        "--out", out, "--strict", "--no-verify", "--fallback-on-mismatch",
    )
    assert code == 0, err
    (model, inputs, options), = calls
    assert options == dict(
        arch="gfx950", backend="flysim", precision="bf16", verify=False, strict=True, fallback_on_mismatch=True,
        name="model",
    )
    assert not model.training
    torch.manual_seed(0)
    assert torch.equal(model.fc.weight, torch.nn.Linear(8, 8).weight)  # built right after manual_seed(0)
    assert len(inputs) == 1 and inputs[0].shape == (4, 8)
    assert "FAKE REPORT TABLE" in stdout
    assert (out / "report.md").read_text() == "# fake report\n"
    assert json.loads((out / "report.json").read_text()) == {"fake": True}
    assert (out / "translated.py").read_text() == "# translated graph\n"


def test_default_out_dir(tmp_path, capsys, monkeypatch):
    import translator.api

    monkeypatch.setattr(translator.api, "translate", fake_translate(), raising=False)
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, GOOD, name="tiny_net.py")
    code, _, err = run_main(capsys, "convert", script)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out" / "tiny_net").iterdir()) == [
        "report.json",
        "report.md",
        "translated.py",
    ]


def test_failed_verification_exits_1_and_still_writes(tmp_path, capsys, monkeypatch):
    import translator.api

    monkeypatch.setattr(translator.api, "translate", fake_translate(passed=False), raising=False)
    script = write_script(tmp_path, GOOD)
    code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert code == 1
    assert_one_error_line(err, "verification failed", "report.md", "--fallback-on-mismatch")
    assert (tmp_path / "o" / "report.md").exists()


@pytest.mark.parametrize(
    "error_name, expected_code",
    [("InputError", 2), ("StrictError", 2), ("BackendError", 2), ("CaptureError", 2)],
)
def test_translator_errors_map_to_exit_codes(error_name, expected_code, tmp_path, capsys, monkeypatch):
    import translator.api
    from translator import errors

    exc = getattr(errors, error_name)("the reason; the fix")
    monkeypatch.setattr(translator.api, "translate", fake_translate(raises=exc), raising=False)
    script = write_script(tmp_path, GOOD)
    code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert code == expected_code
    assert_one_error_line(err, "the reason; the fix")


def test_internal_error_exits_3(tmp_path, capsys, monkeypatch):
    import translator.api

    monkeypatch.setattr(translator.api, "translate", fake_translate(raises=KeyError("oops")), raising=False)
    script = write_script(tmp_path, GOOD)
    code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert code == 3
    assert "internal error: KeyError" in err and "--debug" in err and "Traceback" not in err


# ---------------------------------------------------------------- the real thing


def test_convert_mlp_reference(tmp_path, capsys):
    out = tmp_path / "mlp"
    code, stdout, err = run_main(capsys, "convert", MODELS / "mlp.py", "--backend", "reference", "--out", out)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md", "translated.py"]
    assert json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().strip()
    compile((out / "translated.py").read_text(), "translated.py", "exec")  # readable *and* valid Python
    assert str(out / "report.md") in stdout


def test_ops_lists_supported_ops(capsys):
    code, out, _ = run_main(capsys, "ops")
    assert code == 0
    assert out.lstrip().startswith("|") and "flydsl." in out


def test_console_script_bad_input_and_version(tmp_path):
    assert EXE.exists(), f"{EXE} missing: install the project (pip install -e .)"
    script = write_script(tmp_path, GOOD.replace("def get_inputs(", "def make_inputs("))
    proc = subprocess.run([str(EXE), "convert", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr, "no `get_inputs()`")
    proc = subprocess.run([str(EXE), "convert", str(script), "--arch", "gfx1100"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr, "--arch", "gfx1100")
    proc = subprocess.run([str(EXE), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("flydsl-translate ")


def test_version_and_help_start_without_torch():
    """`import translator` imported torch (and the translator's core), so `--version` and `--help`
    took ~5 s (~20 s on a loaded host); the API names are now imported on first use."""
    code = ("import sys; from translator.frontends.cli import main; "
            "codes = [main(a.split()) for a in ('--version', '--help', 'convert --help')]; "
            "print('CODES', codes, 'LOADED', sorted(m for m in ('torch', 'flydsl', 'translator.api') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "flydsl-translate 0.1.0" in proc.stdout and "Usage: flydsl-translate" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "CODES [0, 0, 0] LOADED []", proc.stdout


def test_script_may_import_its_siblings(tmp_path, capsys, monkeypatch):
    import translator.api

    monkeypatch.setattr(translator.api, "translate", fake_translate(), raising=False)
    (tmp_path / "flydsl_cli_test_sibling_layers.py").write_text("import torch.nn as nn\nWIDTH = 8\nLayer = nn.Linear\n")
    script = write_script(
        tmp_path,
        GOOD.replace("import torch.nn as nn", "import torch.nn as nn\nfrom flydsl_cli_test_sibling_layers import WIDTH"),
    )
    path_before = list(sys.path)
    code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert code == 0, err
    assert sys.path == path_before
    sys.modules.pop("flydsl_cli_test_sibling_layers", None)


EMIT_SCRIPT = '''
import torch, torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) * y + 1.5


def get_inputs():
    return [torch.randn(4, 64), torch.randn(4, 64)]


def get_init_inputs():
    return []
'''


def test_emit_kernels_writes_generated_sources_with_checks(tmp_path, capsys):
    import torch

    import translator.api

    class Other(torch.nn.Module):  # generates another kernel in this process first: it must not be emitted
        def forward(self, x):
            return torch.tanh(x) - 2.0

    translator.translate(Other(), (torch.randn(8, 32),), backend="flysim")
    script = tmp_path / "chain.py"
    script.write_text(EMIT_SCRIPT)
    kdir = tmp_path / "kernels"
    code, stdout, err = run_main(capsys, "convert", script, "--backend", "flysim", "--out", tmp_path / "o",
                                 "--emit-kernels", kdir)
    assert code == 0, err
    gen = sorted(p.name for p in kdir.glob("fused_elementwise_*.py"))
    assert len(gen) == 1 and (kdir / f"check_{gen[0]}").exists()
    index = (kdir / "KERNELS.md").read_text()
    assert "flydsl.fused_elementwise" in index and gen[0] in index
    assert "@flyc.kernel" in (kdir / gen[0]).read_text()
    assert str((kdir / "KERNELS.md").resolve()) in (tmp_path / "o" / "report.md").read_text()  # the report links them


# ---------------------------------------------------------------- output modes, capture failures, help


CONTROL_FLOW = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: no capture method takes it
            return x * 2
        return x - 1

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return []
"""

SCALAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, A, s):
        return A * s

def get_inputs():
    return [torch.randn(16, 32), 3.5]

def get_init_inputs():
    return []
"""


def test_capture_failure_is_one_line_and_the_graph_dump_only_with_debug(tmp_path, capsys):
    script = write_script(tmp_path, CONTROL_FLOW)
    code, out, err = run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert code == 2 and out == ""
    assert_one_error_line(err, "CaptureError", "could not capture the model", "symbolic_trace")
    code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o", "--debug")
    assert code == 2 and "def forward" in err and "Traceback" in err


def test_out_is_checked_before_the_work(tmp_path, capsys, monkeypatch):
    import translator.api

    calls = []
    monkeypatch.setattr(translator.api, "translate", fake_translate(calls=calls), raising=False)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    code, _, err = run_main(capsys, "convert", write_script(tmp_path, GOOD), "--out", blocker / "sub" / "dir")
    assert code == 2 and calls == []
    assert_one_error_line(err, "--out", "is a file", "cannot be created")


def test_json_puts_only_the_report_on_stdout(tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, err = run_main(capsys, "convert", MODELS / "mlp.py", "--backend", "reference", "--out", out, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["model"] == "mlp" and report["rows"] and report["summary"]["compute_nodes"] > 0
    assert json.loads((out / "report.json").read_text()) == report


def test_quiet_prints_nothing_and_still_writes(tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, err = run_main(capsys, "convert", MODELS / "mlp.py", "--backend", "reference", "--out", out, "-q")
    assert code == 0 and stdout == "" and err == ""
    assert (out / "report.md").exists() and (out / "report.html").exists()


def test_scalar_inputs_are_accepted_as_by_the_python_api(tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, err = run_main(capsys, "convert", write_script(tmp_path, SCALAR), "--backend", "reference",
                                 "--out", out, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["verification"]["passed"] and "flydsl.fused_elementwise" in report["summary"]["flydsl_ops"]


def test_progress_bar_only_on_a_terminal_and_never_with_quiet_or_json(tmp_path, capsys, monkeypatch):
    import translator.api
    from translator import progress

    seen = []
    real = progress.show_progress
    monkeypatch.setattr(progress, "show_progress", lambda enabled: (seen.append(enabled), real(False))[1])
    monkeypatch.setattr(translator.api, "translate", fake_translate(), raising=False)
    script = write_script(tmp_path, GOOD)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    for flags, want in (([], True), (["--quiet"], False), (["--json"], False)):
        if "--json" in flags:
            monkeypatch.setattr(FakeReport, "to_json", lambda self: "{}", raising=False)
        code, _, err = run_main(capsys, "convert", script, "--out", tmp_path / "o", *flags)
        assert code == 0, err
        assert seen.pop() is want, flags
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    run_main(capsys, "convert", script, "--out", tmp_path / "o")
    assert seen.pop() is False


def test_translate_reports_its_stages_in_order():
    import torch

    import translator.api
    from translator import progress

    stages = []
    token = progress._listener.set(lambda name, done: stages.append((name, done)))
    try:
        translator.translate(torch.nn.Linear(8, 8), (torch.randn(2, 8),), backend="reference")
    finally:
        progress._listener.reset(token)
    assert stages == [("capture", False), ("capture", True), ("passes", False), ("passes", True),
                      ("verify", False), ("verify", True)]
    with progress.show_progress(True):  # draws on a non-terminal stderr without failing
        with progress.stage("capture"):
            pass


def test_python_m_translator_and_help_at_80_columns(capsys, monkeypatch):
    """`python -m translator` runs cli.main (one child process); the help pages it prints at
    COLUMNS=80 are rendered by that same main in-process (a child each would cost a Python + torch
    start; their text is the same byte for byte)."""
    monkeypatch.setenv("COLUMNS", "80")
    proc = subprocess.run([sys.executable, "-m", "translator", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("flydsl-translate ")
    for args in (["--help"], ["convert", "--help"]):
        code, out, err = run_main(capsys, *args)
        assert code == 0, err
        lines = out.splitlines()
        assert max(map(len, lines)) <= 80, [ln for ln in lines if len(ln) > 80]
        assert "Exit codes" in out and "Example" in out
    assert "3  internal error" in out and "--json" in out and "--quiet" in out


# ---- no false success: exits in the user's code, stdout of --json, output folders as root ----------

EXITS = {
    "get_inputs": GOOD.replace("    return [torch.randn(4, 8)]", "    import sys\n    sys.exit(0)"),
    "get_init_inputs": GOOD.replace("    return [8]", "    raise SystemExit(0)"),
    "forward": GOOD.replace("        return self.fc(x)", "        import sys\n        sys.exit(0)"),
}


@pytest.mark.parametrize("where", sorted(EXITS))
def test_an_exit_in_the_users_code_is_exit_2_saying_where(where, tmp_path, capsys):
    """sys.exit(0) in get_inputs() or forward ended the command with exit 0, no files, no message."""
    script = write_script(tmp_path, EXITS[where])
    code, out, err = run_main(capsys, "convert", script, "--backend", "reference", "--out", tmp_path / "o")
    assert code == 2
    line = assert_one_error_line(err, f"{where}" if where != "forward" else "forward", "sys.exit(0)", "model.py:")
    assert not (tmp_path / "o" / "report.json").exists(), line


def test_an_exit_inside_translate_is_exit_2(tmp_path, capsys, monkeypatch):
    from translator import api

    def exiting(*a, **k):
        raise SystemExit(0)

    monkeypatch.setattr(api, "translate", exiting)
    code, _, err = run_main(capsys, "convert", write_script(tmp_path, GOOD), "--out", tmp_path / "o")
    assert code == 2
    assert_one_error_line(err, "translate()", "sys.exit(0)")


def test_json_stdout_is_only_json_when_the_script_prints(tmp_path, capsys):
    noisy = GOOD.replace("def get_inputs():\n", "print('loading the model')\n\ndef get_inputs():\n    print('hi')\n")
    noisy = noisy.replace("        return self.fc(x)", "        print('forward')\n        return self.fc(x)")
    code, stdout, err = run_main(capsys, "convert", write_script(tmp_path, noisy), "--backend", "reference",
                                 "--out", tmp_path / "o", "--json")
    assert code == 0, err
    assert json.loads(stdout)["model"] == "model"
    assert "loading the model" in err and "hi" in err


@pytest.mark.parametrize("option", ["--out", "--emit-kernels", "--export-kernels"])
def test_output_folders_are_created_before_the_work_even_as_root(option, tmp_path, capsys, monkeypatch):
    """os.access says yes to root for any path; /proc refuses a new folder to root too."""
    import translator

    calls = []
    monkeypatch.setattr(translator, "translate", fake_translate(calls=calls), raising=False)
    extra = [] if option == "--out" else ["--out", tmp_path / "o"]
    code, _, err = run_main(capsys, "convert", write_script(tmp_path, GOOD), *extra, option, "/proc/flydsl_nope/k")
    assert code == 2 and calls == []
    assert_one_error_line(err, option, "cannot be created")
