"""The ONNX op table: each standard op as a line or two of torch (`OPS`), for `onnx_import.ONNXModel`.

Values are tensors, or Python ints / int lists for shape arithmetic (Shape, Gather of a shape,
Concat of sizes, Range bounds): Reshape / Expand / Slice / Tile then take plain int lists and a
dynamic dim stays symbolic through torch.export. An elementwise op on two such values runs in
Python; a unary math op, or anything mixing them with tensors, makes a tensor of them first.
Each op takes the node (`n.attrs`, `n.name`) and its inputs in order ("" inputs as None).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import InputError

DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
          9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}
SMALL_INT = 64  # integer constants up to this many elements are kept as Python ints

# ---- values: tensors, or Python ints / int lists (shapes, axes) ---------------------------------
def _is_ints(v) -> bool:
    return isinstance(v, (int, torch.SymInt)) or (isinstance(v, list) and all(isinstance(e, (int, torch.SymInt))
                                                                                 for e in v))


def _t(v):
    """A value as a tensor (int lists become int64 tensors, float lists float32)."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, float) or (isinstance(v, list) and v and any(isinstance(e, float) for e in v)):
        return torch.tensor(v, dtype=torch.float32)
    if isinstance(v, list) and any(isinstance(e, torch.SymInt) for e in v):
        return torch.stack([torch.as_tensor(e) for e in v]) if v else torch.zeros(0, dtype=torch.int64)
    return torch.tensor(v, dtype=torch.int64)


def _ints(v, what="value") -> list:
    """A value that must be a list of ints (a shape, axes)."""
    if isinstance(v, (int, torch.SymInt)):
        return [v]
    if isinstance(v, list):
        return v
    raise InputError(f"ONNX import: {what} is computed from tensor data at run time ({tuple(v.shape)}), "
                     "which the importer cannot turn into a static shape")


def _is_py(v) -> bool:
    """A Python number or list of them (shape arithmetic, and a scale computed from a head size)."""
    return _is_ints(v) or isinstance(v, float) or (isinstance(v, list) and all(isinstance(e, (int, float, torch.SymInt))
                                                                                 for e in v))


def _ew(fn):
    """Elementwise op; on Python values (shape arithmetic) it runs in Python."""
    def run(n, a, b):
        if _is_py(a) and _is_py(b):
            if isinstance(a, list) or isinstance(b, list):
                la, lb = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
                m = max(len(la), len(lb))
                la, lb = (la * m if len(la) == 1 else la), (lb * m if len(lb) == 1 else lb)
                return [fn(x, y) for x, y in zip(la, lb)]
            return fn(a, b)
        return fn(_scalar_or_t(a), _scalar_or_t(b))
    return run


def _scalar_or_t(v):
    return v if isinstance(v, (float, int, torch.SymInt, torch.Tensor)) else _t(v)


def _div(a, b):
    if isinstance(a, (int, torch.SymInt)) and isinstance(b, (int, torch.SymInt)):
        return a // b
    def integral(v):
        return isinstance(v, int) or (isinstance(v, torch.Tensor) and not v.is_floating_point())

    if integral(a) and integral(b):
        return torch.div(a, b, rounding_mode="trunc")
    return a / b


def _axes(n, args, pos=1):
    """Axes from the input at `pos` (opset >= 13/18) or the `axes` attribute."""
    if len(args) > pos and args[pos] is not None:
        return _ints(args[pos], "axes")
    return list(n.attrs.get("axes", []))


