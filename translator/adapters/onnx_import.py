"""ONNX input: an .onnx file -> an nn.Module that translate() captures like any model.

Why our own importer: onnx2torch (the usual converter) requires torchvision at import
(for two detection ops), which drags a second torch build into a CPU environment, and its
releases have slowed (1.5.15, 2024). The exports we serve — torch.onnx.export of
transformer blocks, MLPs and small CNNs — use a few dozen standard ops, each a line or
two of torch here, so the importer is a table (`OPS`) plus an interpreter module.

`ONNXModel.forward` walks the graph in order and calls the torch function of each node;
torch.export then sees ordinary aten ops (matmul, linear, layer_norm, softmax, gelu,
conv2d ...) and the translator's lowerings apply as they do to PyTorch code. Float
initializers become buffers (so linear weights are constants, preshuffled once); small
integer tensors (shapes, axes, indices) stay Python ints, and `Shape` yields the input's
(possibly symbolic) sizes as a list, so Reshape / Expand / Slice take plain int lists and
dynamic dims survive export. A file that is truncated, fails the ONNX checker, or uses an
op or domain outside the table is refused with one error naming what and where.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError

DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
          9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}
SMALL_INT = 64  # integer constants up to this many elements are kept as Python ints


def is_onnx_path(x) -> bool:
    return isinstance(x, (str, os.PathLike)) and str(x).lower().endswith(".onnx")


# ---- values: tensors, or Python ints / int lists (shapes, axes) ---------------------------------
def _is_ints(v) -> bool:
    return isinstance(v, (int, torch.SymInt)) or (isinstance(v, list) and all(isinstance(e, (int, torch.SymInt))
                                                                                 for e in v))


def _t(v):
    """A value as a tensor (int lists become int64 tensors)."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, float):
        return torch.tensor(v)
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


def _ew(fn):
    """Elementwise op; on Python ints (shape arithmetic) it runs in Python."""
    def run(n, a, b):
        if _is_ints(a) and _is_ints(b):
            if isinstance(a, list) or isinstance(b, list):
                la, lb = _ints(a), _ints(b)
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
        if st != 1:
            raise InputError(f"ONNX import: Slice with step {st} is not supported (node {n.name})")
        big = isinstance(e, int) and e >= 2 ** 62
        idx[a] = slice(s, None if big else e)
    return x[tuple(idx)]


def _gather(n, data, idx):
    axis = n.attrs.get("axis", 0)
    if isinstance(data, list):
        return [data[i] for i in idx] if isinstance(idx, list) else data[idx]
    if _is_ints(idx) and not isinstance(idx, list):
        return data.select(axis, idx)
    i = _t(idx)
    if axis == 0 and data.dim() == 2 and not i.is_floating_point():
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
    return x if _is_ints(x) and dt in (torch.int64, torch.int32) else _t(x).to(dt)


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


OPS = {
    "Identity": lambda n, x: x, "Dropout": lambda n, x, *r: x, "Clip": _clip,
    "Add": _ew(lambda a, b: a + b), "Sub": _ew(lambda a, b: a - b), "Mul": _ew(lambda a, b: a * b),
    "Div": _ew(_div), "Pow": _ew(torch.pow),
    "Equal": _ew(lambda a, b: a == b), "Less": _ew(lambda a, b: a < b), "Greater": _ew(lambda a, b: a > b),
    "Where": lambda n, c, a, b: _where(c, a, b),
    "Max": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).amax(0),
    "Min": lambda n, *xs: torch.stack(torch.broadcast_tensors(*map(_t, xs))).amin(0),
    "Not": lambda n, x: ~x, "And": lambda n, a, b: a & b,
    "Sqrt": lambda n, x: torch.sqrt(x), "Reciprocal": lambda n, x: torch.reciprocal(x), "Neg": lambda n, x: -x,
    "Exp": lambda n, x: torch.exp(x), "Log": lambda n, x: torch.log(x), "Abs": lambda n, x: torch.abs(x),
    "Tanh": lambda n, x: torch.tanh(x), "Erf": lambda n, x: torch.erf(x), "Sigmoid": lambda n, x: torch.sigmoid(x),
    "Relu": lambda n, x: F.relu(x), "Sin": lambda n, x: torch.sin(x), "Cos": lambda n, x: torch.cos(x),
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


# ---- the graph -----------------------------------------------------------------------------------
class _Node:
    __slots__ = ("op_type", "name", "inputs", "outputs", "attrs")

    def __init__(self, op_type, name, inputs, outputs, attrs):
        self.op_type, self.name, self.inputs, self.outputs, self.attrs = op_type, name, inputs, outputs, attrs


def _attr(a):
    from onnx import helper, numpy_helper

    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if hasattr(v, "raw_data") or hasattr(v, "dims"):  # a TensorProto
        return torch.from_numpy(np.array(numpy_helper.to_array(v)))
    return list(v) if isinstance(v, (list, tuple)) else v


def _const_value(t: torch.Tensor):
    """Small integer tensors and float scalars become Python values; the rest stay tensors."""
    if not t.is_floating_point() and t.dtype != torch.bool and t.numel() <= SMALL_INT:
        return t.tolist()
    if t.is_floating_point() and t.dim() == 0:
        return float(t)
    return None


