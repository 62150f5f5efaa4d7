"""flysim's own tests: this distribution's source first on sys.path, then the kernels beside them."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parent / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)


def pytest_ignore_collect(collection_path, config):
    """test_upstream.py runs FlyDSL's own kernels: only where FLYDSL_SRC names a FlyDSL checkout."""
    import os

    if collection_path.name == "test_upstream.py" and not os.environ.get("FLYDSL_SRC"):
        return True
    return None