def _reshape(n, x, shape):
    shape = list(_ints(shape, "Reshape shape"))
    if not n.attrs.get("allowzero", 0):
        shape = [x.shape[i] if isinstance(s, int) and s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _slice(n, x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts, "starts"), _ints(ends, "ends")
    axes = _ints(axes, "axes") if axes is not None else list(range(len(starts)))
    steps = _ints(steps, "steps") if steps is not None else [1] * len(starts)
    if isinstance(x, list):
        (s, e, st), = zip(starts, ends, steps)
        return x[slice(s, e if e < 2 ** 62 else None, st)]
    idx = [slice(None)] * x.dim()
    for s, e, a, st in zip(starts, ends, axes, steps):
        if isinstance(st, int) and st < 0:
            raise InputError(f"ONNX import: Slice with negative step {st} (a flip) is not supported (node {n.name})")
        big = isinstance(e, int) and e >= 2 ** 62
        idx[a] = slice(s, None if big else e, None if st == 1 else st)
    return x[tuple(idx)]


def _gather(n, data, idx):
    axis = n.attrs.get("axis", 0)
    if isinstance(data, list):
        return [data[i] for i in idx] if isinstance(idx, list) else data[idx]
    if _is_ints(idx) and not isinstance(idx, list):
        return data.select(axis, idx)
    i = _t(idx)
    if axis == 0 and data.dim() == 2 and data.is_floating_point() and not i.is_floating_point():
        return F.embedding(i, data)
    return torch.index_select(data, axis, i.flatten()).reshape(*data.shape[:axis], *i.shape, *data.shape[axis + 1:])


def _flatten(n, x):
    """ONNX Flatten: always 2-D, (prod(dims[:axis]), prod(dims[axis:])); axis 0 gives (1, numel)."""
    axis = n.attrs.get("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    lead = 1
    for s in x.shape[:axis]:
        lead = lead * s
    return x.reshape(lead, -1)


def _unsqueeze(n, x, axes=None):
    axes = _axes(n, [x, axes])
    if _is_ints(x):
        return [x] if not isinstance(x, list) else x
    for a in sorted(a % (x.dim() + len(axes)) for a in axes):
        x = x.unsqueeze(a)
    return x


def _squeeze(n, x, axes=None):
    axes = _axes(n, [x, axes])
    if isinstance(x, list):
        return x[0] if len(x) == 1 else x
    if not axes:
        return x.squeeze()
    for a in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(a)
    return x


def _concat(n, *xs):
    if all(_is_ints(x) for x in xs):
        return [e for x in xs for e in _ints(x)]
    return torch.cat([_t(x) for x in xs], n.attrs["axis"])


def _gemm(n, a, b, c=None):
    at, bt = n.attrs.get("transA", 0), n.attrs.get("transB", 0)
    alpha, beta = n.attrs.get("alpha", 1.0), n.attrs.get("beta", 1.0)
    a = a.t() if at else a
    if bt and alpha == 1.0 and beta == 1.0:
        return F.linear(a, b, c)  # nn.Linear as exported: the translator's linear lowering sees it
    y = alpha * (a @ (b.t() if bt else b))
    return y if c is None else y + beta * c


def _conv(n, x, w, b=None):
    k = w.dim() - 2
    pads = list(n.attrs.get("pads", [0] * 2 * k))
    if n.attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or pads[:k] != pads[k:]:
        raise InputError(f"ONNX import: Conv {n.name} uses asymmetric or automatic padding, which is not supported")
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[k]
    return fn(x, w, b, stride=n.attrs.get("strides", 1), padding=pads[:k], dilation=n.attrs.get("dilations", 1),
              groups=n.attrs.get("group", 1))


def _pool(fn):
    """MaxPool / AveragePool. ONNX's defaults differ from torch's: strides 1 (torch: the kernel
    size) and, for AveragePool, count_include_pad 0 (torch: True)."""
    def run(n, x):
        k = n.attrs["kernel_shape"]
        pads = list(n.attrs.get("pads", [0] * 2 * len(k)))
        if pads[:len(k)] != pads[len(k):] or n.attrs.get("ceil_mode", 0):
            raise InputError(f"ONNX import: {n.op_type} {n.name} uses asymmetric padding or ceil_mode")
        kw = {"count_include_pad": bool(n.attrs.get("count_include_pad", 0))} if fn is F.avg_pool2d else {}
        return fn(x, k, stride=n.attrs.get("strides", [1] * len(k)), padding=pads[:len(k)], **kw)
    return run


def _layer_norm(n, x, w, b=None):
    axis = n.attrs.get("axis", -1) % x.dim()
    return F.layer_norm(x, tuple(x.shape[axis:]), w, b, n.attrs.get("epsilon", 1e-5))


def _reduce(fn):
    def run(n, x, axes=None):
        ax = _axes(n, [x, axes])
        keep = bool(n.attrs.get("keepdims", 1))
        if not ax:
            return fn(x, tuple(range(x.dim())), keep) if not n.attrs.get("noop_with_empty_axes", 0) else x
        return fn(x, tuple(ax), keep)
    return run


def _expand(n, x, shape):
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(shape, "Expand shape"))))


def _const_of_shape(n, shape):
    v = n.attrs.get("value")
    dt = v.dtype if isinstance(v, torch.Tensor) else torch.float32
    fill = v.item() if isinstance(v, torch.Tensor) else 0.0
    shape = _ints(shape, "ConstantOfShape shape")
    if not dt.is_floating_point and len(shape) == 1 and isinstance(shape[0], int) and shape[0] <= SMALL_INT:
        return [int(fill)] * shape[0]  # an int vector: shape arithmetic
    return torch.full(_ints(shape, "ConstantOfShape shape"), fill, dtype=dt)


def _where(c, a, b):
    if _is_ints(c) and _is_ints(a) and _is_ints(b):  # shape arithmetic (TorchScript exports of view/expand)
        cs, as_, bs = (_ints(v) for v in (c, a, b))
        m = max(map(len, (cs, as_, bs)))
        cs, as_, bs = ((v * m if len(v) == 1 else v) for v in (cs, as_, bs))
        return [x if k else y for k, x, y in zip(cs, as_, bs)]
    return torch.where(_t(c), _scalar_or_t(a), _scalar_or_t(b))


def _trilu(n, x, k=None):
    k = int(_ints(k)[0]) if k is not None else 0
    return torch.triu(x, k) if n.attrs.get("upper", 1) else torch.tril(x, k)


def _cast(n, x):
    dt = DTYPES[n.attrs["to"]]
    if _is_ints(x) and dt in (torch.int64, torch.int32):
        return x
    plain = isinstance(x, (int, float)) or (isinstance(x, list) and all(isinstance(e, (int, float)) for e in x))
    if plain and dt.is_floating_point and not isinstance(x, bool):  # a size made a float: stays Python (a scale)
        return [float(e) for e in x] if isinstance(x, list) else float(x)
    return _t(x).to(dt)


def _split(n, x, split=None):
    axis = n.attrs.get("axis", 0)
    sizes = _ints(split, "split") if split is not None else n.attrs.get("split")
    if sizes is None:
        k = n.attrs.get("num_outputs", len(n.outputs))
        c = -(-x.shape[axis] // k)  # ONNX: chunks of ceil(n / k), the last one smaller
        return tuple(torch.split(x, [c] * (k - 1) + [x.shape[axis] - c * (k - 1)], axis))
    return tuple(torch.split(x, list(sizes), axis))


def _clip(n, x, lo=None, hi=None):  # opset >= 11: bounds are optional inputs; before: attributes
    lo = n.attrs.get("min") if lo is None else lo
    hi = n.attrs.get("max") if hi is None else hi
    return torch.clamp(x, lo, hi)


def _pow(a, b):
    """ONNX Pow. Both constant (GPT-2's `size ** 0.5` in a TorchScript export): a 0-d tensor, since
    torch.pow takes no (float, float); Python ints stay ints (shape arithmetic)."""
    if isinstance(a, int) and isinstance(b, int) and b >= 0:
        return a ** b
    return torch.pow(a if isinstance(a, torch.Tensor) else torch.tensor(a), b)


PY_UNARY = {"Sqrt": math.sqrt, "Reciprocal": lambda v: 1.0 / v, "Neg": lambda v: -v, "Abs": abs}


def _unary(fn, op=None):
    """A unary math op. On a Python float (a scale from a head size: 1 / sqrt(float(d))) it runs in
    Python where it can (PY_UNARY); any other Python value becomes a tensor first."""
    def run(n, x):
        if op in PY_UNARY and isinstance(x, (float, list)) and _is_py(x) and not _is_ints(x):
            return [PY_UNARY[op](e) for e in x] if isinstance(x, list) else PY_UNARY[op](x)
        return fn(x if isinstance(x, torch.Tensor) else _t(x))
    return run


UNARY = {
    "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log,
    "Abs": torch.abs, "Tanh": torch.tanh, "Erf": torch.erf, "Sigmoid": torch.sigmoid, "Relu": F.relu,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Atan": torch.atan, "Asin": torch.asin,
    "Acos": torch.acos, "Sinh": torch.sinh, "Cosh": torch.cosh, "Sign": torch.sign, "Floor": torch.floor,
    "Ceil": torch.ceil, "Round": torch.round, "IsNaN": torch.isnan, "Softplus": F.softplus, "Mish": F.mish,
    "Softsign": F.softsign, "HardSwish": F.hardswish,
}


OPS = {
    "Identity": lambda n, x: x, "Dropout": lambda n, x, *r: x, "Clip": _clip,
    "Add": _ew(lambda a, b: a + b), "Sub": _ew(lambda a, b: a - b), "Mul": _ew(lambda a, b: a * b),
    "Div": _ew(_div), "Pow": _ew(_pow),
    "Equal": _ew(lambda a, b: a == b), "Less": _ew(lambda a, b: a < b), "Greater": _ew(lambda a, b: a > b),
    "Where": lambda n, c, a, b: _where(c, a, b),
    "Max": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).amax(0),
    "Min": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).amin(0),
    "Not": lambda n, x: ~x, "And": lambda n, a, b: a & b,
    **{op: _unary(fn, op) for op, fn in UNARY.items()},
    "Gelu": lambda n, x: F.gelu(x, approximate="tanh" if n.attrs.get("approximate") in ("tanh", b"tanh") else "none"),
    "Softmax": lambda n, x: torch.softmax(x, n.attrs.get("axis", -1)),
    "LogSoftmax": lambda n, x: torch.log_softmax(x, n.attrs.get("axis", -1)),
    "MatMul": lambda n, a, b: torch.matmul(a, b), "Gemm": _gemm,
    "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce(lambda x, ax, k: x.mean(ax, keepdim=k)),
    "ReduceSum": _reduce(lambda x, ax, k: x.sum(ax, keepdim=k)),
    "ReduceMax": _reduce(lambda x, ax, k: x.amax(ax, keepdim=k)),
    "Reshape": _reshape, "Transpose": lambda n, x: x.permute(n.attrs.get("perm", list(range(x.dim()))[::-1])),
    "Flatten": _flatten,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Concat": _concat, "Split": _split, "Slice": _slice,
    "Gather": _gather, "Expand": _expand, "Shape": lambda n, x: list(x.shape)[slice(n.attrs.get("start", 0),
                                                                                   n.attrs.get("end"))],
    "ConstantOfShape": _const_of_shape, "Trilu": _trilu, "Cast": _cast,
    "Range": lambda n, s, e, d: torch.arange(s, e, d) if _is_ints(s) else torch.arange(s.item(), e.item(), d.item()),
    "Conv": _conv, "MaxPool": _pool(F.max_pool2d), "AveragePool": _pool(F.avg_pool2d),
    "GlobalAveragePool": lambda n, x: x.mean(tuple(range(2, x.dim())), keepdim=True),
    "BatchNormalization": lambda n, x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0,
                                                               n.attrs.get("epsilon", 1e-5)),
}


# ---- ops the exporters emit beyond the first table (issue 32): reductions, Tile, activations with
# parameters, index ops, Pad / Resize --------------------------------------------------------------
def _tile(n, x, repeats):
    return x.repeat(_ints(repeats, "Tile repeats"))


def _act(fn, **defaults):
    """An activation with ONNX attributes (alpha, beta ...) and their ONNX defaults."""
    return lambda n, x: fn(x, **{k: n.attrs.get(k, v) for k, v in defaults.items()})


def _cumsum(n, x, axis):
    axis = _ints(axis, "CumSum axis")[0]
    if n.attrs.get("reverse", 0):
        x = x.flip(axis)
    y = torch.cumsum(x, axis)
    if n.attrs.get("exclusive", 0):
        y = y - x
    return y.flip(axis) if n.attrs.get("reverse", 0) else y


