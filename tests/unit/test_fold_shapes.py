"""Shape-only subgraphs (masks, position ids) are computed once per input shape and cached; a
folded value that reads a parameter is recomputed when the parameter changes."""

import pytest
import torch
import torch.nn as nn

from translator import translate

from small_models import translate_seeded  # noqa: E402
from translator.passes.fold_shapes import FoldedShapes


class MaskedBlock(nn.Module):
    def __init__(self, d=32, vocab=50):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(64, 64, dtype=torch.bool)))

    def forward(self, ids):
        b, t = ids.shape
        mask = ids.new_ones((b, t))                       # HF: attention_mask of ones
        pos = (mask.cumsum(-1) - 1).clamp(min=0)          # HF: position ids from the mask
        allowed = self.causal[:t, :t] & (mask[:, None, :] > 0)
        bias = torch.where(allowed, 0.0, -1e9)            # additive mask
        h = self.fc(self.emb(ids) + pos.unsqueeze(-1).float())
        return (h @ h.transpose(-1, -2)) + bias


def folded(tm):
    return [m for m in tm.gm.modules() if isinstance(m, FoldedShapes)]


def test_mask_setup_is_folded_and_cached():
    torch.manual_seed(0)
    m = MaskedBlock().eval()
    ids = torch.randint(0, 50, (2, 8))
    tm = translate(m, (ids,), backend="reference")
    assert tm.report.counters.get("fold_shapes", 0) >= 5
    (f,) = folded(tm)
    assert {"new_ones", "cumsum", "where"} <= {s.split("_default")[0] for s in f.sources} | set(f.sources)
    for op in ("cumsum", "new_ones", "where", "bitwise_and"):
        assert f"aten.{op}" not in tm.gm.code  # no longer on the per-forward path
    runs = f.computed
    for _ in range(3):
        torch.testing.assert_close(tm(ids), m(ids))
    assert f.computed == runs  # same shapes: served from the cache
    ids2 = torch.randint(0, 50, (3, 11))  # a new batch and sequence length (dynamic dims)
    torch.testing.assert_close(tm(ids2), m(ids2))
    assert f.computed == runs + 1


def test_each_input_shape_has_its_own_cache_entry():
    m = MaskedBlock().eval()
    tm = translate(m, (torch.randint(0, 50, (2, 8)),), backend="reference")
    (f,) = folded(tm)
    for shape in ((2, 8), (3, 8), (2, 5), (2, 8)):
        ids = torch.randint(0, 50, shape)
        torch.testing.assert_close(tm(ids), m(ids))
    assert len(f._cache) == 3


def test_random_ops_are_never_folded():
    class Noise(nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape[0], 1)

    tm = translate(Noise().eval(), (torch.randn(4, 3),), backend="reference", verify=False)
    assert not folded(tm)


def test_report_says_folded_at_specialization():
    tm = translate(MaskedBlock().eval(), (torch.randint(0, 50, (2, 8)),), backend="reference")
    rows = {r.node: r for r in tm.report.rows}
    (f,) = folded(tm)
    for name in ("cumsum", "where"):
        assert name in f.sources and rows[name].where == "folded" and "folded at specialization" in rows[name].detail


class ParamOnly(nn.Module):
    """`w.exp()` and `scale * 2` read parameters alone: folded, yet a parameter may change later."""

    def __init__(self, d=8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return torch.softmax(x, -1) * (self.scale * 2) + self.w.exp()


@pytest.mark.parametrize("backend", ["reference", "flysim"])
def test_folded_parameter_subgraph_follows_parameter_updates(backend):
    m, x, tm = translate_seeded(ParamOnly, (4, 8), backend=backend)
    (f,) = folded(tm)
    assert sorted(f.sources) == ["exp", "mul"]  # scale * 2 and w.exp(): parameters alone
    torch.testing.assert_close(tm(x), m(x))
    runs = f.computed
    torch.testing.assert_close(tm(x), m(x))
    assert f.computed == runs  # unchanged parameters: served from the cache
    m.load_state_dict({k: v * 0.5 + 1 for k, v in m.state_dict().items()})  # (a) new values
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x))
        assert f.computed == runs + 1
        m.w.mul_(2)  # (b) an in-place update (an optimizer step)
        torch.testing.assert_close(tm(x), m(x))
        assert f.computed == runs + 2
    if backend == "flysim":
        assert tm.last_launches  # the softmax and the elementwise region still run as kernels


