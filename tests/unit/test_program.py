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


def test_integer_kinds_promote_as_torch():
    from translator_kernels.program import signature

    assert signature("add", (), ["l", "i"]) == (["l", "l"], "l")  # int64 + int32 -> int64
    assert signature("add", (), ["i", "b"]) == (["i", "i"], "i")
    assert signature("add", (), ["l", "f"]) == (["f", "f"], "f")  # an int tensor and a float: fp32
    assert signature("lt", (), ["i", "i"]) == (["i", "i"], "b")
    assert signature("where", (), ["b", "l", "f"]) == (["b", "f", "f"], "f")
    assert signature("bitwise_and", (), ["b", "b"]) == (["b", "b"], "b")
    assert signature("exp", (), ["l"]) == (["f"], "f")  # float-only math converts
    assert signature("cast", ("i32",), ["f"]) == (["f"], "i")
    with pytest.raises(KernelInputError, match="bitwise ops on float"):
        signature("bitwise_or", (), ["f", "l"])


def test_integer_constants_are_exact_in_the_text_and_the_reference():
    big = 2**53 + 1  # not a float64
    p = Program(1, (("const_int", (), (big, "i64")), ("add", (0, 1), ()), ("div_floor", (0, 1), ())),
                ((2, "i64"), (3, "i64")))
    assert parse(p.text()) == p and str(big) in p.text()
    x = torch.tensor([-7, 7, 2**62], dtype=torch.int64)
    s, q = ref_program([x], p)
    assert torch.equal(s, x + big) and torch.equal(q, torch.div(x, big, rounding_mode="floor"))
    with pytest.raises(KernelInputError, match="const_int"):
        parse('{"n":1,"ops":[["const_int",[],[1.5,"i64"]]],"out":[[1,"i64"]]}')
    with pytest.raises(KernelInputError, match="casts to 'i8'"):
        parse('{"n":1,"ops":[["cast",[0],["i8"]]],"out":[[1,"f32"]]}')


def test_integer_division_reference_by_zero_is_zero():
    a, b = torch.tensor([7, -7, 5]), torch.tensor([0, 0, -2])
    p = Program(2, (("div_floor", (0, 1), ()), ("remainder", (0, 1), ())), ((2, "i64"), (3, "i64")))
    q, r = ref_program([a, b], p)
    assert q.tolist() == [0, 0, -3] and r.tolist() == [0, 0, -1]  # floor and the divisor's sign, as torch
