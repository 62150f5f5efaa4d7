"""Scan family: `flydsl.scan(inputs, program, kind, dim, reverse, exclusive)`.

One node scans (cumsum / cumprod / logcumsumexp), along `dim` of the broadcast shape, the value
an elementwise `program` (the fused_elementwise format) computes from `inputs`; the kernel
(translator_kernels.codegen.scan) moves `dim` last, so every dim gives the right answer.

Forms matched (where they appear):
- ``torch.cumsum(x, d)`` / ``x.cumsum(d, dtype=...)`` (positions from attention masks in HF
  models, prefix sums in MoE routing, CDFs for top-p sampling), ``torch.cumprod`` (discount /
  survival products), ``torch.logcumsumexp`` (CTC / CRF style log-space prefix sums).
- reversed, ``x.flip(d).cumsum(d).flip(d)`` (returns-to-go, suffix sums): one reversed scan,
  no flipped copies.
- exclusive, ``torch.cumsum(x, d) - x`` (offsets, "tokens before this one"): one exclusive
  scan, free of the subtraction's cancellation.
- masked, ``torch.cumsum(x * mask, d)`` and any elementwise chain read only by the scan: the
  consumer rule `scan_prologue` (fold.py) folds the fused elementwise region into the scan's
  program, so the kernel reads x and the mask and writes only the scan.
Stays in PyTorch, with the reason: integer and bool inputs (torch scans them in int64),
float64, 0-d tensors, rows longer than one workgroup's unrolled tiles.
"""

from __future__ import annotations

import torch

from ..graph import aten, arg, single_user, size_hint, static_int, val
from ..registry import NO_MATCH, Match, OpFamily, Stage, register_family, rule
from ..runtime.ops import dispatch

from translator_kernels.program import DTYPES, TORCH, Program, parse  # noqa: E402
from translator_kernels.codegen.scan import max_row_length, ref_scan, row_vec  # noqa: E402


@torch.library.custom_op("flydsl::scan", mutates_args=())
def scan(inputs: list[torch.Tensor], program: str, kind: str, dim: int, reverse: bool,
         exclusive: bool) -> torch.Tensor:
    return dispatch("scan", inputs, program, kind, dim, reverse, exclusive)


@scan.register_fake
def _(inputs, program, kind, dim, reverse, exclusive):
    shape = torch.broadcast_shapes(*[t.shape for t in inputs])
    return inputs[0].new_empty(shape, dtype=TORCH[parse(program).out[0][1]])


def kernel_scan(inputs, program, kind, dim, reverse, exclusive):
    from translator_kernels.codegen.scan import scan as run

    return run(inputs, program, kind, dim, reverse, exclusive)


def _sample(dt):
    mask = torch.rand(4, 67) > 0.3
    prog = Program(2, (("mul", (0, 1), ()),), ((2, DTYPES[dt]),))  # masked cumsum
    return ([torch.randn(4, 67).to(dt), mask], prog.text(), "cumsum", -1, False, False)


register_family(OpFamily(
    name="scan",
    description="cumsum / cumprod / logcumsumexp along any dim (reversed, exclusive), with its fused "
                "elementwise prologue, as one generated kernel",
    reference=ref_scan, kernel=kernel_scan, kernel_entry="translator_kernels.codegen.scan:scan", sample_inputs=_sample,
    tolerance_overrides={torch.float32: (1e-5, 1e-5, "lane / wave / tile combine order differs from torch's "
                                         "sequential scan; logaddexp is a 1-ulp exp / log sequence")},
))


# --- aten scans ----------------------------------------------------------------------------

