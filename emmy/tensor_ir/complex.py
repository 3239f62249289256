"""Complex tensors as pairs of real ones.

A complex64 (complex128) value of the Torch IR lowers to a `Pair`: two float32 (float64) Tensor
IR values of its shape, its real and its imaginary part; no Tensor IR definition, kernel or
buffer is complex. At the program's edges a complex tensor is its (real, imaginary) pairs, a
trailing axis of 2 (`torch.view_as_real`, which is how torch lays complex memory out): a
complex input or parameter is read as two index maps of it, a complex output is written as
the pair stacked along that axis (`emmy.dtypes.as_stored` and `as_user` convert the caller's
tensors).

Ops on complex values lower by their parts:

- views, copies, reductions that add (sum, mean), concatenation, indexing, `where` and the
  creation ops: the same op on the real part and on the imaginary part (a real tensor among
  the values, or a real fill value, has an imaginary part of 0; indices and masks are shared);
- products (mul, mm, bmm, matmul, einsum, ...), bilinear in their two operands:
  (a + bi)(c + di) = (ac - bd) + (ad + bc)i, each term the real op, terms with a zero part
  left out (a complex tensor times a real one is two real products);
- the rest by formula: division, conjugation, exp, log, sqrt, pow by a small integer, abs and
  angle, real and imag, polar, complex, view_as_real and view_as_complex, casts;

and any other op through torch's decomposition where it has one (emmy.tensor_ir.torch_decomp).

A real operand stays real: torch takes it as x + 0i, so that where a part of the other operand
is infinite its complex product makes the other part of the result NaN (inf * 0); here that
part keeps the real arithmetic's value. Finite values are the same either way.
The Llama reference's rotary embedding (`view_as_complex(x) * freqs_cis`) is one elementwise
kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from emmy.dtypes import DType
from emmy.errors import UnsupportedOp
from emmy.symbolic import var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import axis_var
from emmy.torch_ir.ir import Node, Ref, TensorType


@dataclass(frozen=True, slots=True)
class Pair:
    """A complex value: the Tensor IR names of its real and imaginary parts, and its type."""

    re: str
    im: str
    type: TensorType


# one part of an operand: a Tensor IR name, a number, or None for a part that is zero
Part = Any


def is_complex_type(t) -> bool:
    if isinstance(t, tuple):
        return any(is_complex_type(x) for x in t)
    return isinstance(t, TensorType) and t.dtype.is_complex


def involves_complex(node: Node, env: dict[str, Any]) -> bool:
    """Whether `node` reads or makes a complex value (it then lowers here)."""
    def reads(a) -> bool:
        if isinstance(a, Ref):
            return _holds_pair(env.get(a.name))
        if isinstance(a, tuple):
            return any(map(reads, a))
        return isinstance(a, complex) or isinstance(a, DType) and a.is_complex
    return is_complex_type(node.type) or any(map(reads, node.args)) or \
        any(reads(v) for _, v in node.kwargs)


def _holds_pair(v) -> bool:
    return isinstance(v, Pair) or isinstance(v, tuple) and any(map(_holds_pair, v))


def from_stored(b: Builder, x: str, type: TensorType) -> Pair:
    """The complex value of `type` stored in the real tensor `x` as (re, im) along its last
    axis."""
    rank = len(type.shape)
    index = [var(axis_var(i)) for i in range(rank)]
    return Pair(b.index_map(x, type.shape, index + [0]), b.index_map(x, type.shape, index + [1]),
                type)


def to_stored(b: Builder, p: Pair) -> str:
    """`p` as one real tensor, (re, im) along a new last axis (view_as_real)."""
    from emmy.tensor_ir.decomp.layout import lower_stack

    return lower_stack(b, [p.re, p.im], -1)


def stored_type(t: TensorType) -> TensorType:
    return TensorType(t.shape + (2,), t.dtype.component)


# ---- lowering a node ---------------------------------------------------------------------------

LowerNode = Callable[[Builder, Node, dict], Any]


def lower_complex(b: Builder, node: Node, env: dict[str, Any], lower_node: LowerNode):
    """The value of a node that reads or makes complex values: Pairs (or tuples of them) for
    complex results, names for real ones; NO_RULE for an op no rule here lowers."""
    low = _Lowering(b, node, env, lower_node)
    if node.op == "getitem":
        return low.arg(0)[node.args[1]]
    if node.op == "_assert_tensor_metadata":
        return None
    rule = _RULES.get(node.op)
    if rule is not None:
        return rule(low)
    if node.op in _BILINEAR:
        return low.bilinear(*_BILINEAR[node.op])
    if node.op in _CREATION:
        return low.creation(_CREATION[node.op])
    if node.op in _BY_PARTS:
        return low.by_parts()
    return NO_RULE      # torch's decomposition, where it has one (emmy.tensor_ir.lower)


class _Lowering:
    """One node's lowering: its arguments resolved, and the ways to lower it by its parts."""

    def __init__(self, b: Builder, node: Node, env: dict, lower_node: LowerNode):
        self.b, self.node, self.env, self._lower_node = b, node, env, lower_node

    # -- the node's arguments

    def arg(self, i: int, default=None):
        a = self.node.args[i] if i < len(self.node.args) else default
        return _resolve(a, self.env)

    def kwarg(self, key: str, default=None):
        return _resolve(self.node.kwarg(key, default), self.env)

    def parts(self, i: int) -> tuple[Part, Part]:
        """Argument i's real and imaginary parts (None for a part that is zero)."""
        return _parts(self.arg(i))

    @property
    def type(self) -> TensorType:
        """The node's (first) result type."""
        t = self.node.type
        return t[0] if isinstance(t, tuple) else t

    def component(self) -> DType:
        """The real type of the node's complex result's parts (or of its real result)."""
        return self.type.dtype.component if self.type.dtype.is_complex else self.type.dtype

    def pair(self, re: Part, im: Part) -> Pair:
        """The node's complex result from two parts (numbers and zeros made tensors)."""
        shape, dtype = self.type.shape, self.component()
        return Pair(self._tensor(re, shape, dtype), self._tensor(im, shape, dtype), self.type)

    def real(self, x: Part) -> str:
        """The node's real result."""
        return self.b.cast(self._tensor(x, self.type.shape, self.type.dtype), self.type.dtype)

    def _tensor(self, x: Part, shape, dtype: DType) -> str:
        b = self.b
        if x is None:
            return b.full(shape, 0, dtype)
        if not isinstance(x, str):
            return b.full(shape, x, dtype)
        return b.broadcast_to(b.cast(x, dtype), shape)

    # -- arithmetic on parts (None: zero)

    def add(self, x: Part, y: Part) -> Part:
        if x is None or y is None:
            return y if x is None else x
        return x + y if _numbers(x, y) else self.b.ew(E.ADD, x, y)

    def sub(self, x: Part, y: Part) -> Part:
        if x is None or y is None:
            return x if y is None else self.neg(y)
        return x - y if _numbers(x, y) else self.b.ew(E.SUB, x, y)

    def mul(self, x: Part, y: Part) -> Part:
        if x is None or y is None:
            return None
        return x * y if _numbers(x, y) else self.b.ew(E.MUL, x, y)

    def neg(self, x: Part) -> Part:
        if x is None:
            return None
        return -x if not isinstance(x, str) else self.b.ew(E.NEG, x)

    def apply(self, op: str, *args):
        """The real op `op` (a decomposition of emmy's table) on real values."""
        from emmy.tensor_ir.decomp import REGISTRY

        return REGISTRY[op].fn(self.b, *args)

    # -- the node lowered again on real values

    def lower_as(self, args: tuple, kwargs: tuple, type) -> Any:
        """The node's op on real arguments: `args` and `kwargs` hold Tensor IR names as
        `_Name`s (in place of the node's Refs) and literals; `type` is its real result
        type."""
        local: dict[str, Any] = {}

        def bind(a):
            if isinstance(a, _Name):
                key = f"{self.node.name}.part{len(local)}"
                local[key] = str(a)
                return Ref(key)
            if isinstance(a, tuple):
                return tuple(bind(x) for x in a)
            return a
        part = replace(self.node, args=bind(args), kwargs=tuple((k, bind(v)) for k, v in kwargs),
                       type=type)
        return self._lower_node(self.b, part, local)

    def by_parts(self):
        """The op once on the real parts, once on the imaginary parts (it is linear in its
        complex operands: views, copies, sums, concatenation, indexing, where)."""
        shared = _SHARED.get(self.node.op, ())
        values = _VALUES.get(self.node.op, ())

        def side(k: int):
            def one(a, pos):
                if isinstance(a, Ref):
                    v = self.env[a.name]
                    if pos in shared:
                        return _named(a, self.env)
                    return _side_of(self.b, v, k)
                if isinstance(a, tuple):
                    return tuple(one(x, pos) for x in a)
                if isinstance(a, DType):
                    return a.component if a.is_complex else a
                if pos in values and isinstance(a, (int, float, complex)) and \
                        not isinstance(a, bool):
                    return (a.real, a.imag)[k] if isinstance(a, complex) else (a, 0)[k]
                return a
            args = tuple(one(a, i) for i, a in enumerate(self.node.args))
            kwargs = tuple((key, one(v, key)) for key, v in self.node.kwargs)
            return self.lower_as(args, kwargs, _real_types(self.node.type))
        re, im = side(0), side(1)
        return _zip_pairs(re, im, self.node.type, self.node)

    def creation(self, value_pos):
        """A creation op of complex type: the real part made by the op itself (on the real
        part of a tensor it copies the shape of), the imaginary part the fill value's (0 but
        for a complex fill)."""
        value = self.node.args[value_pos] if value_pos is not None and \
            value_pos < len(self.node.args) else self.node.kwarg("fill_value")
        imag = value.imag if isinstance(value, complex) else 0
        args = tuple(_side_of(self.b, self.env[a.name], 0) if isinstance(a, Ref) else
                     a.real if isinstance(a, complex) else a for a in self.node.args)
        kwargs = tuple((k, v.component if isinstance(v, DType) and v.is_complex else v)
                       for k, v in self.node.kwargs)
        re = self.lower_as(args, kwargs, _real_types(self.node.type))
        if not is_complex_type(self.node.type):
            return re
        return self.pair(re, imag or None)

    def bilinear(self, left: int, right: int):
        """A product of operands `left` and `right`, (a + bi)(c + di) = (ac - bd) + (ad + bc)i,
        each term the op on real operands."""
        listed = left is None        # einsum: the two operands are the list at `right`
        operands = self.arg(right) if listed else (self.arg(left), self.arg(right))
        if len(operands) != 2:
            raise UnsupportedOp(self.node.op, source=self.node.source,
                                detail="a product of complex tensors takes two operands")

        def product(x: Part, y: Part) -> Part:
            if x is None or y is None:
                return None
            args = [_named(a, self.env) for a in self.node.args]
            x, y = (_Name(v) if isinstance(v, str) else v for v in (x, y))
            if listed:
                args[right] = (x, y)
            else:
                args[left], args[right] = x, y
            return self.lower_as(tuple(args), self.node.kwargs, _real_types(self.node.type))
        (a, b_), (c, d) = _parts(operands[0]), _parts(operands[1])
        re = self.sub(product(a, c), product(b_, d))
        im = self.add(product(a, d), product(b_, c))
        return self.pair(re, im) if is_complex_type(self.node.type) else self.real(re)


