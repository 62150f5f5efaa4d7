"""translator_kernels.packer: a planned launch's arguments packed by us are the bytes FlyDSL's own
CompiledFunction call packs, slot for slot, as the recorder at the lowest layer (in place of the
host function) sees them; where FlyDSL's internals are not as expected, FlyDSL's call runs."""

import ctypes
import logging

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.registry import FAMILIES
from translator.runtime.stub import rocm_recorded
from translator_kernels import launch as kl
from translator_kernels import packer, replay
from translator_kernels.attention import attention
from translator_kernels.gemm import bmm, gemm
from translator_kernels.gemm.preshuffle import shuffle_weight
from translator_kernels.gemm.tiles import GemmConfig
from translator_kernels.rows.softmax import build_softmax, softmax

ARCH = "gfx942"


class SlotBytes(list):
    """A device-call recorder keeping every slot's bytes (sizes from the compiled call spec)."""

    wants_spec = True

    def __call__(self, name, packed, spec):
        assert len(packed) == len(spec)
        self.append((name, [ctypes.string_at(packed[i], ctypes.sizeof(c)) for i, (_, c, _) in enumerate(spec)]))

    def normalized(self, tensors):
        """Pointers (8-byte slots) as (which tensor's storage, byte offset), or the order in which an
        address unknown to the test (a buffer the call allocated) first appeared."""
        spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), j) for j, t in enumerate(tensors)]
        fresh, out = {}, []
        for name, slots in self:
            row = []
            for b in slots:
                v = int.from_bytes(b, "little") if len(b) == 8 else None
                hit = next(((j, v - p) for p, n, j in spans if v is not None and p <= v < p + max(n, 1)), None)
                if hit is not None:
                    row.append(("tensor", *hit))
                elif v and v > 1 << 32:  # an address of a buffer the call made
                    row.append(("fresh", fresh.setdefault(v, len(fresh))))
                else:
                    row.append(b)
            out.append((name, row))
        return out


def _leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _replayed(fn, args, kwargs, use_packer):
    """What the recorder saw on the third call (a plan replay), normalized; and the plan's launches."""
    packer.ENABLED = use_packer
    replay.clear_replays()
    rec = SlotBytes()
    try:
        with rocm_recorded(ARCH, rec):
            for _ in range(2):  # first sight, then the plan is built
                replay.call(fn, args, kwargs, True)
            rec.clear()
            out = replay.call(fn, args, kwargs, True)
    finally:
        packer.ENABLED = True
    run = next(r for k, r in replay._REPLAYS.items() if k[0] is fn and r is not None)
    launches = [c.cell_contents for c in run.__closure__ if isinstance(c.cell_contents, kl.ReplayedLaunch)]
    return rec.normalized(_leaves((args, kwargs)) + _leaves(out)), launches


def _check_same_bytes(fn, args, kwargs=None):
    theirs, plain = _replayed(fn, args, kwargs, use_packer=False)
    ours, packed = _replayed(fn, args, kwargs, use_packer=True)
    assert theirs, "the call launched nothing"
    assert not any(isinstance(x, kl.PackedLaunch) for x in plain)
    assert packed and all(isinstance(x, kl.PackedLaunch) for x in packed), "our packer did not pack this launch"
    assert ours == theirs


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_plan_packs_flydsls_bytes(name):
    fam = FAMILIES[name]
    _check_same_bytes(fam.kernel, fam.sample_inputs(torch.float32))


@pytest.mark.parametrize("case", ["gemm_epilogue_residual", "gemm_split_k", "bmm_shuffled", "attention_split_kv",
                                  "attention_bool_mask", "softmax_strided_view", "view_at_an_offset"])
def test_variant_plans_pack_flydsls_bytes(case):
    g = torch.Generator().manual_seed(3)
    a, w = torch.randn(5, 64, generator=g), torch.randn(48, 64, generator=g)
    if case == "gemm_epilogue_residual":
        _check_same_bytes(gemm.__wrapped__, (a, shuffle_weight(w), 48, 64),
                          dict(bias=torch.randn(48, generator=g), activation="gelu", residual=torch.randn(5, 48), scale=0.5))
    elif case == "gemm_split_k":
        a, w = torch.randn(2, 256, generator=g), torch.randn(48, 256, generator=g)
        _check_same_bytes(gemm.__wrapped__, (a, shuffle_weight(w), 48, 256), dict(_config=GemmConfig(16, 64, 64, 2)))
    elif case == "bmm_shuffled":
        _check_same_bytes(bmm.__wrapped__, (torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, 24, generator=g)))
    elif case == "attention_split_kv":
        q, kv = torch.randn(1, 2, 1, 32, generator=g), torch.randn(1, 2, 64, 32, generator=g)
        _check_same_bytes(attention.__wrapped__, (q, kv, kv), dict(num_splits=2))
    elif case == "attention_bool_mask":
        q, kv = torch.randn(1, 2, 8, 32, generator=g), torch.randn(1, 2, 16, 32, generator=g)
        _check_same_bytes(attention.__wrapped__, (q, kv, kv), dict(mask=torch.rand(8, 16, generator=g) > 0.3))
    elif case == "softmax_strided_view":  # an argument that is itself a strided view at an offset
        x = torch.randn(9, 300, generator=g)[1:, 22:278]
        _check_same_bytes(softmax.__wrapped__, (x,))
    else:  # a view the adapter makes: its pointer is its root's plus the view's bytes, no view is made
        launcher = build_softmax(256, "f32", 4, False, ARCH)

        def rows_after_the_first(x):
            out = torch.empty(4, 256)
            kl.call(launcher, x[1:], out, 4)
            return out

        _check_same_bytes(rows_after_the_first, (torch.randn(5, 256, generator=g),))
        run = next(r for k, r in replay._REPLAYS.items() if k[0] is rows_after_the_first and r is not None)
        assert "i0.data_ptr() + 1024" in run.source and "as_strided" not in run.source


def test_unexpected_flydsl_falls_back_to_its_own_call(monkeypatch, caplog):
    monkeypatch.setattr(packer, "_FLYDSL_REASON", "flydsl 9.9 is not 0.5.0, whose call state this packer reads")
    monkeypatch.setattr(packer, "_REPORTED", set())
    replay.clear_replays()
    x = torch.randn(4, 256)
    with caplog.at_level(logging.INFO, logger="translator_kernels.packer"), rocm_recorded(ARCH) as rec:
        for _ in range(3):
            softmax(x)
    assert list(rec) == [rec[0]] * 3 and rec[0][0] == "softmax"
    assert "flydsl 9.9 is not 0.5.0" in caplog.text
    run = next(r for k, r in replay._REPLAYS.items() if r is not None and "softmax" in k[0].__qualname__)
    assert "data_ptr" not in run.source  # FlyDSL's call, with the tensors
    replay.clear_replays()


@pytest.mark.flysim_only("flysim's compiled function is not FlyDSL's: its replay calls it")
def test_flysim_replays_with_its_own_call():
    replay.clear_replays()
    x = torch.randn(4, 256)
    with executors.current().run(ARCH) as sim:
        outs = [softmax(x) for _ in range(3)]
    assert len(sim.launches) == 3
    for y in outs:
        torch.testing.assert_close(y, torch.softmax(x, -1))
    run = next(r for k, r in replay._REPLAYS.items() if r is not None and "softmax" in k[0].__qualname__)
    assert "data_ptr" not in run.source
    assert packer.unavailable(object(), (), 0, False).startswith("object is not FlyDSL's CompiledFunction")
