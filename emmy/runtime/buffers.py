"""Device-layout storage for buffers on the CPU side: numpy arrays in each element type's bits."""

from __future__ import annotations

import numpy as np

from emmy.dtypes import DType

_STORAGE = {DType.F64: np.float64, DType.F32: np.float32, DType.F16: np.float16,
            DType.BF16: np.uint16, DType.F8E4M3: np.uint8, DType.F8E5M2: np.uint8,
            DType.I64: np.int64, DType.I32: np.int32, DType.I16: np.int16, DType.I8: np.int8,
            DType.U8: np.uint8, DType.BOOL: np.bool_}
_BYTE_FLOATS = (DType.F8E4M3, DType.F8E5M2)
_C_TO_DTYPE = {d.c_name: d for d in DType if not d.is_complex}


def storage_of(dtype: DType):
    return _STORAGE[dtype]


def dtype_of_c(ctype: str) -> DType:
    return _C_TO_DTYPE[ctype]


def to_storage(values, dtype: DType) -> np.ndarray:
    """Values (torch tensor or numpy array) as the bits the kernel reads."""
    import torch

    from emmy.dtypes import as_stored

    t = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values))
    t = as_stored(t.detach().cpu()).contiguous()
    from emmy.dtypes import to_torch

    if dtype is DType.BF16:
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    if dtype in _BYTE_FLOATS:
        return t.to(to_torch(dtype)).view(torch.uint8).numpy().copy()

    return t.to(to_torch(dtype)).numpy().copy()


def from_storage(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Kernel bits back to numbers numpy can compare (bf16 and 8-bit floats widened to f32)."""
    if dtype is DType.BF16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype in _BYTE_FLOATS:
        import torch

        from emmy.dtypes import to_torch

        bits = torch.from_numpy(np.ascontiguousarray(array, np.uint8))
        return bits.view(to_torch(dtype)).to(torch.float32).numpy()
    return array


def poisoned(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    """An output buffer filled so that an element the kernel never writes fails the check."""
    if dtype is DType.BF16:
        return np.full(shape, 0x7FC0, np.uint16)
    if dtype in _BYTE_FLOATS:
        return np.full(shape, 0x7F, np.uint8)          # NaN in both formats
    if dtype.is_float:
        return np.full(shape, np.nan, _STORAGE[dtype])
    if dtype is DType.BOOL:
        return np.zeros(shape, np.bool_)  # no poison value exists for bool
    return np.full(shape, np.iinfo(_STORAGE[dtype]).min + 7, _STORAGE[dtype])
