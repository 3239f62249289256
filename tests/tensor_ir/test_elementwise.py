"""Elementwise decompositions and activations against eager PyTorch on random inputs."""

import pytest
import torch
import torch.nn.functional as F

X = (4, 6)

BINARY = {
    "add": lambda x, y: x + y,
    "add_alpha": lambda x, y: torch.add(x, y, alpha=2.5),
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "div_floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "div_trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "remainder": lambda x, y: torch.remainder(x, y),
    "fmod": lambda x, y: torch.fmod(x, y),
    "pow": lambda x, y: torch.pow(x.abs() + 0.1, y),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda x, y: torch.where(x > y, x, y),
    "gt": lambda x, y: x > y,
    "eq_and_or": lambda x, y: ((x > 0) & (y > 0)) | (x == y),
    "clamp_tensor": lambda x, y: torch.clamp(x, min=y),
    "broadcast_row": lambda x, y: x + y[0],
    "broadcast_col": lambda x, y: x * y[:, :1],
}

SCALAR = {
    "add": lambda x: x + 2,
    "rsub": lambda x: 2 - x,
    "mul": lambda x: x * 3.5,
    "div": lambda x: x / 4,
    "rdiv": lambda x: 2 / x,
    "pow2": lambda x: x ** 2,
    "pow3": lambda x: x ** 3,
    "pow_half": lambda x: x.abs() ** 0.5,
    "pow_frac": lambda x: x.abs() ** 1.7,
    "pow_neg": lambda x: (x.abs() + 1) ** -1,
    "pow_base": lambda x: 2 ** x,
    "neg": lambda x: -x,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 1e-3),
    "log2": lambda x: torch.log2(x.abs() + 1e-3),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "reciprocal": lambda x: torch.reciprocal(x + 10),
    "sin_cos": lambda x: torch.sin(x) + torch.cos(x),
    "erf": torch.erf,
    "floor_ceil": lambda x: torch.floor(x * 3) + torch.ceil(x * 3),
    "trunc": lambda x: torch.trunc(x * 3),
    "sign": torch.sign,
    "square": torch.square,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.5),
    "clamp_min": lambda x: torch.clamp_min(x, 0.1),
    "clamp_max": lambda x: torch.clamp_max(x, 0.1),
    "where_scalar": lambda x: torch.where(x > 0, x, 0.0),
    "where_scalar_self": lambda x: torch.where(x > 0, 1.0, x),
    "masked_fill": lambda x: x.masked_fill(x < 0, -1.0),
    "logical_not": lambda x: ~(x > 0),
    "int_cast": lambda x: (x * 4).to(torch.int32),
    "int_true_div": lambda x: (x * 4).to(torch.int64) / 3,
    "int_floor_div": lambda x: (x * 10).to(torch.int64) // 3,
    "bool_sum": lambda x: (x > 0) + (x < 0.5),
}

ACTIVATIONS = {
    "relu": F.relu,
    "relu6": F.relu6,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=1.0),
    "elu": lambda x: F.elu(x, alpha=0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.5),
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.8),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "softsign": F.softsign,
    "logsigmoid": F.logsigmoid,
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "threshold": lambda x: F.threshold(x, 0.1, 20.0),
    "glu": lambda x: F.glu(x, -1),
    "tanhshrink": F.tanhshrink,
}


@pytest.mark.parametrize("name", BINARY)
def test_binary(check, name):
    check(BINARY[name], torch.randn(X) * 3, torch.randn(X) + 0.5)


@pytest.mark.parametrize("name", SCALAR)
def test_unary_and_scalar(check, name):
    check(SCALAR[name], torch.randn(X) * 2)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(check, name):
    check(ACTIVATIONS[name], torch.randn(X) * 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["gelu", "silu", "softplus", "elu", "mish"])
def test_activation_in_half_precision(check, name, dtype):
    program = check(ACTIVATIONS[name], (torch.randn(X) * 4).to(dtype))
    assert str(program.get(program.outputs[0]).type).startswith(
        "f16" if dtype == torch.float16 else "bf16")


def test_prelu(check):
    check(torch.nn.PReLU(6), torch.randn(4, 6, 3))


def test_integer_arithmetic_stays_integral(check):
    program = check(lambda x: x * 3 + 1, torch.arange(12).reshape(3, 4))
    assert str(program.get(program.outputs[0]).type) == "i64[3,4]"


INF, NAN = float("inf"), float("nan")
# halves both ways, whole numbers past 2^23, the non-finite
EDGES = torch.cat([torch.arange(-12, 13) * 0.5, torch.tensor(
    [2.0 ** 23 + 1, -(2.0 ** 23) - 3, 2.0 ** 22 + 0.5, 1e30, INF, -INF, NAN, -0.0, 0.49999997])])