NO_RULE = object()

UNSUPPORTED = ("not on complex tensors (emmy computes complex values as pairs of real ones: "
               "arithmetic, products, exp, log, sqrt, abs, angle, real, imag, polar, views, "
               "sums, indexing, torch.fft's transforms and stft)")


def _resolve(a, env):
    if isinstance(a, Ref):
        return env[a.name]
    if isinstance(a, tuple):
        return tuple(_resolve(x, env) for x in a)
    return a


def _numbers(*xs) -> bool:
    return not any(isinstance(x, str) for x in xs)


class _Name(str):
    """A Tensor IR name among an op's literal arguments (a string literal stays a str)."""


def _named(a, env):
    """An argument with its Refs resolved to (real) Tensor IR names."""
    if isinstance(a, Ref):
        v = env[a.name]
        return _Name(v) if isinstance(v, str) else v
    if isinstance(a, tuple):
        return tuple(_named(x, env) for x in a)
    return a


def _parts(v) -> tuple[Part, Part]:
    if isinstance(v, Pair):
        return v.re, v.im
    if isinstance(v, complex):
        return v.real or None, v.imag or None
    return v, None


def _side_of(b: Builder, v, k: int):
    """Part k (0 real, 1 imaginary) of a value: a Pair's part, a real tensor itself or zeros
    of its shape and type, a tuple of values part by part."""
    if isinstance(v, Pair):
        return _Name((v.re, v.im)[k])
    if isinstance(v, tuple):
        return tuple(_side_of(b, x, k) for x in v)
    if isinstance(v, str) and k == 1:
        return _Name(b.full(b.shape(v), 0, b.dtype(v)))
    return _Name(v) if isinstance(v, str) else v


