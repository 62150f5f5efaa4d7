"""Host code the generated kernel families share (elementwise, reduce, scan; emit reads their records).

- the kernel cache folder: generated sources are written there and imported (FlyDSL reads a
  kernel's source), so it must be a private folder of the user's;
- `write_source` / `load_launch`: one generated module in, its `launch` out;
- `current_arch`: the arch a launch is built for;
- `record_kernels` / `note_use`: which generated kernels a block of code launched (--emit-kernels
  writes exactly those).

Imports go one way: elementwise, reduce and scan import this module; emit imports them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import stat
import threading
from pathlib import Path

from translator_kernels.errors import KernelInputError, cache_error

from translator_kernels.arch import ARCHS as SUPPORTED_ARCHS  # noqa: E402
_RECORDERS = threading.local()  # per thread: the open record_kernels() sets


@contextlib.contextmanager
def record_kernels():
    """Collect the names of the generated kernels launched inside the block (this thread's)."""
    used: set = set()
    stack = _RECORDERS.__dict__.setdefault("stack", [])
    try:  # pushed inside the try: an interrupt right after the push takes it off again
        stack.append(used)
        yield used
    finally:
        stack[:] = [r for r in stack if r is not used]  # by identity: two equal sets are two recorders


def note_use(name: str) -> None:
    """Record `name` in the open record_kernels() sets, now and on each replay of a per-call replay."""
    from translator_kernels.replay import replay_effect

    replay_effect(_note_use, name)


def _note_use(name: str) -> None:
    for rec in getattr(_RECORDERS, "stack", ()):
        rec.add(name)


def cache_dir() -> Path:
    """The folder generated kernel sources are written to and imported from.

    Importing a file runs it, so the folder must be the user's alone: by default
    ~/.cache/flydsl-translator/kernels (or $XDG_CACHE_HOME/...), or FLYDSL_TRANSLATOR_KERNEL_CACHE.
    It is created 0700; one that is a symlink, owned by someone else, or writable by others is
    refused. Never a guessable folder in the shared temp directory."""
    d = os.environ.get("FLYDSL_TRANSLATOR_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "flydsl-translator", "kernels")
    return private_dir(Path(d))


def private_dir(p: Path) -> Path:
    """Create `p` (mode 0700) if missing and check it is a real folder only this user can write."""
    fix = ("point FLYDSL_TRANSLATOR_KERNEL_CACHE at a folder of your own (created 0700), or remove "
           f"{p} and let it be created again")
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(p)
    except OSError as e:  # a file in the way (FileExistsError, NotADirectoryError), no permission, ...
        raise cache_error(f"kernel cache {p} cannot be created ({e.strerror or e}); {fix}") from e
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise cache_error(f"kernel cache {p} is a symlink or not a folder; generated kernels are imported from "
                          f"it, so it must be a real folder of yours: {fix}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise cache_error(f"kernel cache {p} is owned by uid {st.st_uid}, not you; generated kernels are "
                          f"imported from it: {fix}")
    if st.st_mode & 0o022:
        os.chmod(p, 0o700)  # ours, but group/world-writable: close it before anything is imported
    return p


def write_source(src: str, name: str, registry: dict) -> Path:
    """Write a generated kernel module into the cache folder (atomically, only when it changed) and
    record it in `registry` (kernel name -> path) for emit_sources. Shared by the elementwise,
    reduction and scan generators."""
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(src)
            os.replace(tmp, path)
        except OSError as e:  # a full disk (ENOSPC), a quota, a folder made read-only since
            with contextlib.suppress(OSError):  # never leave a 0-byte or partial temporary file behind
                tmp.unlink(missing_ok=True)
            raise cache_error(f"cannot write the generated kernel {name} into the kernel cache {path.parent} "
                              f"({e.strerror or e}); free space there or point FLYDSL_TRANSLATOR_KERNEL_CACHE at "
                              "another folder of yours") from e
    registry[name] = str(path)
    return path


def load_launch(path: Path, prefix: str):
    """Import a generated kernel module and return its `launch` (a @flyc.jit launcher)."""
    spec = importlib.util.spec_from_file_location(f"{prefix}{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.launch


def current_arch() -> str:
    from translator_kernels.launch import arch as get_arch

    arch = get_arch()  # looked up once per target
    if arch not in SUPPORTED_ARCHS:
        raise KernelInputError(f"generated kernels: arch {arch!r} is not supported; expected one of {SUPPORTED_ARCHS} "
                               "(set FLYDSL_GPU_ARCH or run under flysim.simulate(arch=...))")
    return arch
