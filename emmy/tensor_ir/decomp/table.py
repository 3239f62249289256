"""The shape of a decomposition table: op name -> a function that builds Tensor IR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, slots=True)
class Decomp:
    """How to lower one torch op.

    `fn(b, *args, **kwargs)` receives the Builder and the node's arguments, tensors as definition
    names, and returns a name (or a tuple of names for ops with several results).
    With `opmath`, f16/bf16 tensor arguments are cast to f32 first and float results cast back
    to the input's type, as PyTorch computes these ops (norms, softmax, losses, matmul, …).
    """

    fn: Callable
    opmath: bool = False


def registrar(table: dict[str, Decomp]):
    """A decorator `@op("name", "name.overload", opmath=…)` that fills `table`."""

    def op(*names: str, opmath: bool = False):
        def register(fn: Callable) -> Callable:
            for name in names:
                if name in table:
                    raise ValueError(f"op {name} registered twice")
                table[name] = Decomp(fn, opmath)
            return fn

        return register

    return op


@dataclass(frozen=True, slots=True)
class TorchShaped:
    """A result whose shape is whatever torch's graph says (its kernels disagree: embedding_bag's
    bookkeeping): `value` where it has that shape, else zeros of it in `dtype`."""

    value: str | None
    dtype: object


class Refused(Exception):
    """A decomposition does not handle these arguments (the driver reports the op and line)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail
