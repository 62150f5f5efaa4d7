"""save / load of translated modules: a torch.export archive plus our metadata.

    translator.save(tm, "model.pt2")
    tm = translator.load("model.pt2")          # runs on the saved backend, or picks one here

The translated graph (its `torch.ops.flydsl.*` calls, whose fake implementations make it
exportable) is exported again with `torch.export.export` — the dims that were dynamic at
translate time stay dynamic — and written with `torch.export.save`: the graph as JSON and
every weight (preshuffled ones included) as raw bytes. The example inputs are left out
(their entry stays empty), so the archive holds no pickle; `load` refuses an archive that has
one, since torch.export.load would unpickle it with code execution allowed. Our metadata (format tag, arch, backend, input
spec, the report) goes in as an extra file; `load` checks that tag before torch reads
anything else, so a file from another tool is refused with one clear error.

`load` reads nothing but what `save` writes, and checks it before torch does: the path must be a
regular file once links are resolved (a FIFO or a device would block the reader forever); every
zip entry must be stored uncompressed with its declared size equal to its stored size (save never
compresses: a deflated entry could inflate to any size, a zip bomb); each weight entry's size must
equal the bytes its tensor metadata spans (a short or long entry gives wrong weights silently),
with the metadata's types checked first, and each weight's shape and dtype must be those the graph
reads. Every failure is an InputError that names the entry and the fix.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from pathlib import Path

import torch
from torch.export import Dim

from ..errors import InputError
from ..state import materialized

FORMAT = "flydsl-translator/1"
META = "flydsl_translator.json"


def save(module, path, example_inputs=None) -> Path:
    """Write a TranslatedModule to `path` (a .pt2 archive). `example_inputs` are optional:
    without them, inputs of the captured example sizes are made from the graph's metadata."""
    from ..version import __version__
    from ..translated import TranslatedModule

    if not isinstance(module, TranslatedModule):
        raise InputError(f"translator.save takes a TranslatedModule (what translate() returns), got "
                         f"{type(module).__name__}; for a plain nn.Module use torch.export.save")
    path = Path(path)
    if path.is_dir():
        raise InputError(f"translator.save: {path} is a folder; pass a file path such as {path / 'model.pt2'}")
    if not path.parent.is_dir():
        raise InputError(f"translator.save: the folder {path.parent} does not exist; create it first "
                         f"(Path({str(path.parent)!r}).mkdir(parents=True)) or pass another path")
    inputs = tuple(example_inputs) if example_inputs is not None else _inputs_from_meta(module.gm)
    dyn = _dynamic_spec(module.gm, module.report.dynamic_dims)
    with torch.no_grad(), materialized(module.gm):  # prepared weights left lazy (state.settle) are saved made
        ep = torch.export.export(module.gm, inputs, dynamic_shapes=dyn, strict=False)
    ep.example_inputs = None  # torch.export.save would pickle them
    meta = {"format": FORMAT, "translator_version": __version__, "torch_version": torch.__version__,
            "arch": module.arch, "backend": module.backend, "input_spec": module._input_spec,
            "report": module.report.to_dict()}
    try:
        torch.export.save(ep, str(path), extra_files={META: json.dumps(meta, default=str)})
    except OSError as e:
        raise InputError(f"translator.save cannot write {path} ({e.strerror or e}); pass a file path in a folder you "
                         "can write to") from e
    return path


