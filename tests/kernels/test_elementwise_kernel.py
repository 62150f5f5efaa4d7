"""Generated fused elementwise kernels (translator_kernels.codegen.elementwise) on the session's executor
(tests/executors.py) against eager.

References are eager torch on fp32 copies of the inputs; each case asserts the FlyDSL kernel
was launched exactly once. fp32 tolerance: rtol 1e-5 instead of 1.3e-6 for the transcendental
ops (exp / log / erf / tanh are short 1-2 ulp sequences, not correctly rounded).
"""

import pytest
import torch
import torch.nn.functional as F

import executors  # the session's executor (tests/executors.py)
from translator.tolerances import op_tol
from translator_kernels.codegen.elementwise import build_elementwise, fused_elementwise
from translator_kernels.program import DTYPES, OPS, Program

TOL = {dt: op_tol(dt, "fused_elementwise") for dt in (torch.float32, torch.bfloat16, torch.float16)}


def run(arch, inputs, prog):
    with executors.current().run(arch) as ex:
        outs = fused_elementwise([ex.put(x) for x in inputs], prog.text())
    assert len(ex.launches) == 1, "the FlyDSL kernel did not run"
    return [o.cpu() for o in outs]


def close(got, ref, dtype, what):
    if ref.dtype == torch.bool:
        assert got.dtype == torch.bool and torch.equal(got, ref), what
        return
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype], msg=lambda m: f"{what}: {m}")


# unary ops: (program op, params, eager fn, needs a positive input)
UNARY = [
    ("neg", (), torch.neg, False), ("abs", (), torch.abs, False), ("exp", (), torch.exp, False),
    ("exp2", (), torch.exp2, False), ("expm1", (), torch.expm1, False), ("log", (), torch.log, True),
    ("log2", (), torch.log2, True), ("log1p", (), torch.log1p, True), ("sqrt", (), torch.sqrt, True),
    ("rsqrt", (), torch.rsqrt, True), ("reciprocal", (), torch.reciprocal, True), ("relu", (), torch.relu, False),
    ("sigmoid", (), torch.sigmoid, False), ("tanh", (), torch.tanh, False), ("erf", (), torch.erf, False),
    ("gelu", (), F.gelu, False), ("gelu_tanh", (), lambda x: F.gelu(x, approximate="tanh"), False),
    ("silu", (), F.silu, False), ("mish", (), F.mish, False), ("softsign", (), F.softsign, False),
    ("hardsigmoid", (), F.hardsigmoid, False), ("hardswish", (), F.hardswish, False),
    ("sign", (), torch.sign, False), ("floor", (), torch.floor, False), ("ceil", (), torch.ceil, False),
    ("round", (), torch.round, False), ("trunc", (), torch.trunc, False), ("sin", (), torch.sin, False),
    ("cos", (), torch.cos, False), ("atan", (), torch.atan, False),
    ("softplus", (2.0, 3.0), lambda x: F.softplus(x, 2.0, 3.0), False),
    ("elu", (0.7, 1.0, 1.0), lambda x: F.elu(x, 0.7), False), ("celu", (1.5,), lambda x: F.celu(x, 1.5), False),
    ("leaky_relu", (0.2,), lambda x: F.leaky_relu(x, 0.2), False),
    ("pow_scalar", (3.0,), lambda x: x ** 3, False), ("pow_scalar", (-2.0,), lambda x: x ** -2, True),
    ("pow_scalar", (1.5,), lambda x: x ** 1.5, True), ("pow_scalar", (0.5,), lambda x: x ** 0.5, True),
    ("clamp", (-0.5, 0.75), lambda x: x.clamp(-0.5, 0.75), False), ("clamp", (None, 1.0), lambda x: x.clamp(max=1.0), False),
]


def test_every_one_argument_op_of_the_table_has_a_case():
    """A new row of the op table gets a kernel test (against eager, not against the table's reference)."""
    ops = {o for o, op in OPS.items() if op.takes == "f" and op.gives == "f" and o not in ("cast", "const")}
    assert ops <= {u[0] for u in UNARY}, sorted(ops - {u[0] for u in UNARY})


