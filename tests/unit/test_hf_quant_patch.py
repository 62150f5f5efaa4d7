"""translator.adapters.hf_quant.captured_quant_layers points transformers' fp8_linear at our custom op
for one forward: an interrupt (Ctrl-C) at any line of it must leave HF's own function in place."""

import ast
import sys
import types
from pathlib import Path

from translator.adapters import hf_quant


def _finally_lines():
    tree = ast.parse(Path(hf_quant.__file__).read_text())
    return {line for node in ast.walk(tree) if isinstance(node, ast.Try)
            for stmt in node.finalbody for line in range(stmt.lineno, stmt.end_lineno + 1)}


def _run_interrupted_at(at, skip):
    count = 0

    def tracer(frame, event, arg):
        if frame.f_globals.get("__name__") != hf_quant.__name__:
            return None

        def line(frame, event, arg):
            nonlocal count
            if event == "line" and frame.f_lineno not in skip:
                count += 1
                if count == at:
                    raise KeyboardInterrupt
            return line
        return line

    sys.settrace(tracer)
    try:
        with hf_quant.captured_quant_layers():
            pass
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def test_an_interrupt_at_any_line_restores_hfs_fp8_linear(monkeypatch):
    def original(*a, **k):
        return None

    fake = types.ModuleType(hf_quant.HF_FP8_MODULE)
    fake.fp8_linear = original
    monkeypatch.setitem(sys.modules, hf_quant.HF_FP8_MODULE, fake)
    skip, at = _finally_lines(), 1
    while _run_interrupted_at(at, skip):
        assert fake.fp8_linear is original, f"interrupt at line event {at} left fp8_linear patched"
        assert not hasattr(fake, "_flydsl_original_fp8_linear"), at
        at += 1
    assert at > 3  # the interrupts reached the patching lines, then one uninterrupted run
    assert fake.fp8_linear is original

