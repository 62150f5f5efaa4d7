"""ONNX input: an .onnx file -> an nn.Module that translate() captures like any model.

Our own importer, not an ONNX -> FX library (docs/onnx.md says why: sizes stay Python ints, no
torchvision): the op table `onnx_ops.OPS` plus this interpreter module. `ONNXModel.forward` walks
the graph in order and calls the torch function of each node; torch.export then sees ordinary aten
ops (matmul, linear, layer_norm, softmax, gelu, conv2d ...) and the translator's lowerings apply as
they do to PyTorch code. At import: float initializers become buffers (linear weights are
constants, preshuffled once); small integer vectors (shapes, axes, indices) stay Python ints, and
`Shape` yields the input's (possibly symbolic) sizes as a list, so Reshape / Expand / Slice take
plain int lists and dynamic dims survive export; constant-only subgraphs are folded (`ONNXModel`);
the exporters' SDPA decomposition is put back together (`onnx_patterns`). A file that is
truncated, fails the ONNX checker, reads external data outside its folder, or uses an op, opset or
domain the importer does not know is refused with one error naming what and where (`load_onnx`,
`check_opset`). Verification judges the import against ONNX Runtime (`onnx_truth`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from .onnx_ops import DTYPES, OPS, SMALL_INT, _is_ints, _t
from .onnx_patterns import PATTERN_OPS, fuse_attention



def is_onnx_path(x) -> bool:
    return isinstance(x, (str, os.PathLike)) and str(x).lower().endswith(".onnx")


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
    """Small integer vectors and float scalars become Python values; the rest stay tensors."""
    if not t.is_floating_point() and t.dtype != torch.bool and t.dim() <= 1 and t.numel() <= SMALL_INT:
        return t.tolist()
    if t.is_floating_point() and t.dim() == 0:
        return float(t)
    return None


class ONNXModel(torch.nn.Module):
    """An ONNX graph run node by node with torch ops (see the module docstring).

    Constant folding: a node whose inputs are all constants (initializers, Constant nodes, outputs
    of nodes folded before it) runs once here, and its outputs become constants; at run time only
    nodes that depend on a graph input remain, so a constant-only subgraph never reaches capture,
    let alone a kernel. A constant no remaining node reads is dropped (a weight read only through a
    folded Transpose is kept once, transposed)."""

    def __init__(self, graph, name: str):
        super().__init__()
        from onnx import numpy_helper

        self.onnx_name = name
        self._py_consts: dict = {}
        self._tensor_consts: dict = {}  # ONNX value name -> buffer name
        self._scalars: dict = {}  # float scalars as 0-d tensors of their dtype, for folding
        self.folded = 0
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
            node = _Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output), attrs)
            if all(i == "" or self._is_const(i) for i in node.inputs) and node.inputs:
                self._fold(node, k)
            else:
                self.nodes.append(node)
        self.nodes, self.fused_attention = fuse_attention(self.nodes, self._scalar, self.output_names, _Node,
                                                          self._is_const)
        read = {i for n in self.nodes for i in n.inputs} | set(self.output_names)
        for name, buf in list(self._tensor_consts.items()):
            if name not in read:
                del self._tensor_consts[name]
                delattr(self, buf)

    def _scalar(self, name):
        """A constant float scalar (0-d, or one element) as a Python float, else None."""
        v = self._py_consts.get(name)
        if isinstance(v, float):
            return v
        t = getattr(self, self._tensor_consts[name]) if name in self._tensor_consts else None
        return float(t.reshape(())) if t is not None and t.is_floating_point() and t.numel() == 1 else None

    def _is_const(self, name) -> bool:
        return name in self._py_consts or name in self._tensor_consts

    def _fold(self, node, k):
        def get(name):
            if name == "":
                return None
            if name in self._scalars:
                return self._scalars[name]
            return self._py_consts[name] if name in self._py_consts else getattr(self, self._tensor_consts[name])

        with torch.no_grad():
            out = OPS[node.op_type](node, *[get(i) for i in node.inputs])
        for j, (o, v) in enumerate(zip(node.outputs, out if isinstance(out, tuple) else (out,))):
            if isinstance(v, (torch.Tensor, float, bool)) or not _is_ints(v):
                v = v if isinstance(v, torch.Tensor) else torch.tensor(v)
                self._add_const(o, v, f"f{k}_{j}")
            else:
                self._py_consts[o] = v
        self.folded += 1

    def _add_const(self, name, t, idx):
        py = _const_value(t)
        if py is not None:
            self._py_consts[name] = py
            if isinstance(py, float):
                self._scalars[name] = t
        else:
            buf = f"onnx_const_{idx}"
            self.register_buffer(buf, t.contiguous())
            self._tensor_consts[name] = buf

    def forward(self, *args):
        env = self.values(*args)
        res = tuple(env[o] if isinstance(env[o], torch.Tensor) else _t(env[o]) for o in self.output_names)
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
            out = (OPS.get(n.op_type) or PATTERN_OPS[n.op_type])(n, *[get(i) for i in n.inputs])
            outs = out if isinstance(out, tuple) else (out,)
            env.update(zip(n.outputs, outs))
        for o in self.output_names:  # an output that folded to a constant
            env[o] = get(o)
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
        if "outside the directory" in str(e) or "external" in str(e).lower():
            raise InputError(f"{path}: its external data is refused ({str(e).strip()[:300]}); a tensor's data must "
                             f"be a file inside {path.parent}, next to the model") from e
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
        if dom != "ai.onnx":
            raise InputError(f"{path}: node {n.name or '?'} ({n.op_type}) is in domain {dom} (opset "
                             f"{opsets.get(dom, '?')}), which the ONNX importer does not know: it imports the "
                             "standard ai.onnx domain only — export without custom ops (torch.onnx.export of the "
                             "PyTorch model), or translate the PyTorch model directly")
        if n.op_type not in OPS and n.op_type != "Constant":
            bad.setdefault(n.op_type, n.name)
    if not bad:
        check_opset(path, model.graph.node, opsets.get("ai.onnx", 1))
    if bad:
        what = ", ".join(f"{op} (first at node {name or '?'}, opset {opsets.get('ai.onnx')})" for op, name in bad.items())
        raise InputError(f"{path}: the ONNX importer cannot import {what}; it imports {len(OPS)} standard ops "
                         f"({', '.join(sorted(OPS))}) — translate the PyTorch model directly, or ask for the op")
    return model


OPSETS = range(13, 22)  # the ai.onnx opsets whose op definitions the importer knows (exports tested at 17-21)


@functools.lru_cache(maxsize=None)
def _since(op: str, opset: int) -> int | None:
    """The version of `op`'s definition in force under `opset` (None: no such op there)."""
    from onnx import defs

    try:
        return defs.get_schema(op, opset).since_version
    except Exception:  # noqa: BLE001 — SchemaError: the op does not exist at that opset
        return None