def _real_types(t):
    if isinstance(t, tuple):
        return tuple(_real_types(x) for x in t)
    if isinstance(t, TensorType) and t.dtype.is_complex:
        return TensorType(t.shape, t.dtype.component)
    return t


def _zip_pairs(re, im, type, node: Node):
    """Real-part and imaginary-part results as Pairs (tuples of them for tuple results)."""
    if isinstance(re, tuple):
        types = type if isinstance(type, tuple) else (type,) * len(re)
        return tuple(_zip_pairs(r, i, t, node) for r, i, t in zip(re, im, types))
    if re is None:
        return None
    if not (isinstance(type, TensorType) and type.dtype.is_complex):
        raise UnsupportedOp(node.op, source=node.source, detail=UNSUPPORTED)
    return Pair(re, im, type)


# ---- the rules ---------------------------------------------------------------------------------

def _add(low: _Lowering, sign: int):
    (a, b_), (c, d) = low.parts(0), low.parts(1)
    alpha = low.kwarg("alpha", 1)
    if alpha != 1:
        (c, d) = (low.mul(c, alpha), low.mul(d, alpha)) if not isinstance(alpha, complex) \
            else _times(low, (c, d), _parts(alpha))
    op = low.add if sign > 0 else low.sub
    return low.pair(op(a, c), op(b_, d))


