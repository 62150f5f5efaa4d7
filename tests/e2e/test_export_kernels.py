"""translator.export_kernels / `convert --export-kernels`: an object file and a C header per kernel
specialization and a manifest; the headers compile against a small C caller and the objects
define every symbol the headers declare."""

import json
import re
import shutil
import subprocess

import torch

import translator

def setup_module():
    assert shutil.which("cc") and shutil.which("nm"), "no cc / nm: ./run setup installs gcc and binutils"


def _declared(header: str) -> list[str]:
    """Non-static functions and objects the header declares."""
    return re.findall(r"^(?:int32_t|extern const char) (\w+)[\(\[]", header, re.M)


def test_export_kernels_headers_compile_and_objects_define_symbols(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path / "flydsl"))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Softmax(-1)).eval()
    tm = translator.translate(model, (torch.randn(2, 8, 64),), backend="reference", verify=False)
    manifest = json.loads(translator.export_kernels(tm, tmp_path / "k").read_text())
    assert manifest["arch"] == "gfx942" and manifest["kernels"]
    flydsl_nodes = [n.name for n in tm.gm.graph.nodes if "flydsl" in n.meta]
    assert [n["node"] for n in manifest["nodes"]] == flydsl_nodes
    assert all(c["symbol"] in manifest["kernels"] for n in manifest["nodes"] for c in n["calls"])
    for sym, k in manifest["kernels"].items():
        header = (tmp_path / "k" / k["header"]).read_text()
        declared = _declared(header)
        assert sym in declared and f"{sym}__module_init" in declared
        caller = tmp_path / f"call_{sym}.c"
        caller.write_text(f'#include "{k["header"]}"\nint use(void **args) {{ return {sym}__module_init() ? -1 : '
                          f'{sym}(args); }}\nint main(void) {{ return 0; }}\n')
        subprocess.run(["cc", "-Wall", "-Werror", "-c", "-I", str(tmp_path / "k"), str(caller), "-o",
                        str(tmp_path / f"call_{sym}.o")], check=True, capture_output=True, text=True)
        nm = subprocess.run(["nm", "--defined-only", str(tmp_path / "k" / k["object"])], check=True,
                            capture_output=True, text=True).stdout
        defined = {line.split()[-1] for line in nm.splitlines() if line.split()[1:2] and line.split()[1] in "TRD"}
        assert set(declared) <= defined, f"{sym}: declared but not defined: {set(declared) - defined}"
        slots = k["arguments"]
        assert any(s["kind"] == "tensor_data" for s in slots) and slots[-1]["kind"] == "stream"


def test_cli_export_kernels(tmp_path, monkeypatch):
    from translator.frontends.cli import main

    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path / "flydsl"))
    script = tmp_path / "m.py"
    script.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                      "        return torch.softmax(x, -1)\n\ndef get_inputs():\n    return [torch.randn(4, 64)]\n\n"
                      "def get_init_inputs():\n    return []\n")
    code = main(["convert", str(script), "--backend", "reference", "--no-verify", "--out", str(tmp_path / "out"),
                 "--export-kernels", str(tmp_path / "k")])
    assert code == 0
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    (sym,) = manifest["kernels"]
    assert (tmp_path / "k" / f"{sym}.o").stat().st_size > 0 and sym.startswith("softmax_")