def check_opset(path, nodes, opset: int) -> None:
    """Refuse a node whose op definition under the file's `opset` is not one the importer knows: one
    in force at some opset of OPSETS. A newer opset is taken where it left an op unchanged; an opset
    newer than the installed onnx knows, or older than OPSETS, is refused at its first node."""
    from onnx import defs

    first = next(iter(nodes))
    newest = defs.onnx_opset_version()
    if opset > newest or opset < OPSETS.start:
        why = (f"newer than any ONNX opset this onnx ({newest}) knows" if opset > newest
               else f"older than the importer reads ({OPSETS.start}-{OPSETS.stop - 1})")
        raise InputError(f"{path}: declares ai.onnx opset {opset}, {why} (first node {first.name or '?'}, "
                         f"{first.op_type}) — export again with torch.onnx.export(..., opset_version=18)")
    for n in nodes:
        if n.op_type == "Constant":
            continue
        v = _since(n.op_type, opset)
        known = sorted({k for o in OPSETS if (k := _since(n.op_type, o)) is not None})
        if v not in known:
            raise InputError(f"{path}: node {n.name or '?'} is {n.op_type}-{v} under opset {opset}; the ONNX importer "
                             f"knows {n.op_type} as defined in opsets {OPSETS.start}-{OPSETS.stop - 1} (versions "
                             f"{', '.join(map(str, known)) or 'none'}) — export again with opset_version 17 to 21")


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