@pytest.mark.parametrize("dtype,arch", [(torch.float32, "gfx942"), (torch.bfloat16, "gfx950"),
                                        (torch.float16, "gfx942")])
def test_every_unary_op_one_kernel(dtype, arch):
    """All unary ops as outputs of one kernel (one compile), on a signed and a positive input."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 40, generator=g) * 2.5).to(dtype)
    p = (torch.rand(3, 40, generator=g) * 4 + 0.05).to(dtype)
    ops = tuple((name, (1 if pos else 0,), params) for name, params, _, pos in UNARY)
    prog = Program(2, ops, tuple((2 + i, DTYPES[dtype]) for i in range(len(ops))))
    outs = run(arch, [x, p], prog)
    for (name, params, fn, pos), got in zip(UNARY, outs):
        ref = fn((p if pos else x).float())
        close(got, ref, dtype, f"{name}{params} {dtype} {arch}")


SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.5707963705062866, 3.1415927410125732,
           -4.71238899230957, 100.0, -100.0, 1e-30, 7.0]


def ulp_error(got, x):
    """|got - f(x)| in units of the fp32 ulp of the exact (fp64) result, per element."""
    ref = torch.stack([torch.sin(x.double()), torch.cos(x.double())])
    e = torch.frexp(ref.float().abs().clamp_min(1e-37))[1]
    return (got.double() - ref).abs() / torch.ldexp(torch.ones_like(ref), e - 24)


@pytest.mark.parametrize("dtype,arch", [(torch.float32, "gfx942"), (torch.float32, "gfx950"),
                                        (torch.bfloat16, "gfx950"), (torch.float16, "gfx942")])
def test_sin_cos_range_and_special_values(dtype, arch):
    """|x| up to 100 plus +-0, +-inf (-> NaN), NaN, multiples of pi/2; sign of -0 kept by sin."""
    g = torch.Generator().manual_seed(4)
    x = torch.cat([(torch.rand(2000, generator=g) * 200 - 100), torch.tensor(SPECIAL)]).to(dtype)
    prog = Program(1, (("sin", (0,), ()), ("cos", (0,), ())), ((1, DTYPES[dtype]), (2, DTYPES[dtype])))
    s, c = run(arch, [x], prog)
    xf = x.float()
    for got, ref, what in ((s, torch.sin(xf), "sin"), (c, torch.cos(xf), "cos")):
        torch.testing.assert_close(got.float(), ref, **TOL[dtype], equal_nan=True, msg=lambda m: f"{what}: {m}")
    n = len(SPECIAL)
    assert torch.equal(torch.signbit(s[-n:-n + 2]), torch.tensor([False, True])), s[-n:]
    assert s[-n + 2:-n + 5].isnan().all() and c[-n + 2:-n + 5].isnan().all(), (s[-n:], c[-n:])
    if dtype == torch.float32:
        finite = xf.isfinite()
        err = ulp_error(torch.stack([s, c])[:, finite], xf[finite])
        assert err.max() <= 2.0, f"max {err.max().item():.2f} ulp"


def test_sin_cos_fp32_ulp_up_to_1e5():
    """The documented range: <= 2 ulp (fp32 result vs fp64) for |x| <= 1e5."""
    g = torch.Generator().manual_seed(5)
    x = torch.cat([(torch.rand(4096, generator=g) * 2 - 1) * 1e5, (torch.rand(4096, generator=g) * 2 - 1) * 1e3])
    prog = Program(1, (("sin", (0,), ()), ("cos", (0,), ())), ((1, "f32"), (2, "f32")))
    s, c = run("gfx942", [x], prog)
    err = ulp_error(torch.stack([s, c]), x)
    assert err.max() <= 2.0, f"max {err.max().item():.2f} ulp"


def test_atan_fp32_ulp_and_special_values():
    """atan over fp32 magnitudes 1e-30..1e30 of both signs and around its reduction points tan(pi/8)
    and tan(3pi/8): <= 2.5 ulp against fp64 (Cephes' polynomial; 2.03 measured in an fp32 emulation).
    +-0 keep their sign, +-inf -> +-pi/2, NaN -> NaN."""
    g = torch.Generator().manual_seed(7)
    mags = 10 ** (torch.rand(4096, generator=g) * 60 - 30)
    near = torch.cat([0.41421356 + (torch.rand(1024, generator=g) - 0.5) * 0.1,
                      2.4142135 + (torch.rand(1024, generator=g) - 0.5) * 0.5, torch.rand(2048, generator=g) * 20 - 10])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0])
    x = torch.cat([mags, -mags, near, special])
    (got,) = run("gfx942", [x], Program(1, (("atan", (0,), ()),), ((1, "f32"),)))
    fin = x.isfinite()
    ref = torch.atan(x[fin].double())
    e = torch.frexp(ref.float().abs().clamp_min(1e-37))[1]
    err = (got[fin].double() - ref).abs() / torch.ldexp(torch.ones_like(ref), e - 24)
    assert err.max() <= 2.5, f"max {err.max().item():.2f} ulp at x={x[fin][err.argmax()].item()!r}"
    s = got[-len(special):]
    assert torch.equal(torch.signbit(s[:2]), torch.tensor([False, True])), s
    assert s[2].item() == -s[3].item() == torch.tensor(torch.pi / 2).float().item() and s[4].isnan(), s


BCAST = [  # (shape a, shape b, dtype): row, column, batch, scalar, odd tails, size-1 dims
    ((6, 40), (40,), torch.float32), ((5, 33), (5, 1), torch.bfloat16), ((2, 3, 8), (2, 1, 8), torch.float16),
    ((4, 7), (), torch.float32), ((3, 1000), (3, 1000), torch.bfloat16), ((1, 9, 1, 12), (9, 1, 1), torch.float32),
]


@pytest.mark.parametrize("sa,sb,dtype", BCAST)
def test_binary_broadcast_where_compare(sa, sb, dtype):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(sa, generator=g).to(dtype)
    b = (torch.rand(sb, generator=g) + 0.5).to(dtype)
    ops = (("add", (0, 1), ()), ("sub", (0, 1), ()), ("mul", (0, 1), ()), ("div", (0, 1), ()),
           ("maximum", (0, 1), ()), ("minimum", (0, 1), ()), ("div_floor", (0, 1), ()), ("div_trunc", (0, 1), ()),
           ("gt", (0, 1), ()), ("where", (10, 0, 1), ()), ("const", (), (2.0,)), ("mul", (12, 2), ()))
    outs_dt = DTYPES[dtype]
    prog = Program(2, ops, tuple((2 + i, outs_dt) for i in (0, 1, 2, 3, 4, 5, 6, 7, 9, 11)) + ((10, "bool"),))
    outs = run("gfx942", [a, b], prog)
    af, bf = a.float(), b.float()
    refs = [af + bf, af - bf, af * bf, af / bf, torch.maximum(af, bf), torch.minimum(af, bf),
            torch.div(af, bf, rounding_mode="floor"), torch.div(af, bf, rounding_mode="trunc"),
            torch.where(af > bf, af, bf), (af + bf) * 2, af > bf]
    for i, (got, ref) in enumerate(zip(outs, refs)):
        assert got.shape == torch.broadcast_shapes(a.shape, b.shape)
        close(got, ref, dtype, f"output {i} {sa} {sb} {dtype}")


def test_bool_mask_input_and_logical_ops():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 24, generator=g)
    m = torch.rand(4, 24, generator=g) > 0.5
    c = torch.rand(1, 24, generator=g) > 0.3
    ops = (("logical_and", (1, 2), ()), ("logical_not", (3,), ()), ("const", (), (float("-inf"),)),
           ("where", (4, 0, 5), ()), ("logical_xor", (1, 2), ()), ("cast", (7,), ("f32",)))
    prog = Program(3, ops, ((6, "f32"), (7, "bool"), (8, "bf16")))
    outs = run("gfx950", [x, m, c], prog)
    close(outs[0], torch.where(~(m & c), x, float("-inf")), torch.float32, "masked fill")
    close(outs[1], m ^ c, torch.float32, "logical_xor")
    close(outs[2], (m ^ c).float(), torch.bfloat16, "bool -> bf16")


def test_explicit_cast_rounds_mid_chain():
    """x.to(bf16).float() * 3 rounds to bf16 in the middle, as eager does."""
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    prog = Program(1, (("cast", (0,), ("bf16",)), ("const", (), (3.0,)), ("mul", (1, 2), ())), ((3, "f32"),))
    (out,) = run("gfx942", [x], prog)
    ref = x.to(torch.bfloat16).float() * 3
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    assert not torch.equal(out, x * 3), "the cast did not round"


def test_launcher_cached_by_program_and_shape():
    prog = Program(1, (("silu", (0,), ()),), ((1, "f32"),))
    x = torch.randn(8, 16)
    from translator_kernels import launch

    before = build_elementwise.cache_info()
    with launch.collect() as (uses, _):
        run("gfx942", [x], prog)
        run("gfx942", [torch.randn(8, 16)], prog)
    after = build_elementwise.cache_info()
    assert after.misses - before.misses <= 1  # built at most once (the adapter's plan cache holds the launcher)
    assert len(uses) == 2 and uses[0].launcher is uses[1].launcher and uses[0].key == uses[1].key


def test_clear_errors():
    prog = Program(2, (("add", (0, 1), ()),), ((2, "f32"),))
    with pytest.raises(ValueError, match="int16.*not supported"):
        fused_elementwise([torch.zeros(4, dtype=torch.int16), torch.zeros(4)], prog.text())
    with pytest.raises(ValueError, match="do not broadcast"):
        fused_elementwise([torch.zeros(4, 3), torch.zeros(5)], prog.text())
    with pytest.raises(ValueError, match="takes 2 inputs"):
        fused_elementwise([torch.zeros(4)], prog.text())


# kernels whose ISA several tests read: (program, input shapes, input dtypes)
ISA_KERNELS = {
    "gelu_tanh_bf16": (Program(3, (("mul", (0, 1), ()), ("gelu", (3,), ()), ("add", (4, 2), ()), ("tanh", (5,), ())),
                               ((6, "bf16"), (5, "bf16"))), [(64, 256), (256,), (64, 1)], ["bf16", "bf16", "bf16"]),
    "sin_cos_atan_bf16": (Program(2, (("sin", (0,), ()), ("cos", (0,), ()), ("atan", (1,), ()), ("mul", (2, 4), ()),
                                      ("add", (5, 3), ())), ((6, "bf16"),)), [(64, 256), (64, 256)], ["bf16", "bf16"]),
}


@pytest.fixture(scope="module")
def isa_row(compiled_isa):
    """isa_row(name, arch): translator_kernels.isa.summary_row of ISA_KERNELS[name]; all of them compile
    in one child per arch."""
    from translator_kernels.isa import summary_row as row
    from translator_kernels.isa import tensor_specs

    jobs = {name: ("translator_kernels.codegen.elementwise:fused_elementwise",  # as bench.isa_elementwise
                   (tensor_specs(shapes, dtypes), prog.text()), {})
            for name, (prog, shapes, dtypes) in ISA_KERNELS.items()}
    return lambda name, arch: row(compiled_isa(jobs, name, arch))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_isa_no_spills_128bit_access(arch, isa_row):
    s = isa_row("gelu_tanh_bf16", arch)
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0, s
    assert "buffer_load_dwordx4" in s["loads"] and "buffer_store_dwordx4" in s["stores"], s


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_isa_sin_cos_atan_no_spills(arch, isa_row):
    """The polynomial ops compile to AMDGPU ISA without the ocml device library, without spills."""
    s = isa_row("sin_cos_atan_bf16", arch)
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0, s
    print(arch, s)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 3, 255, 257, 4097])
def test_tail_sizes_slow(dtype, n):
    x = torch.randn(n).to(dtype)
    prog = Program(1, (("gelu", (0,), ()), ("mul", (0, 1), ())), ((2, DTYPES[dtype]),))
    (out,) = run("gfx942", [x], prog)
    close(out, F.gelu(x.float()) * x.float(), dtype, f"n={n}")


# integer ops: (program op, eager fn) on int32 / int64 operands; exact, against eager torch
INT_BINARY = [
    ("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum),
    ("minimum", torch.minimum), ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")), ("remainder", torch.remainder),
    ("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or), ("bitwise_xor", torch.bitwise_xor),
    ("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge),
]
INT_UNARY = [("neg", torch.neg), ("abs", torch.abs), ("bitwise_not", torch.bitwise_not)]


def int_operands(dtype, big, seed=0):
    """Signed operands of every sign combination, magnitudes past 2**24 (int32) or 2**40 (int64),
    the divisor never 0 (integer division by 0 is the one documented deviation)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-big, big, (5, 37), generator=g, dtype=torch.int64)
    b = torch.randint(1, 1000, (37,), generator=g, dtype=torch.int64) * (torch.randint(0, 2, (37,), generator=g) * 2 - 1)
    a[0, :4] = torch.tensor([big - 1, -big, 2**24 + 1, -(2**24 + 1)])
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype,big,arch", [(torch.int64, 2**40, "gfx942"), (torch.int32, 2**30, "gfx950")])
def test_integer_ops_exact(dtype, big, arch):
    """Every integer op of the table as outputs of one kernel: exact (no fp32 rounding past 2**24),
    floor division and remainder follow the divisor's sign as torch's."""
    a, b = int_operands(dtype, big)
    n2 = len(INT_BINARY)
    ops = tuple((name, (0, 1), ()) for name, _ in INT_BINARY) + tuple((name, (0,), ()) for name, _ in INT_UNARY)
    fns = [f for _, f in INT_BINARY] + [f for _, f in INT_UNARY]
    want = [fn(a, b) for fn in fns[:n2]] + [fn(a) for fn in fns[n2:]]
    prog = Program(2, ops, tuple((2 + i, DTYPES[w.dtype]) for i, w in enumerate(want)))
    outs = run(arch, [a, b], prog)
    for (name, _), got, ref in zip(INT_BINARY + INT_UNARY, outs, want):
        assert got.dtype == ref.dtype and torch.equal(got, ref), f"{name} {dtype}: {(got != ref).sum()} differ"


