"""Decode attention reads an fp32 K / V cache with a 16-bit q (issue 23; fwd.py KV32).

gpt-fast keeps its KV cache in fp32 buffers; under precision="bf16" the attention ran on bf16 copies of
the whole caches (two cast launches per layer and step). The one-wave (decode) kernel loads fp32 K / V
and rounds them to q's dtype in registers (round to nearest even, as torch's cast): the same bits as
the kernel on the cast caches, with no cast launch. Several waves (prefill past 16 rows) refuse it with
a clear error; the translator casts there (translator/lowerings/attention.py).
"""

from __future__ import annotations

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator_kernels.attention import attention, kv_in_registers
from translator_kernels.errors import KernelInputError


def _run(arch, *args, **kw):
    with executors.current().run(arch) as ex:
        out = attention(*(ex.put(a) for a in args), **{k: ex.put(v) if isinstance(v, torch.Tensor) else v
                                                       for k, v in kw.items()}).cpu()
    return out, ex


@pytest.mark.parametrize("arch,dtype,H,Hkv,Sq,Sk,D,pos,splits", [
    ("gfx942", torch.bfloat16, 4, 2, 1, 160, 64, 140, None),   # packed GQA, cache positions, split plan
    ("gfx950", torch.float16, 4, 4, 3, 70, 40, None, 1),       # Sq 3, padded head dim (fp32 loads of 2 / 1)
])
def test_fp32_kv_equals_the_cast_cache_bit_for_bit(arch, dtype, H, Hkv, Sq, Sk, D, pos, splits):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, Sq, D, generator=g).to(dtype)
    k, v = torch.randn(2, 1, Hkv, Sk, D, generator=g)
    kw = dict(num_splits=splits, q_pos=None if pos is None else torch.tensor([pos]))
    assert kv_in_registers(H, Hkv, Sq)
    out, ex = _run(arch, q, k, v, **kw)
    want, _ = _run(arch, q, k.to(dtype), v.to(dtype), **kw)
    assert len(ex.launches) == 1 and out.dtype == dtype
    assert torch.equal(out, want)


def test_fp32_kv_with_several_waves_is_refused():
    q = torch.randn(1, 2, 40, 32).bfloat16()
    k = torch.randn(1, 2, 40, 32)
    assert not kv_in_registers(2, 2, 40)
    with pytest.raises(KernelInputError, match="one-wave decode kernel only"):
        _run("gfx942", q, k, k.clone())