def load(path, backend: str | None = None):
    """Read a file written by `translator.save`. `backend`: None keeps the saved backend when it
    can run here (else chooses as translate(backend="auto") would); or rocm | flysim | reference."""
    from ..api import choose_backend
    from ..translated import TranslatedModule
    from .. import lowerings  # noqa: F401  (the flydsl custom ops must exist before the graph is deserialized)

    path = Path(path)
    meta = _read_meta(path)
    extra = {META: ""}
    try:
        ep = torch.export.load(str(path), extra_files=extra)
    except Exception as e:  # noqa: BLE001 — a damaged archive is the user's input, not our bug
        raise InputError(f"{path}: our metadata is present but torch.export could not read the graph "
                         f"({type(e).__name__}: {_first_line(e)}); the file is damaged or was written by an "
                         f"incompatible torch (it was saved with torch {meta.get('torch_version')})") from e
    try:
        report = _report_from_dict(meta["report"])
    except (TypeError, ValueError, AttributeError, KeyError) as e:  # fields of the wrong kind or name
        raise InputError(f"{path}: the saved report is damaged ({type(e).__name__}: {_first_line(e)}); save the "
                         "translated module again") from e
    families = {r.detail.split()[0].removeprefix("flydsl.") for r in report.rows if r.where.startswith("flydsl")}
    if backend is None:
        want = meta["backend"]
        try:
            chosen, _ = choose_backend(want, families)
        except InputError:
            chosen, why = choose_backend("auto", families)
            report.backend_reason = f"saved with backend {want}, which cannot run here; {why}"
    else:
        chosen, _ = choose_backend(backend, families)
    report.backend = chosen
    spec = [list(s) if s is not None else None for s in meta["input_spec"]]
    return TranslatedModule(ep.module(), chosen, meta["arch"], report, spec)


def _regular_file(path: Path) -> None:
    """Refuse anything but a regular file before opening it: opening a FIFO blocks until a writer
    comes, and a device (a link to /dev/zero) never ends."""
    try:
        st = os.stat(path)  # follows links
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from e
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket or other "
                "special file")
        real = os.path.realpath(path)
        via = f" (a link to {real})" if real != os.path.abspath(path) else ""
        raise InputError(f"{path}{via} is {kind}, not a regular file; translator.load reads only the .pt2 file "
                         "that translator.save wrote")


def _read_meta(path: Path) -> dict:
    _regular_file(path)
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path} is not a file written by translator.save (not a zip archive; "
                         "translator.save writes a torch.export .pt2 archive with our metadata)")
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(f"/extra/{META}")]
        if not names:
            raise InputError(f"{path} is not a file written by translator.save (it has no {META}; a plain "
                             "torch.export archive or torch.save file loads with torch.export.load / torch.load)")
        _refuse_pickles(path, z)  # every entry checked (names, kinds, sizes) before one is read
        try:
            meta = json.loads(z.read(names[0]))
        except (ValueError, zipfile.BadZipFile) as e:
            raise InputError(f"{path}: the translator metadata is damaged ({e})") from e
        _check_weights(path, z)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise InputError(f"{path}: format {got!r} is not {FORMAT!r}; save it again with this translator version")
    missing = [k for k in ("arch", "backend", "input_spec", "report") if k not in meta]
    if missing:
        raise InputError(f"{path}: the translator metadata lacks {', '.join(missing)}; the file is damaged or was "
                         "not written by translator.save — save the translated module again")
    spec = meta["input_spec"]
    bad = [k for k, ok in (("arch", isinstance(meta["arch"], str)), ("backend", isinstance(meta["backend"], str)),
                           ("report", isinstance(meta["report"], dict)),
                           ("input_spec", isinstance(spec, list) and all(
                               s is None or (isinstance(s, list) and all(d is None or type(d) is int for d in s))
                               for s in spec))) if not ok]
    if bad:
        raise InputError(f"{path}: the translator metadata's {', '.join(bad)} has the wrong type; the file is damaged "
                         "— save the translated module again")
    return meta


_SCALAR_TYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64, 6: torch.float16,
                 7: torch.float32, 8: torch.float64, 12: torch.bool, 13: torch.bfloat16}


def _ints(v, what) -> list:
    if not isinstance(v, list) or not all(isinstance(d, dict) and type(d.get("as_int")) is int for d in v):
        raise ValueError(f"{what} are not a list of integers")
    return [d["as_int"] for d in v]