def _argminmax(fn):
    def run(n, x):
        if n.attrs.get("select_last_index", 0):
            raise InputError(f"ONNX import: {n.op_type} {n.name} with select_last_index=1 is not supported")
        return fn(x, n.attrs.get("axis", 0), keepdim=bool(n.attrs.get("keepdims", 1)))
    return run


def _topk(n, x, k):
    v, i = torch.topk(x, _ints(k, "TopK k")[0], n.attrs.get("axis", -1), bool(n.attrs.get("largest", 1)),
                      bool(n.attrs.get("sorted", 1)))
    return v, i


def _scatter_nd(n, data, idx, updates):
    if n.attrs.get("reduction", "none") != "none":
        raise InputError(f"ONNX import: ScatterND {n.name} with reduction {n.attrs['reduction']} is not supported")
    out = data.clone()
    i = _t(idx)
    out[tuple(i[..., d] for d in range(i.shape[-1]))] = updates
    return out


def _scatter_elements(n, data, idx, updates):
    red = n.attrs.get("reduction", "none")
    if red not in ("none", "add"):
        raise InputError(f"ONNX import: ScatterElements {n.name} with reduction {red} is not supported")
    axis = n.attrs.get("axis", 0)
    return data.scatter_add(axis, _t(idx), updates) if red == "add" else data.scatter(axis, _t(idx), updates)


def _pad(n, x, pads=None, value=None, axes=None):
    pads = _ints(pads, "Pad pads") if pads is not None else n.attrs["pads"]
    axes = _ints(axes, "Pad axes") if axes is not None else list(range(x.dim()))
    k = len(axes)
    per = {a % x.dim(): (pads[j], pads[j + k]) for j, a in enumerate(axes)}
    flat = [p for d in reversed(range(x.dim())) for p in per.get(d, (0, 0))]  # torch: last dim first
    while len(flat) > 2 and flat[-2:] == [0, 0]:  # torch's reflect / replicate take only the padded trailing dims
        flat = flat[:-2]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}.get(n.attrs.get("mode", "constant"))
    if mode is None:
        raise InputError(f"ONNX import: Pad {n.name} mode {n.attrs.get('mode')} is not supported")
    if mode != "constant":
        return F.pad(x, flat, mode=mode)
    v = 0.0 if value is None else (value if isinstance(value, (int, float)) else float(_t(value)))
    return F.pad(x, flat, value=v)


def _resize(n, x, roi=None, scales=None, sizes=None):
    """Resize as F.interpolate exports it: nearest (asymmetric, floor) or linear (half_pixel /
    pytorch_half_pixel = align_corners False, align_corners = True) over the spatial dims."""
    mode, ctm = n.attrs.get("mode", "nearest"), n.attrs.get("coordinate_transformation_mode", "half_pixel")
    sp = x.dim() - 2
    if sizes is not None and len(_ints(sizes)):
        size = list(_ints(sizes, "Resize sizes"))[2:]
    else:
        sc = [float(s) for s in (_t(scales).tolist() if isinstance(scales, torch.Tensor) else scales)]
        if sc[:2] != [1.0, 1.0]:
            raise InputError(f"ONNX import: Resize {n.name} scales the batch or channel dim")
        size = [int(x.shape[2 + i] * sc[2 + i]) for i in range(sp)]
    if mode == "nearest" and ctm == "asymmetric" and n.attrs.get("nearest_mode", "round_prefer_floor") == "floor":
        return F.interpolate(x, size=size, mode="nearest")
    if mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        lin = {1: "linear", 2: "bilinear", 3: "trilinear"}[sp]
        return F.interpolate(x, size=size, mode=lin, align_corners=ctm == "align_corners")
    raise InputError(f"ONNX import: Resize {n.name} with mode {mode}, coordinate_transformation_mode {ctm} is not "
                     "supported (F.interpolate's nearest and (bi)linear exports are)")


def _conv_transpose(n, x, w, b=None):
    k = w.dim() - 2
    pads = list(n.attrs.get("pads", [0] * 2 * k))
    if n.attrs.get("auto_pad", "NOTSET") != "NOTSET" or pads[:k] != pads[k:] or "output_shape" in n.attrs:
        raise InputError(f"ONNX import: ConvTranspose {n.name} uses asymmetric / automatic padding or output_shape")
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[k]
    return fn(x, w, b, stride=n.attrs.get("strides", 1), padding=pads[:k],
              output_padding=n.attrs.get("output_padding", 0), groups=n.attrs.get("group", 1),
              dilation=n.attrs.get("dilations", 1))


