"""Shared test set-up.

The repository root goes first on sys.path. pytest puts a test file's folder on sys.path
(rootdir-relative "prepend" import mode), so tests/ lands ahead of the editable install's
finder, and the folder tests/flysim/ (no __init__.py) would then be imported as a
namespace package named `flysim`, shadowing the real flysim package: translate() then
reports "flysim has no simulate() yet". With the root first, `import flysim`,
`import translator` and `import translator_kernels` always mean this checkout's packages.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
