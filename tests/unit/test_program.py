"""The one per-element program and op table (translator_kernels.program): table rows, the chain
spelling of a one-input program, composition, validation errors."""

import pytest
import torch

import translator_kernels.device_math as em
from translator.lowerings.elementwise import TABLE
from translator_kernels.errors import KernelInputError
from translator_kernels.program import OPS, Program, chain, epilogue, evaluate, parse, ref_program, then

aten = torch.ops.aten


def test_every_row_has_a_device_function_and_a_reference():
    for name, op in OPS.items():
        assert callable(getattr(em, op.device, None)), f"{name}: device_math.{op.device} is missing"
        assert name in ("const", "const_int") or callable(op.ref), name
        assert len(op.defaults) <= op.params and set(op.takes) <= set("fbnza") and op.gives in "fbn", name


def test_one_argument_rows_named_like_an_aten_op_are_lowered():
    """A row is all a new unary op needs on the translator side too: the lowering maps it by name."""
    for name, op in OPS.items():
        if op.arity == 1 and not op.params and hasattr(aten, name):
            assert getattr(aten, name).default in TABLE, name


def test_chain_spelling_is_the_program():
    assert chain("mul(2.0);sigmoid") == Program(1, (("const", (), (2.0,)), ("mul", (0, 1), ()),
                                                    ("sigmoid", (2,), ())), ((3, "f32"),))
    assert chain("rsub(1.0)").ops[1] == ("sub", (1, 0), ())  # c - x
    assert chain("elu(0.5)").ops == (("elu", (0,), (0.5, 1.0, 1.0)),)  # trailing defaults
    assert epilogue("clamp(0,1)") == epilogue("clamp(0.0,1.0)") == epilogue(epilogue("clamp(0.0,1.0)"))
    assert epilogue(None) is None and epilogue("") is None
    y = torch.randn(50)
    (got,) = ref_program([y], chain("sqrt;log;pow_scalar(2.0);add(1.0)").text())
    torch.testing.assert_close(got, torch.log(torch.sqrt(y)) ** 2 + 1.0, equal_nan=True)


def test_then_composes_one_input_programs():
    p, q = chain("abs;add(1.0)"), chain("log;mul(3.0)")
    pq = then(p, q)
    y = torch.randn(40)
    torch.testing.assert_close(evaluate(pq, [y])[pq.out[0][0]], torch.log(y.abs() + 1.0) * 3.0)


def test_bad_programs_raise_one_clear_error():
    with pytest.raises(KernelInputError, match="takes 2 params"):
        chain("gelu;clamp(1.0)")
    with pytest.raises(KernelInputError, match="known steps"):
        chain("cosh")
    with pytest.raises(KernelInputError, match="takes 1 value"):
        parse('{"n":2,"ops":[["exp",[0,1],[]]],"out":[[2,"f32"]]}')
    with pytest.raises(KernelInputError, match="unknown op 'cosh'"):
        parse('{"n":1,"ops":[["cosh",[0],[]]],"out":[[1,"f32"]]}')
    with pytest.raises(KernelInputError, match="not a program"):
        parse("gelu")
    with pytest.raises(KernelInputError, match="one float value"):
        epilogue(Program(1, (("const", (), (0.0,)), ("gt", (0, 1), ())), ((2, "f32"),)))
    assert issubclass(KernelInputError, ValueError)  # callers that catch ValueError keep working