def _prod(x, axes, keep):
    for a in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.prod(a, keepdim=True)
    return x if keep else x.squeeze(tuple(axes))


def _isinf(n, x):
    pos, neg = n.attrs.get("detect_positive", 1), n.attrs.get("detect_negative", 1)
    return (x == float("inf")) & bool(pos) | (x == float("-inf")) & bool(neg)


def _gather_nd(n, data, idx):
    b = n.attrs.get("batch_dims", 0)
    i = _t(idx)
    lead = [torch.arange(data.shape[d]).view(*([1] * d), -1, *([1] * (i.dim() - 2 - d))) for d in range(b)]
    return data[tuple(lead) + tuple(i[..., k] for k in range(i.shape[-1]))]


def _mod(a, b, fmod):
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


OPS.update({
    "ReduceLogSumExp": _reduce(lambda x, ax, k: torch.logsumexp(x, ax, keepdim=k)),
    "ReduceMin": _reduce(lambda x, ax, k: x.amin(ax, keepdim=k)),
    "ReduceProd": _reduce(_prod),
    "ReduceL2": _reduce(lambda x, ax, k: x.square().sum(ax, keepdim=k).sqrt()),
    "ReduceL1": _reduce(lambda x, ax, k: x.abs().sum(ax, keepdim=k)),
    "ReduceSumSquare": _reduce(lambda x, ax, k: x.square().sum(ax, keepdim=k)),
    "ReduceLogSum": _reduce(lambda x, ax, k: x.sum(ax, keepdim=k).log()),
    "Tile": _tile,
    "LeakyRelu": _act(lambda x, alpha: F.leaky_relu(x, alpha), alpha=0.01),
    "Elu": _act(lambda x, alpha: F.elu(x, alpha), alpha=1.0),
    "Celu": _act(lambda x, alpha: F.celu(x, alpha), alpha=1.0),
    "Selu": _act(lambda x, alpha, gamma: gamma * torch.where(x > 0, x, alpha * torch.expm1(x)),
                 alpha=1.67326319217681884765625, gamma=1.05070102214813232421875),
    "HardSigmoid": _act(lambda x, alpha, beta: torch.clamp(alpha * x + beta, 0.0, 1.0), alpha=0.2, beta=0.5),
    "PRelu": lambda n, x, slope: torch.where(x >= 0, x, slope * x),
    "IsInf": _isinf,
    "Or": lambda n, a, b: a | b, "Xor": lambda n, a, b: a ^ b,
    "LessOrEqual": _ew(lambda a, b: a <= b), "GreaterOrEqual": _ew(lambda a, b: a >= b),
    "Mod": lambda n, a, b: _mod(_scalar_or_t(a), _scalar_or_t(b), n.attrs.get("fmod", 0)),
    "Sum": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).sum(0),
    "Mean": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).mean(0),
    "CastLike": lambda n, x, like: _t(x).to(_t(like).dtype),
    "Einsum": lambda n, *xs: torch.einsum(n.attrs["equation"], *xs),
    "CumSum": _cumsum, "ArgMax": _argminmax(torch.argmax), "ArgMin": _argminmax(torch.argmin), "TopK": _topk,
    "GatherElements": lambda n, x, i: torch.gather(x, n.attrs.get("axis", 0), _t(i)),
    "GatherND": _gather_nd, "ScatterND": _scatter_nd, "ScatterElements": _scatter_elements,
    "Pad": _pad, "Resize": _resize, "ConvTranspose": _conv_transpose,
    "InstanceNormalization": lambda n, x, s, b: F.instance_norm(x, weight=s, bias=b, eps=n.attrs.get("epsilon", 1e-5)),
    "GlobalMaxPool": lambda n, x: x.amax(tuple(range(2, x.dim())), keepdim=True),
    "Size": lambda n, x: x.numel(),
})
