"""The gpt-fast-style decoder of the unit tests: models/_static_cache_decoder.py (the one copy in the
tree), loaded by path (models/ is no package) and re-exported: `build(n_layer)`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "models" / "_static_cache_decoder.py"
_spec = importlib.util.spec_from_file_location("_unit_static_cache_decoder", _PATH)
decoder = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = decoder
_spec.loader.exec_module(decoder)

build = decoder.build
