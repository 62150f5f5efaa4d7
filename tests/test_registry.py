"""Every registered FlyDSL op: its kernel (run by flysim) matches its reference on the
family's sample inputs, within the one tolerance table; the fake implementation agrees
with the real output's shape and dtype; the registry is well-formed."""

from __future__ import annotations

import pytest
import torch

from translator import runtime
import translator.lowerings  # noqa: F401  (fills the registry)
from translator.registry import FAMILIES, RULES
from translator.report.ops_table import supported_ops_markdown
from translator.tolerances import op_tolerance

CASES = [(name, dt) for name in sorted(FAMILIES) for dt in (torch.float32, torch.bfloat16)]


def _run(fam, args, backend):
    with runtime.use_backend(backend, "gfx942"):
        return fam.op(*args)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_kernel_matches_reference_on_flysim(name, dtype):
    fam = FAMILIES[name]
    args = fam.sample_inputs(dtype)
    ref = _run(fam, args, "reference")
    got = _run(fam, args, "flysim")
    atol, rtol = op_tolerance(dtype, fam)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fake_matches_reference_metadata(name):
    fam = FAMILIES[name]
    args = fam.sample_inputs(torch.float32)
    ref = _run(fam, args, "reference")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = fam.op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    for f, r in zip(fake if isinstance(fake, (list, tuple)) else [fake], ref if isinstance(ref, (list, tuple)) else [ref]):
        assert tuple(f.shape) == tuple(r.shape) and f.dtype == r.dtype


def test_every_rule_names_a_family_and_has_a_doc():
    for r in RULES:
        assert r.family in FAMILIES, r.name
        assert r.doc, f"rule {r.name} has no doc"
    table = supported_ops_markdown()
    assert all(f"`flydsl.{n}`" in table for n in FAMILIES)
