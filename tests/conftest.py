"""Shared test set-up.

This checkout's packages go first on sys.path: the repository root (translator,
translator_kernels, bench, models) and flysim/src (flysim is its own distribution in
./flysim). pytest prepends each test file's folder, and an editable install elsewhere (or
a folder named like a package) would otherwise shadow them; with these first, `import
flysim`, `import translator` and `import translator_kernels` always mean this checkout's.
"""

import os
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
FLYSIM_SRC = str(Path(ROOT) / "flysim" / "src")  # flysim is its own distribution in ./flysim
for p in (FLYSIM_SRC, ROOT):
    if p in sys.path:
        sys.path.remove(p)
    sys.path.insert(0, p)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist (`-n N`) the N workers share the machine's cores: one torch thread each,
    # or N workers x torch's default of one thread per core oversubscribe it.
    import torch

    torch.set_num_threads(1)