def test_integer_division_by_zero_gives_zero():
    a = torch.tensor([7, -7, 0, 5], dtype=torch.int64)
    b = torch.tensor([0, 0, 0, 2], dtype=torch.int64)
    prog = Program(2, (("div_floor", (0, 1), ()), ("remainder", (0, 1), ()), ("div_trunc", (0, 1), ())),
                   ((2, "i64"), (3, "i64"), (4, "i64")))
    q, r, t = run("gfx942", [a, b], prog)
    assert q.tolist() == [0, 0, 0, 2] and r.tolist() == [0, 0, 0, 1] and t.tolist() == [0, 0, 0, 2]


def test_casts_between_int_float_bool_and_int32_wraps():
    """float -> int truncates toward zero, int -> float rounds, int64 -> int32 wraps, bool <-> int;
    an int32 + int64 sum is computed in int64 (torch's promotion)."""
    x = torch.tensor([-2.7, -0.5, 0.0, 0.5, 2.7, 1e6 + 0.25, -3e9, 3e9], dtype=torch.float32)
    i = torch.tensor([3, -1, 0, 2**31 - 1, -(2**31), 2**33 + 5, 2**24 + 1, -7], dtype=torch.int64)
    j = torch.tensor([1, 2, 3, 4, 5, 6, 7, 2**31 - 1], dtype=torch.int32)
    ops = (("cast", (0,), ("i64",)), ("cast", (1,), ("f32",)), ("cast", (1,), ("i32",)), ("cast", (1,), ("bool",)),
           ("cast", (6,), ("i64",)), ("add", (1, 2), ()), ("mul", (2, 2), ()), ("cast", (1,), ("bf16",)))
    prog = Program(3, ops, ((3, "i64"), (4, "f32"), (5, "i32"), (6, "bool"), (7, "i64"), (8, "i64"), (9, "i32"),
                            (10, "f32")))
    outs = run("gfx942", [x, i, j], prog)
    want = [x.to(torch.int64), i.float(), i.to(torch.int32), i.bool(), i.bool().long(), i + j, j * j,
            i.to(torch.bfloat16).float()]
    for k, (got, ref) in enumerate(zip(outs, want)):
        assert got.dtype == ref.dtype and torch.equal(got, ref), (k, got, ref)


