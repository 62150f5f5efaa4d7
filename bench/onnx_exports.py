"""The table of docs/onnx.md: every bundled model exported by both torch.onnx exporters, imported,
translated, and judged against ONNX Runtime.

    python -m bench.onnx_exports [--backend reference|flysim] [--opset N] [--zoo]

For each model and exporter: the ONNX ops the export emits, how many nodes were folded at import
(constant-only) and put together as attention (the exporters' SDPA decomposition), what the
translation holds (FlyDSL ops by family, ops left in PyTorch with their reason) and the verdict
against ONNX Runtime. Small shapes (tests/e2e/test_onnx_exporters.py's); measured, never edited.
`--zoo` adds the issue-32 scripts and HF tiny configs of tests/e2e/onnx_zoo.py.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import logging
import sys
import tempfile
import warnings
from pathlib import Path

import onnx
import torch

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def row(name, model, x, exporter, opset, backend, tmp: Path) -> str:
    import translator
    from translator.adapters.onnx_import import import_onnx

    path = tmp / f"{name}-{exporter}.onnx"
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = {"opset_version": opset} if exporter == "torchscript" else {}
            torch.onnx.export(model, x, str(path), dynamo=exporter == "dynamo", verbose=False, **kw)
    finally:
        logging.disable(logging.NOTSET)
    m = onnx.load(str(path))
    ops = sorted({n.op_type for n in m.graph.node})
    imported, _ = import_onnx(path, x)
    tm = translator.translate(path, x, backend=backend)
    fams = collections.Counter(n.meta["flydsl"]["family"] for n in tm.gm.graph.nodes if "flydsl" in n.meta
                               and n.target is not __import__("operator").getitem)
    kept = collections.Counter(f"{r.op} ({r.detail})" for r in tm.report.rows if r.where == "pytorch" and not r.layout)
    v = tm.report.verification
    worst = max((c.rms_rel for c in v.outputs), default=0.0)
    verdict = f"{'PASS' if v.passed else 'FAIL'} (RMS rel {worst:.1e})"
    return (f"| {name} | {exporter} {m.opset_import[0].version} | {len(m.graph.node)}: {', '.join(ops)} | "
            f"{imported.folded} folded, {imported.fused_attention} SDPA | "
            f"{', '.join(f'{k} ×{n}' for k, n in sorted(fams.items()))} | "
            f"{', '.join(f'{k} ×{n}' for k, n in sorted(kept.items())) or 'nothing'} | {verdict} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--opset", type=int, default=17, help="the TorchScript exporter's opset (dynamo picks its own)")
    ap.add_argument("--zoo", action="store_true")
    a = ap.parse_args(argv)
    tests = _load(REPO / "tests" / "e2e" / "test_onnx_exporters.py", "_onnx_exporters_tests")
    print("| model | exporter, opset | ONNX nodes: ops emitted | at import | FlyDSL ops | left in PyTorch | "
          "vs ONNX Runtime |")
    print("|---|---|---|---|---|---|---|")
    entries = [(n, lambda n=n: tests.load_small(n)) for n in tests.MODELS]
    if a.zoo:
        entries += [(n, lambda n=n: tests.build(n)) for n in sorted(tests.ZOO)]
    with tempfile.TemporaryDirectory() as d:
        for name, make in entries:
            for exporter in ("torchscript", "dynamo"):
                model, x = make()
                print(row(name, model, x, exporter, a.opset, a.backend, Path(d)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