def _tensor_meta(m: dict) -> tuple:
    """(dtype, sizes, bytes spanned from the entry's start) of a serialized tensor_meta; ValueError if malformed."""
    if not isinstance(m, dict):
        raise ValueError("tensor_meta is not an object")
    dtype = _SCALAR_TYPES.get(m.get("dtype")) if type(m.get("dtype")) is int else None
    if dtype is None:
        raise ValueError(f"dtype {m.get('dtype')!r} is not one translator.save writes")
    sizes, strides = _ints(m.get("sizes"), "sizes"), _ints(m.get("strides"), "strides")
    off = m.get("storage_offset")
    if not (isinstance(off, dict) and type(off.get("as_int")) is int and off["as_int"] >= 0):
        raise ValueError("storage_offset is not a non-negative integer")
    if len(sizes) != len(strides) or any(d < 0 for d in sizes) or any(st < 0 for st in strides):
        raise ValueError(f"sizes {sizes} and strides {strides} do not describe a tensor")
    if 0 in sizes:
        return dtype, sizes, 0
    span = off["as_int"] + 1 + sum((d - 1) * st for d, st in zip(sizes, strides))
    return dtype, sizes, span * torch.empty((), dtype=dtype).element_size()


def _check_weights(path: Path, z: zipfile.ZipFile) -> None:
    """Every weight / constant entry holds exactly the bytes its tensor metadata spans, and every
    parameter / buffer has the shape and dtype the graph reads (checked before torch reads one)."""
    infos = {i.filename: i for i in z.infolist()}
    top = next(iter(infos)).split("/", 1)[0]
    graph_name = f"{top}/models/model.json"
    try:
        gm = json.loads(z.read(infos[graph_name]))["graph_module"]
        values = gm["graph"]["tensor_values"]
        wanted = {}  # parameter / buffer name -> its graph value's metadata
        for sp in gm["signature"]["input_specs"]:
            for kind, key in (("parameter", "parameter_name"), ("buffer", "buffer_name"), ("tensor_constant", "tensor_constant_name")):
                if kind in sp:
                    wanted[sp[kind][key]] = values[sp[kind]["arg"]["name"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        wanted = {}  # a damaged graph: torch.export.load says so (the weights are still checked here)
    for folder in ("weights", "constants"):
        cfg_name = f"{top}/data/{folder}/model_{folder}_config.json"
        if cfg_name not in infos:
            continue
        need: dict = {}
        for fqn, pm in json.loads(z.read(infos[cfg_name]))["config"].items():  # a dict: _refuse_pickles read it
            try:
                if not isinstance(pm, dict) or not isinstance(pm.get("path_name"), str):
                    raise ValueError("path_name is not a string")
                dtype, sizes, nbytes = _tensor_meta(pm.get("tensor_meta"))
                if fqn in wanted:
                    g_dtype, g_sizes, _ = _tensor_meta({**wanted[fqn], "storage_offset": {"as_int": 0}})
                    if (g_dtype, g_sizes) != (dtype, sizes):
                        raise ValueError(f"it is {str(dtype).removeprefix('torch.')}{sizes} but the graph reads "
                                         f"{str(g_dtype).removeprefix('torch.')}{g_sizes}")
            except ValueError as e:
                raise InputError(f"{path}: {folder[:-1]} {fqn!r} in {cfg_name} is damaged: {e}; save the translated "
                                 "module again") from e
            need[pm["path_name"]] = max(need.get(pm["path_name"], 0), nbytes)
        for name, nbytes in need.items():
            info = infos.get(f"{top}/data/{folder}/{name}")
            if info is None or info.file_size != nbytes:
                got = "missing" if info is None else f"{info.file_size} bytes"
                raise InputError(f"{path}: {folder[:-1]} entry {name} is {got}, but its tensor metadata spans {nbytes} "
                                 "bytes; the file is damaged or was altered (it would load wrong weights) — save the "
                                 "translated module again")


# Every entry translator.save writes, after the archive's top folder. Nothing else is accepted.
_ALLOWED = (
    (re.compile(r"data/weights/weight_\d+"), "raw tensor bytes"),
    (re.compile(r"data/constants/tensor_\d+"), "raw tensor bytes"),
    (re.compile(r"data/(weights|constants)/model_(weights|constants)_config\.json"), "config"),
    (re.compile(r"models/model\.json"), "graph JSON"),
    (re.compile(r"data/sample_inputs/model\.pt"), "empty"),
    (re.compile(r"extra/" + re.escape(META)), "our metadata"),
    (re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"), "small text"),
)


def _refuse_pickles(path: Path, z: zipfile.ZipFile) -> None:
    """torch.export.load unpickles (weights_only=False as a fallback) any weight, constant or
    sample-input entry stored as a pickle, so before torch sees the archive every entry is
    checked by name and kind against what save() writes: one top folder, no duplicate names
    (zip readers disagree on which copy of a duplicate they read), regular files only, an
    empty sample-inputs entry, and weight / constant configs that mark nothing as a pickle."""
    infos = z.infolist()
    names = [i.filename for i in infos]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{path}: entry {dup[0]} appears more than once, which translator.save never writes; "
                         "refusing to load it (a duplicate entry can hide a pickle)")
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        raise InputError(f"{path}: entries lie under {len(tops)} top folders ({', '.join(sorted(tops)[:3])}); "
                         "translator.save writes one; refusing to load it")
    for info in infos:
        rel = info.filename.split("/", 1)[1] if "/" in info.filename else ""
        kind = next((k for rx, k in _ALLOWED if rx.fullmatch(rel)), None)
        if kind is None:
            raise InputError(f"{path}: entry {info.filename} is not one translator.save writes; refusing to load "
                             "the file (torch.export.load may unpickle unknown entries, which can run code)")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise InputError(f"{path}: entry {info.filename} is compressed ({info.compress_size} bytes declared to "
                             f"inflate to {info.file_size}); translator.save stores every entry uncompressed, so "
                             "the file was altered (a compressed entry can inflate without bound); refusing to load it")
        mode = info.external_attr >> 16
        if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):
            raise InputError(f"{path}: entry {info.filename} is not a regular file (a folder or a link); "
                             "translator.save writes only regular files; refusing to load it")
        if kind == "empty" and info.file_size:
            raise InputError(f"{path}: entry {info.filename} is a pickle, which translator.save never writes; "
                             "refusing to load it (unpickling can run code)")
        if kind == "config":
            try:
                cfg = json.loads(z.read(info)).get("config", {})
                pickled = [k for k, v in cfg.items() if not isinstance(v, dict) or v.get("use_pickle", True)]
            except (ValueError, AttributeError) as e:
                raise InputError(f"{path}: {info.filename} is not valid JSON of translator.save ({e})") from e
            if pickled:
                raise InputError(f"{path}: {', '.join(pickled[:3])} stored as pickles, which translator.save never "
                                 "writes; refusing to load them (unpickling can run code)")


def _inputs_from_meta(gm) -> tuple:
    """Zero tensors of each placeholder's example sizes and dtype (a dynamic dim at its example size)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise InputError(f"input {n.name} is not a tensor ({type(v).__name__}); pass example_inputs to save()")
        shape = [int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in v.shape]
        out.append(torch.zeros(shape, dtype=v.dtype))
    return tuple(out)


def _dynamic_spec(gm, dynamic_dims):
    if not dynamic_dims:
        return None
    n = sum(1 for p in gm.graph.nodes if p.op == "placeholder")
    spec = [None] * n
    for i, d in dynamic_dims:
        spec[i] = {**(spec[i] or {}), d: Dim.AUTO}
    return tuple(spec)


def _report_from_dict(d: dict):
    from ..report import Report, Row
    from ..verify import Divergence, OutputCheck, Verification

    v = dict(d.get("verification") or {})
    v["outputs"] = [OutputCheck(**o) for o in v.get("outputs", [])]
    v["divergence"] = Divergence(**v["divergence"]) if v.get("divergence") else None
    fields = {k: d[k] for k in ("model", "arch", "backend", "backend_reason", "precision", "capture",
                                "capture_notes", "counters", "pass_counts", "dynamic_dims", "kernels", "kernel_sources", "ops",
                                "launches") if k in d}
    r = Report(**fields)
    r.rows = [Row(**row) for row in d.get("rows", [])]
    r.verification = Verification(**v) if v else r.verification
    r.dynamic_dims = [tuple(x) for x in r.dynamic_dims]
    return r


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""
