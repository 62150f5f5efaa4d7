"""A model changed after translate(): each change is followed or is a clear error, never a silent
wrong answer (issue 24 item 2), and the translator watches only what it translated (issue 30 item 1).

Before: `m.double()` / `m.half()` re-point every parameter's storage (`param.data = ...`), which
moves no version counter, and the translated module returned fp32 outputs off by ~1.0 on both
backends; importing the translator installed torch's global module registration hooks, which
dynamo traced, so a compiled module that registers a buffer in forward recompiled on every call.
"""

import pytest
import torch
import torch.nn as nn

from translator import translate
from translator.errors import TranslatorError
from translator.tolerances import model_tol


class Tied(nn.Module):
    """A GEMM (preshuffled weight), a bias read directly, and a head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.fc = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.emb.weight
        with torch.no_grad():
            self.emb.weight.mul_(0.2)

    def forward(self, ids):
        return self.head(torch.tanh(self.fc(self.emb(ids))))


@pytest.fixture(scope="module", params=["reference", "flysim"])
def pair(request):
    torch.manual_seed(0)
    m = Tied().eval()
    ids = torch.randint(0, 64, (2, 8))
    tm = translate(m, (ids,), backend=request.param)
    assert tm.report.verification.passed
    return m, tm, ids


def _same(tm, m, ids):
    with torch.no_grad():
        got, want = tm(ids), m(ids)
    torch.testing.assert_close(got, want, **model_tol())
    if tm.backend == "flysim":
        assert tm.last_launches  # the FlyDSL kernels ran
    return got


@pytest.mark.parametrize("convert", ["double", "half", "bfloat16"])
def test_converted_model_is_a_clear_error_until_converted_back(pair, convert):
    m, tm, ids = pair
    _same(tm, m, ids)
    getattr(m, convert)()
    try:
        for _ in range(2):  # on every call, not only the first
            with pytest.raises(TranslatorError, match=r"is now a tensor of shape .*convert it back, or translate again"):
                tm(ids)
    finally:
        m.float()
    _same(tm, m, ids)  # rounded through the other dtype: the prepared copies are rebuilt from the new values


def test_translated_module_converted_and_back(pair):
    m, tm, ids = pair
    tm.double()
    try:
        with pytest.raises(TranslatorError, match="float64.*translate again"):
            tm(ids)
    finally:
        tm.float()
    _same(tm, m, ids)


def test_data_re_pointed_on_a_tied_parameter_is_followed(pair):
    """`.data` re-pointed on a Parameter two modules share (embedding and head): a new storage, no
    version bump; the head's preshuffled copy is rebuilt from it."""
    m, tm, ids = pair
    before = _same(tm, m, ids)
    m.emb.weight.data = torch.randn(64, 32) / 5
    after = _same(tm, m, ids)
    assert not torch.allclose(before, after)
    m.fc.weight.data = torch.randn(32, 32) / 5  # a GEMM weight re-pointed alone
    _same(tm, m, ids)
    keep = m.fc.weight.data
    m.fc.weight.data = torch.randn(32, 16)  # another shape
    try:
        with pytest.raises(TranslatorError, match=r"fc\.weight is now a tensor of shape \[32, 16\]"):
            tm(ids)
    finally:
        m.fc.weight.data = keep
    _same(tm, m, ids)


def test_load_state_dict_assign_of_another_dtype_is_a_clear_error(pair):
    m, tm, ids = pair
    sd = {k: v.clone() for k, v in m.state_dict().items()}

    def tied(values):  # the head and the embedding stay one Parameter (untying them is its own clear error)
        values = {k: nn.Parameter(v, requires_grad=False) for k, v in values.items()}
        values["head.weight"] = values["emb.weight"]
        return values

    m.load_state_dict(tied({k: v.half() for k, v in sd.items()}), assign=True)
    try:
        with pytest.raises(TranslatorError, match="float16.*translate again"):
            tm(ids)
    finally:
        m.load_state_dict(tied({k: v * 1.5 for k, v in sd.items()}), assign=True)
    _same(tm, m, ids)  # assign=True of the translation's dtype: followed (new values)


