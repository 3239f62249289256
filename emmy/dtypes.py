"""Element types, named once, with their torch, numpy and C spellings."""

from __future__ import annotations

from enum import Enum
from functools import cache


class DType(Enum):
    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    # 8-bit floats are storage types only: torch computes nothing in them (a value is cast to
    # a wider type first), and neither does emmy (its arithmetic is f32's)
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U8 = "u8"
    BOOL = "bool"
    # complex types name the values of Torch IR only: Tensor IR computes them as pairs of
    # real values (emmy.tensor_ir.complex)
    C64 = "c64"
    C128 = "c128"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in (DType.F64, DType.F32, DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2)

    @property
    def is_narrow_float(self) -> bool:
        """A float stored in fewer than 32 bits (f16, bf16, the 8-bit floats): computed in f32
        and rounded to its type where it is stored."""
        return self in (DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2)

    @property
    def is_complex(self) -> bool:
        return self in (DType.C64, DType.C128)

    @property
    def component(self) -> "DType":
        """A complex type's real and imaginary parts' type (f32 for c64, f64 for c128)."""
        return {DType.C64: DType.F32, DType.C128: DType.F64}[self]

    @property
    def itemsize(self) -> int:
        return {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "f8e4m3": 1, "f8e5m2": 1,
                "i64": 8, "i32": 4, "i16": 2, "i8": 1,
                "u8": 1, "bool": 1, "c64": 8, "c128": 16}[self.value]

    @property
    def c_name(self) -> str:
        return {"f64": "double", "f32": "float", "f16": "__half", "bf16": "__nv_bfloat16",
                "f8e4m3": "__nv_fp8_e4m3", "f8e5m2": "__nv_fp8_e5m2",
                "i64": "long long", "i32": "int", "i16": "short", "i8": "signed char",
                "u8": "unsigned char", "bool": "bool"}[self.value]

    @property
    def int_range(self) -> tuple[int, int]:
        """The least and the greatest value of an integer type (bool: 0, 1)."""
        if self.is_float or self.is_complex:
            raise ValueError(f"{self} is not an integer type")
        if self is DType.BOOL:
            return 0, 1
        if self is DType.U8:
            return 0, 255
        bits = 8 * self.itemsize - 1
        return -(1 << bits), (1 << bits) - 1

    @property
    def compute(self) -> "DType":
        """The type arithmetic on this type is carried out in (narrow floats compute in f32)."""
        return DType.F32 if self.is_narrow_float else self


_FROM_TORCH = {
    "torch.float64": DType.F64, "torch.float32": DType.F32, "torch.float16": DType.F16,
    "torch.bfloat16": DType.BF16, "torch.float8_e4m3fn": DType.F8E4M3,
    "torch.float8_e5m2": DType.F8E5M2, "torch.int64": DType.I64, "torch.int32": DType.I32,
    "torch.int16": DType.I16, "torch.int8": DType.I8, "torch.uint8": DType.U8,
    "torch.bool": DType.BOOL, "torch.complex64": DType.C64, "torch.complex128": DType.C128,
}


def from_torch(dtype) -> DType:
    try:
        return _FROM_TORCH[str(dtype)]
    except KeyError:
        raise ValueError(f"unsupported element type {dtype}; supported: "
                         + ", ".join(sorted(k.removeprefix('torch.') for k in _FROM_TORCH))) from None


def to_torch(dtype: DType):
    import torch

    return {DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
            DType.BF16: torch.bfloat16, DType.F8E4M3: torch.float8_e4m3fn,
            DType.F8E5M2: torch.float8_e5m2, DType.I64: torch.int64, DType.I32: torch.int32,
            DType.I16: torch.int16, DType.I8: torch.int8, DType.U8: torch.uint8,
            DType.BOOL: torch.bool, DType.C64: torch.complex64,
            DType.C128: torch.complex128}[dtype]


def as_stored(t):
    """A torch tensor as emmy's kernels read it: a complex tensor as its (real, imaginary)
    pairs along a trailing axis of 2 (torch.view_as_real, a view of the same memory; a
    conjugate view's conjugation done first), any other tensor as it is."""
    import torch

    if isinstance(t, torch.Tensor) and t.is_complex():
        return torch.view_as_real(t.resolve_conj())
    return t


def as_user(t, dtype: "DType"):
    """A kernel's output as the caller gets it: the (real, imaginary) pairs of a complex
    output viewed as complex (the inverse of as_stored), any other output as it is."""
    import torch

    if dtype.is_complex:
        return torch.view_as_complex(t.contiguous())
    return t


def to_numpy(dtype: DType):
    """numpy has no bfloat16 or 8-bit floats: their values are held as float32 on the numpy
    side (`rounded` keeps them on their type's values)."""
    import numpy as np

    return {DType.F64: np.float64, DType.F32: np.float32, DType.F16: np.float16,
            DType.BF16: np.float32, DType.F8E4M3: np.float32, DType.F8E5M2: np.float32,
            DType.I64: np.int64, DType.I32: np.int32,
            DType.I16: np.int16, DType.I8: np.int8, DType.U8: np.uint8,
            DType.BOOL: np.bool_, DType.C64: np.complex64, DType.C128: np.complex128}[dtype]


@cache
def e4m3_overflow_is_nan() -> bool:
    """Whether this torch rounds a float past e4m3's largest value (448; from 464 up, rounded)
    to NaN, as torch did before it saturated there (pytorch/pytorch#178817, 2026), rather than
    to 448."""
    import torch

    return bool(torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().isnan().item())


def rounded(a, dtype: DType):
    """float32 values (numpy) rounded to `dtype` where numpy has no such type: bf16 and the
    8-bit floats (nearest even, as torch converts: e4m3 saturates at +-448, e5m2 overflows to
    infinity); the values of any other type as they are."""
    import numpy as np

    a = np.asarray(a, dtype=to_numpy(dtype))
    if dtype is DType.BF16:
        bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return np.where(np.isnan(a), a, out.view(np.float32))
    if dtype in (DType.F8E4M3, DType.F8E5M2):
        import torch

        narrow = torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(to_torch(dtype))
        return narrow.to(torch.float32).numpy().reshape(a.shape)
    return a


def tolerance(dtype: DType, *, tf32: bool = False,
              floor: DType | None = None) -> tuple[float, float]:
    """(atol, rtol) for comparing a result of this type against a reference (of the type
    `checked_as` gives, for `tf32` and `floor`)."""
    return _TOLERANCE.get(checked_as(dtype, tf32=tf32, floor=floor), (0.0, 0.0))


def checked_as(dtype: DType, *, tf32: bool = False, floor: DType | None = None) -> DType:
    """The type whose tolerance a result of type `dtype` is held to: `tf32`, the workload lets
    its f32 products round operands to tf32 (10 mantissa bits, like f16); `floor`, the least
    precise float type the model's values start in (its parameters and inputs), held to where
    its tolerance is wider (`(x * 3 + 1).float()` of an f16 x went through f16)."""
    if tf32 and dtype is DType.F32:
        dtype = DType.F16
    if floor is not None and dtype.is_float and floor.is_float and \
            _TOLERANCE[floor][1] > _TOLERANCE[dtype][1]:
        dtype = floor
    return dtype


_TOLERANCE = {DType.F64: (1e-9, 1e-7), DType.F32: (1e-4, 1e-4), DType.F16: (1e-2, 1e-2),
              DType.BF16: (5e-2, 5e-2), DType.F8E4M3: (2 ** -6, 0.125),
              DType.F8E5M2: (2 ** -14, 0.25)}
