"""Fixtures of the kernel tests."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def without_translator(tmp_path_factory):
    """Environment for a subprocess in which `import translator` fails: what the kernel library emits
    (check scripts) must run with the kernel library, FlyDSL and torch alone."""
    block = tmp_path_factory.mktemp("no_translator")
    (block / "translator").mkdir()
    (block / "translator" / "__init__.py").write_text(
        'raise ImportError("kernel library code imported translator (it must run without it)")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(ROOT), str(ROOT / "flysim" / "src")])
    return env
