"""The report's main table in a terminal, fitted to the terminal's width.

The width is shutil.get_terminal_size's ($COLUMNS, else the tty, else 120 columns for a log).
Op names, places ("runs on") and FLOPs stay whole: they are what a reader scans. Node, shapes
and detail wrap inside their columns (detail gets the largest share of the spare width). When
the terminal is too narrow for a dtype column, the dtype joins the shapes cell; narrower still,
the node column goes (report.md and report.json keep it). Below the narrowest table that still
reads (whole columns plus MIN_WRAPPED characters a line for each wrapped one) the table is drawn
at that width and the terminal wraps its lines: the op names are never cut. A shape that holds a dynamic dim (names.DYNAMIC_DIM, e.g. 2*x16*x128) adds a
one-line legend under the table, since only report.md explained the mark before.
"""

from __future__ import annotations

import shutil

from .names import DYNAMIC_DIM

COLUMNS = ("node", "op", "shapes", "dtype", "runs on", "detail", "FLOPs")
# narrower terminals: the dtype joins the shapes, then the node names go (report.md keeps them)
LAYOUTS = (COLUMNS, tuple(c for c in COLUMNS if c != "dtype"), ("op", "shapes", "runs on", "detail", "FLOPs"))
WRAPPED = {"node": 1, "shapes": 2, "detail": 3}  # the columns that wrap, and their share of the spare width
MIN_WRAPPED = 12  # the fewest characters a line a wrapped column keeps
SPARE = 20  # a wider layout is taken only when it leaves this many more columns to the wrapped ones
STYLE = {"flydsl-kernel": "green", "flydsl-reference": "yellow", "flydsl-op": "cyan", "pytorch": "white",
         "folded": "blue", "removed": "dim"}


def light_table(**kw):
    """A rich Table with a rule under the header and two spaces between columns (no frame)."""
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, **kw)


def terminal_width() -> int:
    return shutil.get_terminal_size(fallback=(120, 24)).columns


def main_table(rows: list, title: str, width: int):
    """(rich Table, the width to draw it at) for the report's non-layout rows: `width` or, when
    that is narrower than the table can read, the narrowest readable width."""
    from rich.markup import escape

    full = [(r.node, r.op, r.shapes, r.dtype, r.where, r.detail, f"{r.flops:,}") for r in rows]
    for cols in LAYOUTS:  # the first that leaves SPARE columns to wrap in, else the narrowest
        cells = [_cells(cols, c) for c in full]
        if width >= _narrowest(cols, cells) + (SPARE if cols != LAYOUTS[-1] else 0):
            break
    t = _table(title, cols, _widths(cols, cells))
    for r, c in zip(rows, cells):
        t.add_row(*map(escape, c), style=STYLE[r.where])
    return t, max(width, _narrowest(cols, cells))


def _cells(cols, row) -> tuple:
    """A row's cells under `cols`; without a dtype column the dtype follows the shapes."""
    by = dict(zip(COLUMNS, row))
    if "dtype" not in cols:
        by["shapes"] = f"{by['shapes']} {by['dtype']}".rstrip()
    return tuple(by[c] for c in cols)


def dynamic_legend(rows: list, dynamic_dims: list) -> str:
    """One line that says what * in a shape means, or "" when no shown shape has a dynamic dim."""
    if not any(DYNAMIC_DIM.search(r.shapes) for r in rows):
        return ""
    dims = f" ({', '.join(f'input {i} dim {d}' for i, d in dynamic_dims)})" if dynamic_dims else ""
    return f"* after a size: a dynamic dim{dims}, shown at its example size"


def _widths(cols, cells) -> list:
    return [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(cols)]


def _table(title: str, cols, widths):
    t = light_table(title=title)
    for col, w in zip(cols, widths):
        if col in WRAPPED:
            t.add_column(col, overflow="fold", ratio=WRAPPED[col], min_width=min(w, MIN_WRAPPED))
        else:
            t.add_column(col, no_wrap=True, min_width=w, justify="right" if col == "FLOPs" else "left")
    return t


def _narrowest(cols, cells) -> int:
    """The whole columns at their widest cell, the wrapped ones at MIN_WRAPPED, plus the frame
    (rule and padding: measured on a table of one-character cells under the same headers)."""
    from rich.console import Console
    from rich.measure import Measurement

    probe = _table("", cols, [1] * len(cols))
    probe.add_row(*"x" * len(cols))
    console = Console(width=1000)
    frame = Measurement.get(console, console.options, probe).maximum - sum(map(len, cols))
    return frame + sum(min(w, MIN_WRAPPED) if c in WRAPPED else w for c, w in zip(cols, _widths(cols, cells)))
