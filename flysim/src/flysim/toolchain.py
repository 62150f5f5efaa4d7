"""Make a FlyDSL compile work on a machine with no AMD GPU.

FlyDSL lowers all the way through ``gpu-module-to-binary`` only if it finds an
``ld.lld`` at ``$ROCM_PATH/llvm/bin/ld.lld``. flysim stops the pipeline well
before that, but the real compile (ISA statistics, ``flydsl-translate``) needs
it, so this module finds one and, when ROCM_PATH lacks it, builds a private
folder whose ``llvm/bin/ld.lld`` links to it. It is the repository's one ld.lld finder:
the translator's backend check and the ISA compile scripts call ``find_ld_lld`` /
``compile_env`` instead of looking themselves.
"""

from __future__ import annotations

import glob
import os
import shutil
import uuid
from pathlib import Path

from .errors import SimulationError

ARCHS = ("gfx942", "gfx950")
PRIVATE_ROOT = Path.home() / ".cache" / "flydsl-translator" / "rocm"


class ToolchainError(SimulationError):
    """No usable ld.lld was found."""


def find_ld_lld() -> str | None:
    """Return a path to an ld.lld, or None: PATH, Debian's llvm-* folders, $ROCM_PATH/llvm/bin."""
    rocm = os.environ.get("ROCM_PATH")
    if rocm and os.path.exists(os.path.join(rocm, "llvm", "bin", "ld.lld")):
        return os.path.join(rocm, "llvm", "bin", "ld.lld")
    on_path = shutil.which("ld.lld")
    if on_path:
        return on_path
    found = sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"), key=_llvm_version, reverse=True)
    if found:
        return found[0]
    if os.path.exists("/opt/rocm/llvm/bin/ld.lld"):
        return "/opt/rocm/llvm/bin/ld.lld"
    return None


def _llvm_version(path: str) -> int:
    try:
        return int(path.split("/usr/lib/llvm-")[1].split("/")[0])
    except (IndexError, ValueError):
        return 0


def _private_rocm(ld: str) -> str:
    link = PRIVATE_ROOT / "llvm" / "bin" / "ld.lld"
    link.parent.mkdir(parents=True, exist_ok=True)
    if os.path.realpath(link) != os.path.realpath(ld):
        # a link of a name of our own, renamed over: processes racing here (test workers) each
        # leave a whole link, never a missing one or a FileExistsError
        tmp = link.with_name(f".ld.lld.{uuid.uuid4().hex}")
        tmp.symlink_to(os.path.realpath(ld))
        os.replace(tmp, link)
    return str(PRIVATE_ROOT)


def compile_env(arch: str) -> dict:
    """The environment variables a GPU-less compile for ``arch`` needs (nothing is set)."""
    if arch not in ARCHS:
        raise ToolchainError(f"arch {arch!r} is not supported; flysim knows {', '.join(ARCHS)}")
    ld = find_ld_lld()
    if ld is None:
        raise ToolchainError(
            "no ld.lld found (looked on PATH, /usr/lib/llvm-*/bin, $ROCM_PATH/llvm/bin); "
            "FlyDSL needs one to compile kernels. Fix: `apt-get install lld-19`"
        )
    rocm = os.environ.get("ROCM_PATH")
    if not (rocm and os.path.exists(os.path.join(rocm, "llvm", "bin", "ld.lld"))):
        rocm = _private_rocm(ld)
    return {"ROCM_PATH": rocm, "COMPILE_ONLY": "1", "ARCH": arch, "FLYDSL_GPU_ARCH": arch}


def ensure_compile_env(arch: str = "gfx942") -> dict:
    """Set the compile environment for ``arch`` in os.environ; return the previous values."""
    new = compile_env(arch)
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    return old


def restore_env(old: dict) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