def _rsub(low: _Lowering):
    """other - self * alpha."""
    (a, b_), (c, d) = low.parts(0), low.parts(1)
    alpha = low.kwarg("alpha", 1)
    return low.pair(low.sub(c, low.mul(a, alpha)), low.sub(d, low.mul(b_, alpha)))


def _times(low: _Lowering, x, y):
    (a, b_), (c, d) = x, y
    return (low.sub(low.mul(a, c), low.mul(b_, d)), low.add(low.mul(a, d), low.mul(b_, c)))


def _div(low: _Lowering):
    if low.node.kwarg("rounding_mode") is not None:
        raise UnsupportedOp(low.node.op, source=low.node.source,
                            detail="a rounding division of complex values")
    return low.pair(*_quotient(low, low.parts(0), low.parts(1)))


def _quotient(low: _Lowering, x, y):
    """x / y: by a real y part by part, else Smith's division as torch computes it (numpy's
    too): the ratio of y's smaller part to its larger one, so that nothing squares and
    overflows where the quotient does not; a zero y gives the infinities and NaNs of dividing
    each part by 0."""
    b = low.b
    (a, b_), (c, d) = x, y
    if d is None:
        return (None if a is None else b.ew(E.DIV, a, c),
                None if b_ is None else b.ew(E.DIV, b_, c))
    c = low._tensor(c, b.shape(d), b.dtype(d))
    a = low._tensor(a, b.shape(c), b.dtype(c)) if a is None else a
    wide = b.ew(E.GE, b.ew(E.ABS, c), b.ew(E.ABS, d))         # |c| >= |d|
    ratio = b.ew(E.WHERE, wide, b.ew(E.DIV, d, c), b.ew(E.DIV, c, d))
    scale = b.ew(E.RECIPROCAL, b.ew(E.WHERE, wide, b.ew(E.ADD, c, b.ew(E.MUL, d, ratio)),
                                     b.ew(E.ADD, d, b.ew(E.MUL, c, ratio))))
    re = b.ew(E.WHERE, wide, low.add(a, low.mul(b_, ratio)), low.add(low.mul(a, ratio), b_))
    im = b.ew(E.WHERE, wide, low.sub(b_, low.mul(a, ratio)), low.sub(low.mul(b_, ratio), a))
    re, im = b.ew(E.MUL, re, scale), b.ew(E.MUL, im, scale)
    zero = b.ew(E.AND, b.ew(E.EQ, c, 0.0), b.ew(E.EQ, d, 0.0))
    return (b.ew(E.WHERE, zero, b.ew(E.DIV, a, 0.0), re),
            b.ew(E.WHERE, zero, b.ew(E.DIV, b_ if b_ is not None else 0.0, 0.0), im))