def test_write_through_data_needs_refresh_weights(pair):
    m, tm, ids = pair
    stale = _same(tm, m, ids)
    with torch.no_grad():
        m.fc.weight.data.copy_(torch.randn(32, 32) / 5)  # `.data` has a version counter of its own: not seen
        torch.testing.assert_close(tm(ids), stale, rtol=0, atol=0)
    assert tm.refresh_weights() >= 1  # the one call that re-reads everything
    _same(tm, m, ids)


def test_storage_freed_and_reallocated_at_the_same_address():
    """A caching allocator hands a freed block straight back: a parameter re-pointed twice between two
    forwards can end at its old address. The storage's death is noted, so the copies made from it
    are rebuilt (a data-pointer comparison alone would call it unchanged)."""
    from translator import weights
    from translator.state import _PREPARED, _stamp

    torch.manual_seed(1)
    m = nn.Linear(16, 16).eval()
    x = torch.randn(3, 16)
    tm = translate(m, (x,), backend="reference", verify=False)
    assert _PREPARED[tm.gm].entries  # the preshuffled weight
    t = weights._TRACKED[id(tm.gm)]
    assert t.unchanged()
    ptr = m.weight.data_ptr()
    m.weight.data = torch.randn(16, 16) / 4  # new values; the first storage dies here
    assert t.moved and not t.unchanged()
    # as if the new storage had come at the old address: every pointer comparison says "unchanged"
    t.ptrs = list(map(torch.Tensor.data_ptr, t.objs))
    table = _PREPARED[tm.gm]
    for entry in table.entries:
        entry[3] = _stamp(entry[2])
    table.stamp = _stamp(table.sources)
    assert m.weight.data_ptr() != ptr and not t.unchanged()  # its death alone says "look"
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **model_tol(check="few_ops"))


def test_importing_the_translator_installs_no_global_hooks():
    import importlib

    from torch.nn.modules import module as mm

    hooks = (mm._global_parameter_registration_hooks, mm._global_buffer_registration_hooks,
             mm._global_module_registration_hooks)
    importlib.import_module("translator.api")
    importlib.import_module("translator.weights")
    ours = [h for d in hooks for h in d.values() if getattr(h, "__module__", "").startswith("translator")]
    assert not ours, ours


def test_compiled_module_registering_a_buffer_does_not_recompile_per_call():
    """HF's static cache registers buffers inside the compiled region; with the translator imported,
    dynamo guarded on its registration counter and compiled a new graph on every call."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import translator.api  # noqa: F401

    class Registers(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            self.register_buffer("scratch", torch.zeros_like(x), persistent=False)
            return self.lin(x) + self.scratch

    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(Registers(), backend="eager")
    for _ in range(2):  # the first call has no buffer yet, the second has: one graph each
        f(torch.randn(2, 8))
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(4):
        f(torch.randn(2, 8))
    assert counters["stats"]["unique_graphs"] == graphs <= 2
    torch._dynamo.reset()


def test_hf_static_cache_generation_compiles_two_graphs_with_the_translator_imported():
    """Issue 30's recipe (a tiny Llama, the forward compiled, `cache_implementation="static"`), with
    dynamo's own eager backend: on main 8 graphs for 12 tokens (the recompile limit), one per call."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import translator.api  # noqa: F401

    from hf_tiny import tiny_llama

    m = tiny_llama()
    ids = torch.randint(0, 128, (1, 8))
    want = m.generate(ids, max_new_tokens=12, do_sample=False, cache_implementation="static")
    torch._dynamo.reset()
    counters.clear()
    m.forward = torch.compile(m.forward, backend="eager")
    try:
        got = m.generate(ids, max_new_tokens=12, do_sample=False, cache_implementation="static")
        assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # prefill and decode
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, want)