def test_where_with_scalar_branches_and_int_constants_past_2_24():
    """where(cond, tensor, scalar) and where(cond, scalar, scalar) with exact int64 constants."""
    c = torch.tensor([True, False, True, False])
    t = torch.tensor([2**40 + 1, -5, 7, 2**53 + 1], dtype=torch.int64)
    ops = (("const_int", (), (2**41 + 3, "i64")), ("where", (0, 1, 2), ()), ("const_int", (), (-1, "i64")),
           ("where", (0, 2, 4), ()), ("const", (), (-1e4,)), ("where", (0, 1, 6), ()))
    prog = Program(2, ops, ((3, "i64"), (5, "i64"), (7, "f32")))
    a, b, f = run("gfx950", [c, t], prog)
    assert a.tolist() == [2**40 + 1, 2**41 + 3, 7, 2**41 + 3]
    assert b.tolist() == [2**41 + 3, -1, 2**41 + 3, -1]
    assert torch.equal(f, torch.where(c, t.float(), torch.tensor(-1e4)))


@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx950", marks=pytest.mark.slow)])
def test_isa_integer_ops_compile_without_spills(arch):
    """int64 division / remainder (the backend's long expansion), compares, selects and casts reach
    AMDGPU ISA (flysim interprets the MLIR; this proves the LLVM backend takes it), 64-bit vectors."""
    from translator_kernels.isa import compile_isa, summary_row, tensor_specs

    ops = (("add", (0, 1), ()), ("const_int", (), (3, "i64")), ("div_floor", (2, 3), ()), ("remainder", (0, 3), ()),
           ("lt", (4, 5), ()), ("where", (6, 4, 5), ()), ("cast", (0,), ("f32",)), ("abs", (0,), ()),
           ("maximum", (0, 1), ()), ("bitwise_xor", (0, 1), ()), ("bitwise_not", (6,), ()))
    prog = Program(2, ops, ((7, "i64"), (4, "i32"), (8, "f32"), (9, "i64"), (10, "i64"), (11, "i64"), (12, "bool")))
    s = summary_row(compile_isa("translator_kernels.codegen.elementwise:fused_elementwise",
                                (tensor_specs([(64, 256), (256,)], ["int64", "int32"]), prog.text()), arch=arch))
    assert s["vgpr_spill"] == 0 and s["sgpr_spill"] == 0, s
    assert "buffer_load_dwordx4" in s["loads"] and "buffer_store_dwordx4" in s["stores"], s


def test_float_remainder_and_floor_division_follow_the_divisor():
    g = torch.Generator().manual_seed(3)
    a = (torch.rand(4, 65, generator=g) * 200 - 100)
    b = (torch.rand(65, generator=g) * 4.5 + 0.5) * (torch.randint(0, 2, (65,), generator=g) * 2 - 1)
    prog = Program(2, (("remainder", (0, 1), ()), ("div_floor", (0, 1), ())), ((2, "f32"), (3, "f32")))
    r, q = run("gfx942", [a, b], prog)
    torch.testing.assert_close(r, torch.remainder(a, b), **op_tol(torch.float32, "fused_elementwise"))
    assert torch.equal(q, torch.div(a, b, rounding_mode="floor"))
