"""Stage progress of a translation: capture -> passes -> (compile) -> verify.

translate() marks its stages with `stage(name)`; nothing listens by default, so the Python
API prints nothing. The CLI wraps its translate() call in `show_progress(True)`, which draws
a rich progress bar on the real stderr (only on a terminal, and not with --quiet or --json).
A stage that repeats (fallback_on_mismatch translates again) moves the bar back to it.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

STAGES = ("capture", "passes", "compile", "verify")
_listener: contextvars.ContextVar = contextvars.ContextVar("flydsl_translator_progress", default=None)


@contextlib.contextmanager
def stage(name: str):
    """Mark a stage of translate() (a no-op unless show_progress is active)."""
    listen = _listener.get()
    if listen is not None:
        listen(name, False)
    try:
        yield
    finally:
        if listen is not None:
            listen(name, True)


@contextlib.contextmanager
def show_progress(enabled: bool):
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)  # bound now: translate's own output may be redirected meanwhile
    columns = (SpinnerColumn(), TextColumn("{task.description:<10}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("capture", total=len(STAGES))

        def listen(name, done):
            i = STAGES.index(name) if name in STAGES else 0
            bar.update(task, description=name, completed=i + 1 if done else i)

        token = _listener.set(listen)
        try:
            yield
        finally:
            _listener.reset(token)