ROUNDING = {
    "round": (torch.round, [EDGES]),
    "round_random": (torch.round, [torch.randn(64) * 10]),
    "round_f16": (torch.round, [(torch.randn(64) * 20).half()]),
    "round_bf16": (torch.round, [(EDGES[:-6] * 3).bfloat16()]),
    "round_computed_f16": (lambda x: torch.round(x * 3.7), [(torch.randn(256) * 8).half()]),
    "round_decimals": (lambda x: torch.round(x, decimals=2), [torch.randn(64) * 3]),
    "round_negative_decimals": (lambda x: torch.round(x, decimals=-1), [torch.randn(64) * 300]),
    "round_int": (torch.round, [torch.arange(-5, 5)]),
    "frac": (torch.frac, [torch.cat([EDGES[:25] * 1.3, torch.randn(16) * 5])]),
    "lerp_low": (lambda x, y: torch.lerp(x, y, 0.3), [torch.randn(X), torch.randn(X)]),
    "lerp_high": (lambda x, y: torch.lerp(x, y, -0.7), [torch.randn(X), torch.randn(X)]),
    "lerp_tensor": (torch.lerp, [torch.randn(X), torch.randn(X),
                                 torch.tensor([-1.0, -0.5, 0.0, 0.5, 0.49, 1.5])]),
    "lerp_f16": (lambda x, y: torch.lerp(x, y, 0.8), [torch.randn(X).half(),
                                                       torch.randn(X).half()]),
    "addcmul": (lambda x, y: torch.addcmul(x, y, x, value=0.5), [torch.randn(X), torch.randn(X)]),
    "addcdiv": (lambda x, y: torch.addcdiv(x, x, y.abs() + 1, value=-2),
                [torch.randn(X), torch.randn(X)]),
    "nan_to_num": (torch.nan_to_num, [EDGES]),
    "nan_to_num_given": (lambda x: torch.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0),
                         [EDGES]),
    "nan_to_num_f16": (torch.nan_to_num, [EDGES.half()]),
    "logit": (torch.logit, [torch.rand(32) * 0.98 + 0.01]),
    "logit_eps": (lambda x: torch.logit(x, eps=1e-3), [torch.cat([torch.rand(16),
                                                                  torch.tensor([0.0, 1.0])])]),
    "logaddexp": (torch.logaddexp, [torch.tensor([INF, -INF, -INF, 3.0, 1e3, NAN, 0.0]),
                                    torch.tensor([INF, -INF, 2.0, INF, -1e3, 1.0, 0.0])]),
    "logaddexp_random": (torch.logaddexp, [torch.randn(X) * 5, torch.randn(X) * 5]),
    "hypot": (torch.hypot, [torch.tensor([3.0, 1e30, 0.0, INF, NAN, -5.0, 1e-30]),
                            torch.tensor([4.0, 1e30, 0.0, NAN, 2.0, 12.0, 1e-30])]),
    "sgn": (torch.sgn, [EDGES]),
    "inverse_trig": (lambda x: (torch.asin(x), torch.acos(x), torch.atan(x * 10),
                                torch.atanh(x * 0.99), torch.tan(x)),
                     [torch.rand(40) * 2 - 1]),
    "hyperbolic": (lambda x: (torch.sinh(x), torch.cosh(x), torch.asinh(x * 30),
                              torch.acosh(x.abs() + 1)), [torch.randn(40) * 3]),
    "atan2": (torch.atan2, [torch.tensor([0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 3.0]),
                            torch.tensor([0.0, -1.0, -0.0, 0.0, INF, 2.0, 1.0, -INF])]),
    "atan2_int": (torch.atan2, [torch.randint(-3, 4, (16,)), torch.randint(-3, 4, (16,))]),
    "linspace": (lambda x: x * torch.linspace(-1.5, 2.25, 7), [torch.randn(3, 7)]),
    "linspace_even": (lambda x: x + torch.linspace(0, 1, 10), [torch.randn(10)]),
    # a 16-bit value read as f32 is its 16-bit value (an explicit round trip, or an op computing
    # in f32 on what a fused op before it gave as bf16)
    "half_round_trip": (lambda x: (x * 3).half().float() * 1.5, [torch.randn(256)]),
    "bf16_into_opmath": (lambda x: F.layer_norm((x * 3).bfloat16(), (64,)),
                         [torch.randn(4, 64)]),
}


@pytest.mark.parametrize("name", ROUNDING)
def test_rounding_and_composite_elementwise(check, name):
    fn, inputs = ROUNDING[name]
    check(fn, *inputs)