def _neg(low: _Lowering):
    a, b_ = low.parts(0)
    return low.pair(low.neg(a), low.neg(b_))


def _conj(low: _Lowering):
    a, b_ = low.parts(0)
    return low.pair(a, low.neg(b_))


def _same(low: _Lowering):
    return low.pair(*low.parts(0))


def _abs(low: _Lowering):
    a, b_ = low.parts(0)
    return low.real(low.apply("hypot", a, b_) if b_ is not None else low.b.ew(E.ABS, a))


def _angle(low: _Lowering):
    a, b_ = low.parts(0)
    return low.real(low.apply("atan2", low._tensor(b_, low.b.shape(a), low.b.dtype(a)), a))


def _exp(low: _Lowering):
    b = low.b
    a, b_ = low.parts(0)
    e = b.ew(E.EXP, a)
    if b_ is None:
        return low.pair(e, None)
    return low.pair(b.ew(E.MUL, e, b.ew(E.COS, b_)), b.ew(E.MUL, e, b.ew(E.SIN, b_)))


def _log(low: _Lowering):
    """log|z| + i angle(z)."""
    b = low.b
    a, b_ = low.parts(0)
    im = low._tensor(b_, b.shape(a), b.dtype(a))
    return low.pair(b.ew(E.LOG, low.apply("hypot", a, im)), low.apply("atan2", im, a))


def _sqrt(low: _Lowering):
    """The principal root: sqrt(|z|) (cos(angle / 2) + i sin(angle / 2))."""
    b = low.b
    a, b_ = low.parts(0)
    im = low._tensor(b_, b.shape(a), b.dtype(a))
    r = b.ew(E.SQRT, low.apply("hypot", a, im))
    half = b.ew(E.MUL, low.apply("atan2", im, a), 0.5)
    return low.pair(b.ew(E.MUL, r, b.ew(E.COS, half)), b.ew(E.MUL, r, b.ew(E.SIN, half)))


def _pow(low: _Lowering):
    """z ** n for a whole n from -4 to 4, by products (and a reciprocal)."""
    n = low.arg(1)
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or isinstance(n, bool) or abs(n) > 4:
        raise UnsupportedOp(low.node.op, source=low.node.source,
                            detail="complex values to a power other than a whole number from "
                                   "-4 to 4")
    z = low.parts(0)
    out: tuple[Part, Part] = (1, None)
    for _ in range(abs(n)):
        out = _times(low, out, z)
    if n < 0:
        out = _quotient(low, (1, None), out)
    return low.pair(*out)


def _reciprocal(low: _Lowering):
    return low.pair(*_quotient(low, (1, None), low.parts(0)))


def _real(low: _Lowering):
    return low.real(low.parts(0)[0])


def _imag(low: _Lowering):
    return low.real(low.parts(0)[1])


def _view_as_real(low: _Lowering):
    v = low.arg(0)
    return to_stored(low.b, v if isinstance(v, Pair) else low.pair(v, None))


def _view_as_complex(low: _Lowering):
    return from_stored(low.b, low.arg(0), low.type)


def _polar(low: _Lowering):
    b = low.b
    r, theta = low.arg(0), low.arg(1)
    return low.pair(b.ew(E.MUL, r, b.ew(E.COS, theta)), b.ew(E.MUL, r, b.ew(E.SIN, theta)))


def _complex(low: _Lowering):
    return low.pair(low.arg(0), low.arg(1))