SCANS = {aten.cumsum.default: "cumsum", aten.cumprod.default: "cumprod", aten.logcumsumexp.default: "logcumsumexp"}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def scan_reason(node) -> str | None:
    """None when aten scan `node` can run as a flydsl.scan, else why not."""
    xv, out = val(arg(node, "self")), val(node)
    kind = SCANS[node.target]
    if not isinstance(xv, torch.Tensor):
        return "input is not a tensor with known metadata"
    if xv.dtype not in FLOATS:
        dt = str(xv.dtype).replace("torch.", "")
        why = "torch scans integer and bool inputs in int64" if not xv.dtype.is_floating_point else \
            "the kernels take float32, bfloat16, float16"
        return f"{kind} on {dt} input stays in PyTorch ({why})"
    if out.dtype not in FLOATS:
        return f"{kind} with result dtype {str(out.dtype).replace('torch.', '')} stays in PyTorch"
    if xv.dim() == 0:
        return f"{kind} of a 0-d tensor (nothing to scan)"
    n = size_hint(xv.shape[arg(node, "dim") % xv.dim()])
    limit = max_row_length(row_vec(n, (DTYPES[xv.dtype],)))
    if n > limit:
        return f"scanned dim of {n} elements exceeds one workgroup's {limit} (row scans are not split)"
    return None


def _emit(ctx, root, x, kind, dim, reverse, exclusive, lowering, sources):
    rank = len(val(x).shape)
    prog = Program(1, (), ((0, DTYPES[val(root).dtype]),)).text()
    return ctx.replace(root, "scan", lowering, ([x], prog, kind, dim % rank, reverse, exclusive), sources)


def scan_supported(node, ctx):
    return scan_reason(node)


@rule(Stage.CANONICAL, *SCANS, family="scan", supported=scan_supported,
      doc="cumsum / cumprod / logcumsumexp over any dim (float32 / bfloat16 / float16)")
def lower_scan(node, ctx):
    return _emit(ctx, node, arg(node, "self"), SCANS[node.target], arg(node, "dim"), False, False,
                 SCANS[node.target], [node])




# --- reversed: flip(scan(flip(x, d), d), d) ----------------------------------------------------

def _flip_dim(node):
    """The one dim a flip node flips (normalized), else None."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.flip.default):
        return None
    dims = arg(node, "dims")
    rank = len(val(node).shape)
    return dims[0] % rank if len(dims) == 1 and rank else None


def _reversed_parts(node):
    """(scan node, inner flip, x, dim) of the reversed-scan pattern ending at flip `node`, else None."""
    d = _flip_dim(node)
    s = arg(node, "self")
    if d is None or not (isinstance(s, torch.fx.Node) and s.target in SCANS) or single_user(s) is not node:
        return None
    f = arg(s, "self")
    if _flip_dim(f) != d or arg(s, "dim") % len(val(s).shape) != d or single_user(f) is not s:
        return None
    return s, f, arg(f, "self"), d


def reversed_supported(node, ctx):
    parts = _reversed_parts(node)
    if parts is None:
        return NO_MATCH
    return scan_reason(parts[0]) or Match(s=parts[0], f=parts[1], x=parts[2], d=parts[3])


@rule(Stage.PATTERN, aten.flip.default, family="scan", supported=reversed_supported, name="scan_reversed",
      doc="x.flip(d).cumsum(d).flip(d) (and cumprod / logcumsumexp) -> one reversed scan")
def lower_reversed(node, ctx, m):
    return _emit(ctx, node, m.x, SCANS[m.s.target], m.d, True, False, "scan_reversed", [node, m.s, m.f])




# --- exclusive: cumsum(x, d) - x ------------------------------------------------------------

def _exclusive_parts(node):
    if arg(node, "alpha") != 1:
        return None
    s, x = arg(node, "self"), arg(node, "other")
    if not (isinstance(s, torch.fx.Node) and s.target is aten.cumsum.default and arg(s, "self") is x):
        return None
    if single_user(s) is not node or arg(s, "dtype") is not None or val(node).shape != val(s).shape:
        return None
    if val(node).dtype != val(s).dtype:
        return None
    return s, x


def exclusive_supported(node, ctx):
    parts = _exclusive_parts(node)
    if parts is None:
        return NO_MATCH
    return scan_reason(parts[0]) or Match(s=parts[0], x=parts[1])


@rule(Stage.PATTERN, aten.sub.Tensor, family="scan", supported=exclusive_supported, name="scan_exclusive",
      doc="torch.cumsum(x, d) - x -> one exclusive scan")
def lower_exclusive(node, ctx, m):
    return _emit(ctx, node, m.x, "cumsum", arg(m.s, "dim"), False, True, "scan_exclusive", [node, m.s])