@pytest.mark.parametrize("name", ["round", "round_f16", "round_bf16", "round_computed_f16",
                                  "round_decimals", "frac", "lerp_tensor", "nan_to_num_f16",
                                  "logaddexp", "hypot", "sgn", "logit_eps",
                                  "half_round_trip", "bf16_into_opmath", "linspace",
                                  "inverse_trig", "hyperbolic", "atan2"])
def test_rounding_and_composite_elementwise_as_emitted_cuda(name):
    """The same through the whole pipeline: the emitted CUDA on the CPU emulator."""
    from emmy.check import check_cuda_program
    from emmy.frontend.workload import Workload
    from emmy.pipeline import compile_to
    from tests.tensor_ir.conftest import Fn

    fn, inputs = ROUNDING[name]
    w = Workload(name, Fn(fn).eval(), tuple(inputs), source=name, origin="<test>")
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok and all(o.max_abs == 0 for o in report.outputs
                             if name.startswith(("round", "frac", "sgn", "half"))), report.outputs


# ---- integer bits ------------------------------------------------------------------------------

_BITS = {
    "and_or_xor": lambda a, b: ((a & b) | (a ^ 0x5A5A)) ^ (b | -8),
    "not": lambda a, b: ~a + torch.bitwise_not(b),
    "shifts": lambda a, b: (a << 3) + (b >> 2) + (7 >> (a & 3)) + torch.bitwise_left_shift(5, b & 7),
    # counts outside [0, bits): torch gives 0 to the left and the sign to the right
    "shift_counts": lambda a, b: (a << (b % 80 - 8), a >> (b % 80 - 8)),
    "bool_and_int": lambda a, b: ((a > 0) & 1) + ((b > 0) ^ (a & 1)),
    "mixed_widths": lambda a, b: a.int() & b,
}


@pytest.mark.parametrize("name", sorted(_BITS))
def test_bitwise_ops_on_integers(check, name):
    a = torch.randint(-(1 << 40), 1 << 40, (6, 64))
    b = torch.randint(-(1 << 20), 1 << 20, (6, 64))
    check(_BITS[name], a, b)
    check(_BITS[name], a.int(), b.int())


@pytest.mark.parametrize("expr", [
    "torch.randint(-99, 99, (64, 40)).int() << torch.randint(-4, 40, (64, 40)).int()",
    "torch.randint(-99, 99, (64, 40)) >> torch.randint(-4, 70, (64, 40))",
    "(torch.randint(0, 1 << 30, (16, 48)) >> 4 & 0xFF).float() / 255",
    "~torch.randint(-99, 99, (8, 40)).int() ^ (torch.randint(0, 9, (8, 40)).int() | 1)",
])
def test_bitwise_ops_on_sampled_rows_compile_and_match_eager(expr):
    """Through NVRTC (both targets) and the emulator: em_shl / em_shr give torch's results
    for every count, where C++'s shifts leave counts outside [0, bits) undefined."""
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=6)


# ---- 8- and 16-bit integers --------------------------------------------------------------------

_SMALL = (torch.uint8, torch.int8, torch.int16)


@pytest.mark.parametrize("dtype", _SMALL, ids=str)
def test_small_integers_wrap_and_promote_as_torch_does(check, dtype):
    """Arithmetic stays in the type and wraps (u8 200 + 100 is 44); u8 with i8 is i16; with an
    i32 tensor, i32; with a Python int, the tensor's type; true division is f32; a sum widens
    to i64."""
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max + 1, (6, 40), dtype=torch.int64).to(dtype)
    b = torch.randint(info.min, info.max + 1, (6, 40), dtype=torch.int64).to(dtype)
    other = torch.randint(-128, 128, (6, 40)).to(torch.int8 if dtype is torch.uint8 else torch.uint8)
    program = check(lambda x, y, z: (x + y, x * 3 - 100, x - z, x + z.int(), x / 7,
                                     x.sum(-1), (x >> 2) ^ y, x.amax(-1), x.amin(0)), a, b, other)
    types = [str(program.get(o).type.dtype) for o in program.outputs]
    small = {torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16"}[dtype]
    assert types == [small, small, "i16", "i32", "f32", "i64", small, small, small]


@pytest.mark.parametrize("expr", [
    "torch.randint(0, 256, (64, 40)).to(torch.uint8) * 3 + torch.randint(0, 256, (64, 40))"
    ".to(torch.uint8)",
    # the max of bytes starts at 0 and their min at 255 (not 128, the i8 bound)
    "torch.randint(0, 100, (16, 3000)).to(torch.uint8).amax(-1).int() + "
    "torch.randint(150, 256, (16, 3000)).to(torch.uint8).amin(-1)",
    "(torch.randint(-128, 128, (32, 64)).to(torch.int8).float() * torch.rand(32, 1))"
    ".round().clamp(-128, 127).to(torch.int8)",
    "torch.randint(-30000, 30000, (8, 300)).to(torch.int16).cumsum(-1)",
])
def test_small_integers_on_sampled_rows_compile_and_match_eager(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=8)


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.int8, torch.uint8), ids=str)
def test_integer_powers_wrap_and_take_negative_exponents_as_torch_does(check, dtype):
    """A tensor exponent on integers: by squaring, wrapping at the type's width; a negative
    exponent gives 1 for a base of 1, +-1 for -1 and 0 otherwise (numpy's power refuses it)."""
    low = 0 if dtype is torch.uint8 else -3
    base = torch.randint(low, 5, (4, 64)).to(dtype)
    exponent = torch.randint(low, 40, (4, 64)).to(dtype)
    check(lambda x, y: (torch.pow(x, y), x ** 5), base, exponent)