def _stft(low: _Lowering):
    """torch.stft of a real signal (emmy.tensor_ir.decomp.spectral)."""
    from emmy.tensor_ir.decomp.spectral import stft_parts
    from emmy.tensor_ir.decomp.table import Refused

    x = low.arg(0)
    if isinstance(x, Pair):
        raise UnsupportedOp("stft", source=low.node.source, detail="of a complex signal")
    names = ("hop_length", "win_length", "window", "normalized", "onesided", "return_complex",
             "align_to_window")
    given = [low.arg(i + 2, low.kwarg(k)) for i, k in enumerate(names)]
    hop, win, window, normalized, onesided, _, align = given
    try:
        re, im = stft_parts(low.b, x, low.component(), low.arg(1), hop, win, window,
                            bool(normalized), onesided, align)
    except Refused as e:
        raise UnsupportedOp("stft", source=low.node.source, detail=e.detail) from None
    return low.pair(re, im)


def _fft(low: _Lowering, kind: str, suffix: str):
    """torch.fft's transforms (emmy.tensor_ir.decomp.spectral): `kind` rfft, fft, ifft or
    irfft, along one axis, the last two (`suffix` "2") or several ("n"), as torch composes
    them: rfftn is rfft along the last axis then fft along the others, irfftn ifft along all
    but the last then irfft."""
    from emmy.tensor_ir.decomp import spectral
    from emmy.tensor_ir.decomp.table import Refused

    b = low.b
    re, im = low.parts(0)
    rank = len(b.shape(re))
    sizes = low.arg(1, low.kwarg("s" if suffix else "n"))
    dims = low.arg(2, low.kwarg("dim", {"": -1, "2": (-2, -1), "n": None}[suffix]))
    if not suffix:
        sizes, dims = (sizes,), (dims,)
    elif dims is None:
        dims = tuple(range(rank - len(sizes), rank)) if sizes else tuple(range(rank))
    dims = tuple(d % rank for d in dims)
    sizes = tuple(sizes) if sizes else (None,) * len(dims)
    norm, dtype = low.arg(3, low.kwarg("norm")), low.component()

    def along(re, im, dim, n, how):
        length = b.shape(re)[dim]
        if how == "irfft":
            n = n or 2 * (length - 1)
            return spectral.hermitian_inverse(
                b, re, im if im is not None else b.full(b.shape(re), 0.0, dtype), dim, n,
                scale=spectral.norm_scale(norm, n, inverse=True), dtype=dtype), None
        n = n or length
        inverse = how == "ifft"
        return spectral.dft(b, re, im, dim, n, n // 2 + 1 if how == "rfft" else n,
                            inverse=inverse, scale=spectral.norm_scale(norm, n, inverse=inverse),
                            dtype=dtype)
    try:
        if kind == "rfft":
            re, im = along(re, None, dims[-1], sizes[-1], "rfft")
            for d, n in zip(dims[:-1], sizes[:-1]):
                re, im = along(re, im, d, n, "fft")
        elif kind == "irfft":
            for d, n in zip(dims[:-1], sizes[:-1]):
                re, im = along(re, im, d, n, "ifft")
            return low.real(along(re, im, dims[-1], sizes[-1], "irfft")[0])
        else:
            for d, n in zip(dims, sizes):
                re, im = along(re, im, d, n, kind)
    except Refused as e:
        raise UnsupportedOp(low.node.op, source=low.node.source, detail=e.detail) from None
    return low.pair(re, im)


def _cast(low: _Lowering):
    """A cast to a complex type (the imaginary part 0 from a real value), between complex
    types, or from a complex type to a real one (torch keeps the real part)."""
    a, b_ = low.parts(0)
    if is_complex_type(low.node.type):
        return low.pair(a, b_)
    return low.real(a)


def _equal(low: _Lowering, negate: bool):
    b = low.b
    (a, b_), (c, d) = low.parts(0), low.parts(1)
    zero = 0
    same = b.ew(E.AND, b.ew(E.EQ, a, c), b.ew(E.EQ, b_ if b_ is not None else zero,
                                            d if d is not None else zero)) \
        if (b_, d) != (None, None) else b.ew(E.EQ, a, c)
    return low.real(b.ew(E.NOT, same) if negate else same)


