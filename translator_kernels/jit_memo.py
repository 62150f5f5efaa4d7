"""Skip re-tracing a launcher whose exact specialization was already compiled.

FlyDSL's @flyc.jit traces the whole launcher on every call, before it looks at any cache
(the cache key is a hash of the traced IR). Under COMPILE_ONLY a call only compiles (and
stores the artifact); it runs nothing and returns None. So once a launcher has been called
with arguments of the same signature (tensor dtype / shape / strides / device type, scalar
type and value) under the same arch, calling it again can do nothing else than trace to
the same IR and hit the cache: we skip that call. The twelve identical blocks of a GPT-2
then trace each distinct kernel once instead of twelve times.

Across processes (a warm FLYDSL_RUNTIME_CACHE_DIR): a launcher made by a `@builder` leaves a
marker next to FlyDSL's artifacts, keyed by the builder and its arguments, the call signature,
a hash of every translator_kernels source, FlyDSL's toolchain key and the FLYDSL_* settings. A
later process skips the call when the marker names an artifact file that still exists.

Never skipped: a real launch (COMPILE_ONLY off), a flysim session (it patches
JitFunction.__call__ to interpret the kernel), IR/ASM dumping, or an argument of a type the
key does not understand.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import torch

_DONE: set = set()
_ORIGIN: dict = {}  # id(launcher) -> (launcher, "module.builder(args)") for launchers made by @builder
_DUMP_VARS = ("FLYDSL_DUMP_IR", "FLYDSL_DEBUG_DUMP_ASM", "FLYDSL_DUMP_ASM")
MARKERS = "translator_traced"  # subfolder of FLYDSL_RUNTIME_CACHE_DIR


def builder(fn):
    """functools.lru_cache for a launcher builder that also remembers how each launcher was made."""
    cached = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        launcher = cached(*args, **kwargs)
        if id(launcher) not in _ORIGIN:
            _ORIGIN[id(launcher)] = (launcher, f"{fn.__module__}.{fn.__qualname__}{(args, sorted(kwargs.items()))!r}")
        return launcher

    build.cache_info = cached.cache_info
    build.cache_clear = cached.cache_clear
    return build


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _plain_flydsl_call() -> bool:
    """True when JitFunction.__call__ is FlyDSL's own (flysim replaces it inside simulate())."""
    from flydsl.compiler import jit_function as JF

    fn = JF.JitFunction.__call__
    return getattr(fn, "__module__", None) == JF.__name__ and fn.__qualname__ == "JitFunction.__call__"


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return ("T", str(a.dtype), tuple(a.shape), tuple(a.stride()), a.device.type)
    if isinstance(a, (bool, int, float, str)) or a is None:
        return (type(a).__name__, a)
    raise TypeError  # unknown argument kind: do not memoize


def _key(launcher, args, kwargs):
    if kwargs or not _truthy("COMPILE_ONLY") or any(_truthy(v) for v in _DUMP_VARS):
        return None
    try:
        sig = tuple(_arg_key(a) for a in args)
    except TypeError:
        return None
    if not _plain_flydsl_call():
        return None
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("FLYDSL_") or k == "ARCH"))
    return (launcher, env, sig)


@functools.lru_cache(maxsize=1)
def _code_hash() -> str:
    """Every translator_kernels source and FlyDSL's own toolchain key: what a trace depends on."""
    from flydsl.compiler import jit_function as JF

    h = hashlib.sha256(JF._flydsl_key().encode())
    for p in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _marker(key) -> Path | None:
    launcher, env, sig = key
    origin = _ORIGIN.get(id(launcher))
    root = os.environ.get("FLYDSL_RUNTIME_CACHE_DIR", "")
    if origin is None or origin[0] is not launcher or not root or " at 0x" in origin[1]:
        return None
    text = repr((origin[1], env, sig, _code_hash()))
    return Path(root) / MARKERS / (hashlib.sha256(text.encode()).hexdigest() + ".json")


def _artifact(launcher) -> Path | None:
    """The disk artifact FlyDSL stored for the launcher's last compile, if it stored one."""
    from flydsl.compiler import jit_function as JF

    last, manager = getattr(launcher, "_last_compiled", None), getattr(launcher, "cache_manager", None)
    if not last or manager is None:
        return None
    path = Path(manager.cache_dir) / f"{JF._disk_cache_key(last[0])}.pkl"
    return path if path.is_file() else None


def call(launcher, *args, **kwargs):
    """`launcher(*args, **kwargs)`, skipped under COMPILE_ONLY when this exact call was compiled."""
    key = _key(launcher, args, kwargs)
    if key is not None and key in _DONE:
        return None
    marker = _marker(key) if key is not None else None
    if marker is not None:
        try:
            if Path(json.loads(marker.read_text())["artifact"]).is_file():
                _DONE.add(key)
                return None
        except (OSError, ValueError, KeyError, TypeError):
            pass
    result = launcher(*args, **kwargs)
    if key is not None:
        _DONE.add(key)
        art = _artifact(launcher) if marker is not None else None
        if art is not None:
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                tmp = marker.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"artifact": str(art)}))
                os.replace(tmp, marker)
            except OSError:
                pass
    return result