class LateShapeRead(nn.Module):
    """Mixtral's router: a causal mask (shape-only, read early) and, after a data-dependent sort, an
    `empty_like` of the sort's output (shape-only too, but its input exists only late). One folded
    call cannot serve both, so each gets its own; before, the early mask, the position ids and the
    rotary-like cos stayed in PyTorch per forward ("no FlyDSL lowering for aten.mul")."""

    def forward(self, x):
        t = x.shape[1]
        pos = torch.arange(t).float() * 0.5
        bias = torch.where(torch.ones(t, t, dtype=torch.bool).tril(), 0.0, -1e9)
        h = torch.softmax(x @ x.transpose(-1, -2) + bias, -1) @ x + pos.cos()[:, None]
        order = torch.sort(h.sum(-1), -1).values
        return h, order + torch.zeros_like(order).fill_(1.0).sum(-1, keepdim=True)


def test_value_read_before_a_late_input_is_folded_in_a_call_of_its_own():
    m = LateShapeRead().eval()
    x = torch.randn(2, 8, 16)
    tm = translate(m, (x,), backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    assert len(folded(tm)) == 2
    assert tm.report.counters.get("fold_shapes", 0) >= 5
    rows = {r.node: r for r in tm.report.rows}
    for name in ("arange", "mul", "cos", "tril", "where"):
        assert rows[name].where == "folded", (name, rows[name].detail)
    for shape in ((2, 8, 16), (3, 5, 16)):
        x = torch.randn(shape)
        torch.testing.assert_close(tm(x), m(x))


class ContinuousPositionBias(nn.Module):
    """Swin-V2's continuous position bias: an MLP over a constant coordinate table (GEMMs whose
    preshuffled weights are constants the lowering adds late in the graph), folded in one call with
    a position offset read early. The call went before the weight's get_attr: an internal error."""

    def __init__(self, d=32):
        super().__init__()
        self.register_buffer("table", torch.randn(16, d))
        self.cpb = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 16))
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        pos = torch.arange(x.shape[-1]).float() * 0.25
        h = self.fc(x + pos)
        return h + 16 * torch.sigmoid(self.cpb(self.table))


def test_folded_call_comes_after_the_constants_it_reads():
    m, x, tm = translate_seeded(ContinuousPositionBias, (2, 16, 16), backend="reference")
    assert tm.report.verification.passed, tm.report.verification.message
    (f,) = folded(tm)
    assert {"arange", "sigmoid"} <= set(f.sources) and tm.report.counters.get("folded_gemm", 0) == 2
    for shape in ((2, 16, 16), (3, 16, 16)):
        x = torch.randn(shape)
        torch.testing.assert_close(tm(x), m(x))


def test_a_constant_freed_and_remade_at_the_same_address_is_seen():
    """The cache's constant stamp was (id, data_ptr, version): a tensor freed and a new one made where it
    was (same object address, its storage in the freed block, version 0 again, as `load_state_dict(
    assign=True)` of a fresh tensor does) matched all three, and the folded region served the old
    tensor's results. CPython and the allocator hand the freed blocks straight back, so this happens
    on most tries below (asserted); every try must see the new values. A loaded pytest worker can
    allocate in between (0 collisions in 20 tries once in a full run): the loop goes on, up to 400
    tries, until the case has happened a few times."""
    g = torch.fx.Graph()
    x, c = g.placeholder("x"), g.placeholder("c")
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (c, 2.0)),))
    f = FoldedShapes(torch.fx.GraphModule(torch.nn.Module(), g), ["mul"], n_constants=1)
    inp, collisions = torch.zeros(3), 0
    for trial in range(400):
        if trial >= 20 and collisions >= 3:
            break
        a = torch.full((1000,), float(trial))
        where = id(a), a.data_ptr()
        f(inp, a)
        del a
        b = torch.full((1000,), trial + 100.0)
        collisions += (id(b), b.data_ptr()) == where
        assert torch.equal(f(inp, b)[0], b * 2), f"try {trial}: the freed tensor's cached result was served"
        del b
    assert collisions  # the case under test happened
