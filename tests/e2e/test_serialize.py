"""What a translation leaves for the user: translator.save / translator.load, torch.export of
translated modules, refusal of files that are not ours (or that carry pickles), and
report.html (structure always; rendering in a real headless Chromium from the OS packages:
apt-get install chromium-headless-shell)."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from html.parser import HTMLParser

import pytest
import torch
from translator.tolerances import model_tol
import torch.nn as nn

import translator
from translator import InputError
from translator.report.html import flops_by_family, render_html

from small_models import Block  # noqa: E402


def load_refused(path, match=None, **kw):
    """translator.load(path, **kw) raises one InputError (its message matching `match`)."""
    with pytest.raises(InputError, match=match):
        translator.load(path, **kw)


def _entries(good):
    """(name, bytes) of each entry of the zip archive `good`, in order."""
    with zipfile.ZipFile(good) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


@pytest.fixture(scope="module")
def translated():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 32)
    return m, x, translator.translate(m, (x,), backend="reference")


def flydsl_targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "flydsl" in str(n.target)]


def test_torch_export_of_translated_module(translated):
    m, x, tm = translated
    ep = torch.export.export(tm, (x,), strict=False)
    assert any("flydsl.gemm" in t for t in flydsl_targets(ep.graph_module))
    torch.testing.assert_close(ep.module()(x), m(x), **model_tol(check="few_ops"))


def test_save_load_round_trip_keeps_ops_weights_report_and_dynamic_dims(translated, tmp_path):
    m, x, tm = translated
    p = translator.save(tm, tmp_path / "block.pt2")
    tm2 = translator.load(p)
    assert isinstance(tm2, translator.TranslatedModule)
    assert tm2.backend == "reference" and tm2.arch == tm.arch
    assert sorted(flydsl_targets(tm2.gm)) == sorted(flydsl_targets(tm.gm))
    assert tm2.report.headline() == tm.report.headline()
    assert tm2.report.verification.passed
    with torch.no_grad():
        torch.testing.assert_close(tm2(x), m(x), **model_tol(check="few_ops"))
        x2 = torch.randn(3, 5, 32)  # batch and sequence were captured as dynamic
        torch.testing.assert_close(tm2(x2), m(x2), **model_tol(check="few_ops"))
    # preshuffled weights are in the archive as raw bytes, and nothing is pickled
    with zipfile.ZipFile(p) as z:
        cfg = json.loads(z.read(next(n for n in z.namelist() if n.endswith("model_weights_config.json"))))
        assert any(k.startswith("_flydsl_") for k in cfg["config"])
        assert not any(v["use_pickle"] for v in cfg["config"].values())
        assert all(i.file_size == 0 for i in z.infolist() if i.filename.endswith(".pt"))


def test_load_on_another_backend(translated, tmp_path):
    m, x, tm = translated
    p = translator.save(tm, tmp_path / "b.pt2")
    load_refused(p, match="needs an AMD GPU", backend="rocm")


def test_refuses_files_that_are_not_ours(translated, tmp_path):
    m, x, tm = translated
    plain = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(m, (x,)), str(plain))
    load_refused(plain, match="not a file written by translator.save")
    pickled = tmp_path / "weights.pt"
    torch.save(m.state_dict(), pickled)
    load_refused(pickled, match="not a file written by translator.save")
    text = tmp_path / "model.onnx"
    text.write_text("hello")
    load_refused(text, match="not a zip archive")
    load_refused(tmp_path / "missing.pt2", match="no such file")
    with pytest.raises(InputError, match="takes a TranslatedModule"):
        translator.save(m, tmp_path / "x.pt2")


def test_refuses_an_archive_with_pickles_or_a_damaged_graph(translated, tmp_path):
    m, x, tm = translated
    good = translator.save(tm, tmp_path / "good.pt2")
    entries = dict(_entries(good))
    sample = next(n for n in entries if n.endswith("sample_inputs/model.pt"))

    def write(name, changes):
        p = tmp_path / name
        with zipfile.ZipFile(p, "w") as z:
            for k, v in {**entries, **changes}.items():
                z.writestr(k, v)
        return p

    load_refused(write("pickle.pt2", {sample: b"\x80\x04N."}), match="is a pickle")
    graph = next(n for n in entries if n.endswith("models/model.json"))
    load_refused(write("damaged.pt2", {graph: entries[graph][: len(entries[graph]) // 2]}), match="could not read the graph")
    truncated = tmp_path / "truncated.pt2"
    truncated.write_bytes(good.read_bytes()[:1000])
    load_refused(truncated)


def test_load_refuses_duplicate_unknown_and_linked_entries(translated, tmp_path, monkeypatch):
    """The attack: two copies of model_constants_config.json. torch reads the first (marking a
    constant as a pickle, unpickled with weights_only=False); a check reading the last copy
    passes. load must refuse before torch sees the archive, and never unpickle anything."""
    m, x, tm = translated
    entries = _entries(translator.save(tm, tmp_path / "good.pt2"))
    names = [n for n, _ in entries]
    top = names[0].split("/", 1)[0]

    def write(name, items):
        p = tmp_path / name
        with zipfile.ZipFile(p, "w") as z, __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore")  # zipfile warns on duplicate names
            for k, v in items:
                z.writestr(k if isinstance(k, zipfile.ZipInfo) else k, v)
        return p

    import pickle
    unpickled = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: unpickled.append(a) or None)
    evil_cfg = json.dumps({"config": {"c": {"path_name": "tensor_0", "is_param": False, "use_pickle": True}}})
    cfg = f"{top}/data/constants/model_constants_config.json"
    honest = dict(entries)[cfg] if cfg in names else json.dumps({"config": {}}).encode()
    dup = [(n, v) for n, v in entries if n != cfg] + [(cfg, evil_cfg), (cfg, honest)]
    load_refused(write("dup.pt2", dup), match="more than once")
    load_refused(write("extra.pt2", entries + [(f"{top}/data/custom_objects/obj_0", b"\x80\x04N.")]), match="not one translator.save writes")
    link = zipfile.ZipInfo(f"{top}/data/weights/weight_999")
    link.external_attr = (0o120777 << 16)  # a symlink entry
    load_refused(write("link.pt2", entries + [(link, b"/etc/passwd")]), match="not a regular file")
    load_refused(write("two.pt2", entries + [("other/archive_format", b"pt2")]), match="top folders")
    assert not unpickled


def test_load_refuses_metadata_without_its_fields(translated, tmp_path):
    m, x, tm = translated
    good = translator.save(tm, tmp_path / "good.pt2")
    entries = dict(_entries(good))
    meta_name = next(n for n in entries if n.endswith("flydsl_translator.json"))
    meta = json.loads(entries[meta_name])
    del meta["report"]
    p = tmp_path / "nometa.pt2"
    with zipfile.ZipFile(p, "w") as z:
        for k, v in {**entries, meta_name: json.dumps(meta)}.items():
            z.writestr(k, v)
    load_refused(p, match="report")


# ---- report.html --------------------------------------------------------------------------------

class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 16)
        self.ln = nn.LayerNorm(16)

    def forward(self, x):
        return torch.softmax(self.ln(self.fc(torch.relu(self.conv(x)).flatten(1))), -1)


@pytest.fixture(scope="module")
def small_report():
    torch.manual_seed(0)
    m = Small().eval()
    return translator.translate(m, (torch.randn(2, 3, 8, 8),), backend="reference", name="small <&> model").report


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_html_has_chart_table_and_reasons(small_report):
    html = render_html(small_report)
    p = Collect()
    p.feed(html)
    assert "script" not in p.tags and "http" not in html.split("xmlns")[0]  # no scripts, no network
    assert p.tags.count("rect") == len(flops_by_family(small_report)) >= 2
    text = "".join(p.text)
    assert "flydsl.gemm" in text and "aten.conv2d" in text
    assert "kept in PyTorch by design" in text  # the conv's fallback reason
    assert "small <&> model" in text and "small <&> model" not in html  # escaped
    fams = dict(((f, w), n) for f, w, n in flops_by_family(small_report))
    assert sum(fams.values()) == sum(r.flops for r in small_report.rows)


BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def test_html_renders_in_headless_chromium(small_report, tmp_path):
    exe = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    assert exe, "no headless Chromium: `./run setup` installs chromium-headless-shell (apt-get)"
    page = tmp_path / "report.html"
    page.write_text(render_html(small_report), encoding="utf-8")
    shot = tmp_path / "shot.png"
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(common + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<svg" in dom.stdout and "flydsl.gemm" in dom.stdout and "</table>" in dom.stdout
    for bad in ("Uncaught", "SyntaxError", "ReferenceError"):
        assert bad not in dom.stderr
    out = subprocess.run(common + [f"--screenshot={shot}", "--window-size=1000,800", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shot.exists() and shot.stat().st_size > 5000


# ---- load cannot be made to hang, inflate without bound or read wrong weights ----------------------

def _rewrite(p, items, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(p, "w", compression=compress) as z:
        for k, v in items:
            z.writestr(k, v)
    return p


def test_load_refuses_a_fifo_and_a_link_to_a_device(tmp_path):
    """Opening a FIFO blocks until a writer comes; /dev/zero never ends: both hung load forever."""
    import os

    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    load_refused(fifo, match="FIFO")
    link = tmp_path / "zero.pt2"
    link.symlink_to("/dev/zero")
    load_refused(link, match="a device.*not a regular file")
    load_refused(tmp_path, match="a folder")


def test_load_refuses_a_zip_bomb_before_inflating_it(translated, tmp_path):
    """A weight entry deflated from 300 MB of zeros: refused from its declared sizes alone (fast: the
    entry is never inflated), where torch inflated it and loaded wrong weights."""
    import time
    import zlib

    m, x, tm = translated
    items = _entries(translator.save(tm, tmp_path / "good.pt2"))
    name = next(n for n, _ in items if n.endswith("data/weights/weight_0"))
    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w") as z:
        for k, v in items:
            if k != name:
                z.writestr(k, v)
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as f:  # streamed: 300 MB never held in memory
            chunk = bytes(1 << 24)
            for _ in range(18):
                f.write(chunk)
    assert bomb.stat().st_size < 2_000_000
    t = time.perf_counter()
    load_refused(bomb, match="compressed")
    assert time.perf_counter() - t < 5


def test_load_refuses_weight_entries_that_do_not_match_their_metadata(translated, tmp_path):
    m, x, tm = translated
    items = _entries(translator.save(tm, tmp_path / "good.pt2"))
    name = next(n for n, _ in items if n.endswith("data/weights/weight_0"))
    for label, data in (("short", lambda v: v[: len(v) // 2]), ("long", lambda v: v + v), ("empty", lambda v: b"")):
        bad = _rewrite(tmp_path / f"{label}.pt2", [(k, data(v) if k == name else v) for k, v in items])
        load_refused(bad, match="spans .* bytes")


def test_load_refuses_wrong_metadata_types_and_shapes(translated, tmp_path):
    m, x, tm = translated
    items = _entries(translator.save(tm, tmp_path / "good.pt2"))
    cfg_name = next(n for n, _ in items if n.endswith("model_weights_config.json"))
    cfg = json.loads(dict(items)[cfg_name])
    fqn = next(iter(cfg["config"]))

    def with_cfg(label, change):
        c = json.loads(json.dumps(cfg))
        change(c["config"][fqn]["tensor_meta"])
        return _rewrite(tmp_path / f"{label}.pt2", [(k, json.dumps(c) if k == cfg_name else v) for k, v in items])

    def transpose(tm_):  # same bytes, another shape than the graph reads
        tm_["sizes"] = tm_["sizes"][::-1] if len(tm_["sizes"]) > 1 else [{"as_int": 1}] + tm_["sizes"]
        tm_["strides"] = [{"as_int": 1}] * len(tm_["sizes"])

    for label, change, msg in (("dtype", lambda t: t.update(dtype="float"), "dtype"),
                               ("sizes", lambda t: t.update(sizes=[{"as_int": "8"}]), "sizes"),
                               ("offset", lambda t: t.update(storage_offset=-4), "storage_offset"),
                               ("shape", transpose, "graph reads")):
        load_refused(with_cfg(label, change), match=msg)
    meta_name = next(n for n, _ in items if n.endswith("flydsl_translator.json"))
    meta = json.loads(dict(items)[meta_name])
    for key, value in (("input_spec", [["2", 8]]), ("arch", 942), ("report", [])):
        p = _rewrite(tmp_path / f"meta_{key}.pt2",
                     [(k, json.dumps({**meta, key: value}) if k == meta_name else v) for k, v in items])
        load_refused(p, match=f"{key} has the wrong type")
    p = _rewrite(tmp_path / "rows.pt2", [(k, json.dumps({**meta, "report": {**meta["report"], "rows": [{"x": 1}]}})
                                          if k == meta_name else v) for k, v in items])
    load_refused(p, match="saved report is damaged")