class ONNXModel(torch.nn.Module):
    """An ONNX graph run node by node with torch ops (see the module docstring)."""

    def __init__(self, graph, name: str):
        super().__init__()
        from onnx import numpy_helper

        self.onnx_name = name
        self._py_consts: dict = {}
        self._tensor_consts: dict = {}  # ONNX value name -> buffer name
        for i, init in enumerate(graph.initializer):
            t = torch.from_numpy(np.array(numpy_helper.to_array(init)))
            self._add_const(init.name, t, i)
        inits = {i.name for i in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in inits]
        self.output_names = [o.name for o in graph.output]
        self.nodes = []
        for k, n in enumerate(graph.node):
            attrs = {a.name: _attr(a) for a in n.attribute}
            if n.op_type == "Constant":
                (key, v), = attrs.items()
                t = v if isinstance(v, torch.Tensor) else torch.tensor(v)
                self._add_const(n.output[0], t, f"c{k}")
                continue
            self.nodes.append(_Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output), attrs))

    def _add_const(self, name, t, idx):
        py = _const_value(t)
        if py is not None:
            self._py_consts[name] = py
        else:
            buf = f"onnx_const_{idx}"
            self.register_buffer(buf, t.contiguous())
            self._tensor_consts[name] = buf

    def forward(self, *args):
        env = self.values(*args)
        res = tuple(_t(env[o]) if _is_ints(env[o]) else env[o] for o in self.output_names)
        return res[0] if len(res) == 1 else res

    def values(self, *args) -> dict:
        """Every ONNX value name -> its value (tensor, or Python ints for shape arithmetic) on `args`."""
        env = dict(zip(self.input_names, args))

        def get(name):
            if name == "":
                return None
            if name in env:
                return env[name]
            if name in self._py_consts:
                return self._py_consts[name]
            return getattr(self, self._tensor_consts[name])

        for n in self.nodes:
            out = OPS[n.op_type](n, *[get(i) for i in n.inputs])
            outs = out if isinstance(out, tuple) else (out,)
            env.update(zip(n.outputs, outs))
        return env


def load_onnx(path):
    """The checked ONNX ModelProto, or one InputError naming what is wrong."""
    import onnx

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 — protobuf raises several kinds for damaged files
        raise InputError(f"{path} is not a readable ONNX model ({type(e).__name__}: {str(e)[:200]}); the file is "
                         "truncated or not ONNX — export it again with torch.onnx.export") from e
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path} fails the ONNX checker: {str(e).strip().splitlines()[0][:300]}") from e
    if not model.graph.node:
        raise InputError(f"{path} has an empty graph (a truncated or placeholder file?)")
    bad = {}
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for n in model.graph.node:
        dom = n.domain or "ai.onnx"
        if dom != "ai.onnx" or (n.op_type not in OPS and n.op_type != "Constant"):
            bad.setdefault(f"{dom}::{n.op_type}" if dom != "ai.onnx" else n.op_type, n.name)
    if bad:
        what = ", ".join(f"{op} (first at node {name or '?'}, opset {opsets.get('ai.onnx')})" for op, name in bad.items())
        raise InputError(f"{path}: the ONNX importer cannot import {what}; it imports {len(OPS)} standard ops "
                         f"({', '.join(sorted(OPS))}) — translate the PyTorch model directly, or ask for the op")
    return model


MAX_EXAMPLE_BYTES = 4 << 30  # an example input made from declared dims is refused above this, before allocating


def example_inputs_for(graph, dims: dict | None = None) -> tuple:
    """Inputs made from the graph's input types: floats ~ N(0, 1), integers 0 (token ids, indices).
    A symbolic dim takes its size from `dims` (by name), else 2."""
    g = torch.Generator().manual_seed(0)
    inits = {i.name for i in graph.initializer}
    out = []
    for i in graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dt = DTYPES.get(tt.elem_type)
        if dt is None:
            raise InputError(f"ONNX input {i.name} has element type {tt.elem_type}, which the importer does not take")
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 2) for d in tt.shape.dim]
        n = 1
        for d in shape:
            n *= d
        if any(d < 0 for d in shape) or n * torch.empty((), dtype=dt).element_size() > MAX_EXAMPLE_BYTES:
            raise InputError(f"ONNX input {i.name} declares shape {shape} ({n:.3g} elements), too large for an example "
                             f"input (limit {MAX_EXAMPLE_BYTES >> 30} GiB) or negative; the file is damaged, or pass "
                             "example inputs of a real size: translate(path, (x,))")
        out.append(torch.randn(shape, generator=g).to(dt) if dt.is_floating_point else torch.zeros(shape, dtype=dt))
    return tuple(out)


def import_onnx(path, example_inputs=None):
    """(ONNXModel, example inputs) for an .onnx file."""
    model = load_onnx(path)
    module = ONNXModel(model.graph, Path(path).stem).eval()
    inputs = example_inputs if example_inputs is not None else example_inputs_for(model.graph)
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if len(inputs) != len(module.input_names):
        raise InputError(f"{path} takes {len(module.input_names)} inputs ({', '.join(module.input_names)}), "
                         f"got {len(inputs)} example inputs")
    try:
        with torch.no_grad():
            module(*inputs)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 — an op whose attributes or inputs we mis-serve: say which
        raise InputError(f"{path}: the imported graph failed on the example inputs ({type(e).__name__}: "
                         f"{str(e)[:300]})") from e
    return module, tuple(inputs)