@pytest.mark.parametrize("expr", [
    "torch.pow(torch.randint(-3, 5, (16, 64)), torch.randint(-3, 70, (16, 64)))",
    "torch.randint(-3, 5, (16, 64)).int() ** torch.randint(-3, 40, (16, 64)).int()",
    "torch.randint(0, 256, (16, 64)).to(torch.uint8) ** torch.randint(0, 9, (16, 64)).to(torch.uint8)",
])
def test_integer_powers_on_sampled_rows_compile_and_match_eager(expr):
    """em_pow has integer overloads: a pow of two integer tensors was ambiguous between the float
    and double ones and did not compile."""
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=9)


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.int8, torch.uint8), ids=str)
def test_integer_division_is_exact_as_torch_does(check, dtype):
    """floor_divide, div(trunc), remainder and fmod on integers in integers: through a float
    quotient, int64 values past 2^24 came out wrong by thousands."""
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -(2 ** 40)), min(info.max, 2 ** 40), (4, 64)).to(dtype)
    low = 1 if dtype is torch.uint8 else -9
    y = torch.randint(low, 10, (4, 64))
    y = torch.where(y == 0, 3, y).to(dtype)
    check(lambda a, b: (a // b, torch.div(a, b, rounding_mode="trunc"), a % b,
                        torch.fmod(a, b), a // 7, a % 7), x, y)


def _hard_quotients():
    """Random operands and the ones a rounded quotient gets wrong (1.0 // 0.1 is 9, and
    fmod(1.0, 0.1) is nearly 0.1: 0.1 is a little more than a tenth), signed zeros, a zero
    divisor, infinities."""
    torch.manual_seed(0)
    edge = torch.tensor([[1.0, 0.1], [-1.0, 0.1], [0.3, -0.1], [0.0, 0.1], [-0.0, 0.1],
                         [7.0, 0.0], [1e-30, 0.1], [5.0, float("inf")], [float("inf"), 2.0],
                         [3.0, -0.0], [0.7, 0.1], [-2.5, -0.5]])
    pairs = torch.cat([torch.stack([torch.randn(200) * 10, torch.randn(200)], 1), edge])
    return pairs[:, 0].contiguous(), pairs[:, 1].contiguous()


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                         ids=str)
def test_float_floor_division_and_remainders_are_exact_as_torch_does(check, dtype):
    """floor division, remainder and fmod of floats from the exact remainder (C's fmod), as
    torch computes them, not from the rounded quotient: a point cloud's voxel indices
    `(p - lo) // size` were off by one for 76 of 900 points."""
    x, y = (t.to(dtype) for t in _hard_quotients())
    check(lambda a, b: (a // b, a % b, torch.fmod(a, b),
                        torch.div(a, b, rounding_mode="floor"), a // 0.1,
                        torch.remainder(a, -0.7), torch.fmod(a, 0.3)), x, y)


def test_float_floor_division_emitted_cuda_matches_eager():
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.conftest import Fn
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    fn = Fn(lambda a, b: (a // b, a % b, torch.fmod(a, b), a // 0.1))
    assert_workload_cuda_matches_eager(Workload("quotients", fn, _hard_quotients(), "", "<test>"))


@pytest.mark.parametrize("expr", [
    "torch.randint(-2**40, 2**40, (16, 64)) // torch.randint(1, 2**20, (16, 64))",
    "torch.div(torch.randint(-2**40, 2**40, (16, 64)), -3, rounding_mode='trunc')",
    "torch.randint(-2**30, 2**30, (16, 64)).int() % -1000003",
    "torch.fmod(torch.randint(-100, 100, (16, 64)).to(torch.int8), torch.randint(1, 9, (16, 64))"
    ".to(torch.int8))",
    "torch.randn(16, 64).half() // 0.1 + torch.randn(16, 64).half() % 0.3",      # em_fmod
])
def test_integer_division_on_sampled_rows_compiles_and_matches_eager(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=10)


def test_empty_then_filled_is_the_fill(check):
    """CLIP's causal mask: `torch.empty(...).fill_(min).triu_(1)`; `empty_like` and
    `new_empty` the same (an empty tensor's elements are zeros until written)."""
    def mask(x):
        m = torch.empty(x.shape[0], 5, 5, dtype=x.dtype).fill_(torch.finfo(x.dtype).min)
        return (x + m.triu_(1), torch.empty_like(x).fill_(2.0) * x,
                x.new_empty((2, 3)).fill_(1.5))

    check(mask, torch.randn(3, 5, 5))


def test_fake_quantization_matches_eager(check):
    """Quantization-aware training's fake quantization, per tensor (scale and zero point as
    numbers or tensors) and per channel, on the emulator too: x times f32(1 / scale), rounded
    half to even, as torch's kernels compute it."""
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.conftest import Fn

    def fake(x, s, z):
        return (torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127),
                torch.fake_quantize_per_channel_affine(x, s, z, 1, -8, 7),
                torch.fake_quantize_per_tensor_affine(x, s[0], z[0], 0, 255))

    args = (torch.randn(8, 32) * 3, torch.rand(32) * 0.1 + 0.01,
            torch.randint(-3, 3, (32,), dtype=torch.int32))
    check(fake, *args)
    assert_workload_cuda_matches_eager(Workload("fake", Fn(fake).eval(), args, source="",
                                                origin="<test>"))


def test_bit_views_and_frexp_match_eager(check):
    """`x.view(torch.int32)` and back (torchao's stochastic rounding masks the low bits of an
    f32 so), f64 as i64, bf16 as i16 and back, and frexp read off the float64 bits: at
    infinities, NaN, zeros of both signs, subnormals and powers of two, on the emulator too."""
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.conftest import Fn
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    def bits(x, noise, h):
        rounded = ((x.view(torch.int32) + noise) & -65536).view(torch.float32)
        m, e = torch.frexp(x)
        m64, e64 = torch.frexp(x.double() * 1e-300)
        return (rounded, x.double().view(torch.int64) >> 7, h.view(torch.int16),
                (h.view(torch.int16) ^ 1).view(torch.bfloat16), m, e, m64, e64)

    x = torch.cat([torch.tensor([0.0, -0.0, 1.0, 0.75, -3.0, float("inf"), -float("inf"),
                                 float("nan"), 1e-40, 1e-45, 3.4e38, 0.49999997, 2.0 ** -126]),
                   torch.randn(51) * 10.0 ** torch.randint(-30, 30, (51,))])
    args = (x, torch.randint(0, 65536, (64,), dtype=torch.int32), x.bfloat16())
    check(bits, *args)
    assert_workload_cuda_matches_eager(Workload("bits", Fn(bits).eval(), args, source="",
                                                origin="<test>"))


def test_a_bit_view_emmy_has_not_is_refused_by_its_types():
    from emmy.errors import UserError
    from emmy.tensor_ir.lower import lower
    from emmy.torch_ir.capture import capture
    from tests.tensor_ir.conftest import Fn

    with pytest.raises(UserError, match="reading f16 bits as i16"):
        lower(capture(Fn(lambda h: h.view(torch.int16)), (torch.randn(4).half(),)))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16), ids=str)
def test_the_bessel_function_i0_matches_torch(check, dtype):
    """torch.i0 (torchaudio's kaiser resampling, a Kaiser window): its power series up to 40,
    the asymptotic series past it (to the type's overflow), even in x."""
    x = torch.cat([torch.linspace(-60, 60, 601), torch.tensor([0.0, 1e-6, 39.999, 40.001, 88.0,
                                                              90.0, -100.0])])
    check(lambda x: (torch.i0(x), torch.special.i0(x / 3)), x.to(dtype))
    check(lambda t: torch.i0(6.0 * torch.sqrt(1 - t ** 2)) / torch.i0(torch.tensor(6.0)),
          torch.rand(17) * 2 - 1)
    check(lambda t: (t * torch.kaiser_window(16, periodic=False, beta=8.0),
                     torch.kaiser_window(9), torch.kaiser_window(5, dtype=torch.float64),
                     torch.kaiser_window(1)), torch.randn(3, 16))
