"""The generated elementwise kernel reads strided inputs in place (issue 23's RoPE adapter: its
inputs are column slices of the QKV output): a column slice, a transpose, an expanded view and a
offset slice, mixed with contiguous and broadcast inputs, give eager's values with no copy of any
input (the kernel is handed each input's own storage) and one launch; 128-bit vectors
stay where a strided input keeps unit inner stride and whole-vector outer strides. Run on the session's
executor (tests/executors.py): the views are taken of tensors already where it reads them."""

import pytest
import torch

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.codegen.elementwise import flat_inputs, fused_elementwise
from translator_kernels.program import Program, geometry


def _mul_add(a, b, c):  # a * b + c
    prog = Program(3, (("mul", (0, 1), ()), ("add", (3, 2), ())), ((4, "f32"),))
    flat, _ = flat_inputs([a, b, c])  # what the kernel is given: each input's own storage, never a copy
    assert all(f.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for f, t in zip(flat, (a, b, c)))
    with executors.current().run("gfx942") as ex:
        (out,) = fused_elementwise([a, b, c], prog.text())
    assert len(ex.launches) == 1
    want = a.cpu() * b.cpu() + c.cpu()
    assert out.stride() == want.stride()  # eager's pointwise layout: a transposed first input leads (docs/strides.md)
    torch.testing.assert_close(out.cpu(), want, **op_tol(torch.float32, "fused_elementwise"))


@pytest.mark.parametrize("form", ["column_slice", "transpose", "expanded", "offset_slice"])
def test_strided_inputs_are_read_in_place(form):
    g = torch.Generator().manual_seed(0)
    put = executors.current().put  # each base tensor where the executor reads it, then viewed there
    qkv = put(torch.randn(2, 5, 48, generator=g))
    if form == "column_slice":  # RoPE's q of a fused QKV output, [B, S, H, D] viewed from [B, S, 48]
        a = qkv[..., 16:32].view(2, 5, 2, 8)
    elif form == "transpose":
        a = put(torch.randn(2, 2, 5, 8, generator=g)).transpose(1, 2)
    elif form == "expanded":
        a = put(torch.randn(2, 1, 2, 8, generator=g)).expand(2, 5, 2, 8)
    else:  # a slice of pairs at a non-vector offset: scalar reads
        a = qkv[..., 1:33:2].view(2, 5, 2, 8)
    b = put(torch.randn(1, 5, 1, 8, generator=g))  # the rotary table, broadcast over batch and heads
    c = put(torch.randn(2, 5, 2, 8, generator=g))
    _mul_add(a, b, c)


def test_vectors_kept_for_a_unit_stride_slice_and_dropped_for_a_strided_one():
    ok = geometry((2, 5, 2, 8), [(2, 5, 2, 8)], ["f32"], ["f32"], lambda v: True, [(240, 48, 8, 1)])
    assert ok.vec == 4
    odd = geometry((2, 5, 2, 8), [(2, 5, 2, 8)], ["f32"], ["f32"], lambda v: True, [(240, 48, 16, 2)])
    assert odd.vec == 1