_RULES: dict[str, Callable[[_Lowering], Any]] = {
    "add.Tensor": lambda low: _add(low, 1), "add.Scalar": lambda low: _add(low, 1),
    "sub.Tensor": lambda low: _add(low, -1), "sub.Scalar": lambda low: _add(low, -1),
    "rsub.Scalar": _rsub,
    "div.Tensor": _div, "div.Scalar": _div, "div.Tensor_mode": _div,
    "neg": _neg, "conj": _conj, "_conj": _conj, "conj_physical": _conj,
    "resolve_conj": _same, "resolve_neg": _same, "positive": _same,
    "abs": _abs, "angle": _angle, "exp": _exp, "log": _log, "sqrt": _sqrt,
    "pow.Tensor_Scalar": _pow, "reciprocal": _reciprocal,
    "real": _real, "imag": _imag, "view_as_real": _view_as_real,
    "view_as_complex": _view_as_complex, "polar": _polar, "complex": _complex,
    "to.dtype": _cast, "_to_copy": _cast, "to.dtype_layout": _cast, "type_as": _cast,
    "to.device": _same, "stft": _stft,
    **{f"fft_{kind}{suffix}": (lambda low, kind=kind, suffix=suffix: _fft(low, kind, suffix))
       for kind in ("rfft", "irfft", "fft", "ifft") for suffix in ("", "2", "n")},
    "eq.Tensor": lambda low: _equal(low, False), "eq.Scalar": lambda low: _equal(low, False),
    "ne.Tensor": lambda low: _equal(low, True), "ne.Scalar": lambda low: _equal(low, True),
}

# products: the positions of their two operands ((None, i) for einsum's list at i)
_BILINEAR = {"mul.Tensor": (0, 1), "mul.Scalar": (0, 1), "mm": (0, 1), "bmm": (0, 1),
             "matmul": (0, 1), "mv": (0, 1), "dot": (0, 1), "outer": (0, 1),
             "einsum": (None, 1)}

# linear in their complex operands: the same op on each part
_BY_PARTS = {
    "view", "reshape", "_unsafe_view", "view_copy", "view_as", "reshape_as", "flatten.using_ints",
    "unflatten.int", "permute", "transpose.int", "swapaxes", "t", "numpy_T", "mT", "movedim.int",
    "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze", "squeeze.dim",
    "squeeze.dims", "slice.Tensor", "narrow", "select.int", "unbind.int", "split.Tensor",
    "split_with_sizes", "chunk", "flip", "roll", "diagonal", "diag", "unfold", "repeat",
    "repeat_interleave.self_int", "cat", "stack", "contiguous", "clone", "alias", "detach",
    "lift_fresh_copy", "sum", "sum.dim_IntList", "mean", "mean.dim", "cumsum", "tril", "triu",
    "index.Tensor", "index_select", "gather", "take_along_dim", "embedding",
    "where.self", "where.ScalarOther", "where.ScalarSelf", "masked_fill.Scalar",
    "masked_fill.Tensor", "constant_pad_nd", "select_scatter", "slice_scatter", "copy",
    "fill.Scalar", "fill.Tensor", "dropout",
}
# by-parts arguments shared by both parts (indices, masks), by position or keyword
_SHARED = {"where.self": (0,), "where.ScalarOther": (0,), "where.ScalarSelf": (0,),
           "masked_fill.Scalar": (1,), "masked_fill.Tensor": (1,), "index.Tensor": (1,),
           "index_select": (2,), "gather": (2,), "take_along_dim": (1,), "embedding": (1,)}
# by-parts arguments that are fill values (a real number's imaginary part is 0)
_VALUES = {"where.ScalarOther": (2,), "where.ScalarSelf": (1,), "masked_fill.Scalar": (2,),
           "constant_pad_nd": (2,), "fill.Scalar": (1,)}
# creation ops: the position of their fill value (None: 0 or 1, real)
_CREATION = {"full": 1, "full_like": 1, "scalar_tensor": 0, "zeros": None, "ones": None,
             "zeros_like": None, "ones_like": None, "new_zeros": None, "new_ones": None,
             "new_full": 2, "empty.memory_format": None, "empty_like": None}


def _complex_only() -> frozenset[str]:
    from emmy.tensor_ir.decomp import REGISTRY

    return frozenset(op for op in _RULES if op not in REGISTRY)


# the ops of complex values emmy's tables lack (view_as_complex, polar, angle, conj, ...), for
# `emmy ops`
COMPLEX_ONLY = _complex_only()
