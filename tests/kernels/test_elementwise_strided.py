"""The generated elementwise kernel reads strided inputs in place (issue 23's RoPE adapter: its
inputs are column slices of the QKV output): a column slice, a transpose, an expanded view and a
offset slice, mixed with contiguous and broadcast inputs, give eager's values with no copy of any
input (the kernel is handed each input's own storage) and one launch; 128-bit vectors
stay where a strided input keeps unit inner stride and whole-vector outer strides."""

import pytest
import torch

import flysim
from translator.tolerances import op_tol
from translator_kernels.codegen.elementwise import flat_inputs, fused_elementwise
from translator_kernels.program import Program, plan


def _mul_add(a, b, c):  # a * b + c
    prog = Program(3, (("mul", (0, 1), ()), ("add", (3, 2), ())), ((4, "f32"),))
    flat, _ = flat_inputs([a, b, c])  # what the kernel is given: each input's own storage, never a copy
    assert all(f.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for f, t in zip(flat, (a, b, c)))
    with flysim.simulate(arch="gfx942") as sim:
        (out,) = fused_elementwise([a, b, c], prog.text())
    assert len(sim.launches) == 1
    torch.testing.assert_close(out, a * b + c, **op_tol(torch.float32, "fused_elementwise"))
    assert out.is_contiguous()


@pytest.mark.parametrize("form", ["column_slice", "transpose", "expanded", "offset_slice"])
def test_strided_inputs_are_read_in_place(form):
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 5, 48, generator=g)
    if form == "column_slice":  # RoPE's q of a fused QKV output, [B, S, H, D] viewed from [B, S, 48]
        a = qkv[..., 16:32].view(2, 5, 2, 8)
    elif form == "transpose":
        a = torch.randn(2, 2, 5, 8, generator=g).transpose(1, 2)
    elif form == "expanded":
        a = torch.randn(2, 1, 2, 8, generator=g).expand(2, 5, 2, 8)
    else:  # a slice of pairs at a non-vector offset: scalar reads
        a = qkv[..., 1:33:2].view(2, 5, 2, 8)
    b = torch.randn(1, 5, 1, 8, generator=g)  # the rotary table, broadcast over batch and heads
    c = torch.randn(2, 5, 2, 8, generator=g)
    _mul_add(a, b, c)


def test_vectors_kept_for_a_unit_stride_slice_and_dropped_for_a_strided_one():
    ok = plan((2, 5, 2, 8), [(2, 5, 2, 8)], ["f32"], ["f32"], lambda v: True, [(240, 48, 8, 1)])
    assert ok.vec == 4
    odd = plan((2, 5, 2, 8), [(2, 5, 2, 8)], ["f32"], ["f32"], lambda v: True, [(240, 48, 16, 2)])
    assert odd.vec == 1
