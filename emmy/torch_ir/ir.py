"""Torch IR: the exported graph, one node per torch op, in the order torch.export gave it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Union

from emmy.dtypes import DType


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True, slots=True)
class Ref:
    """A use of another value of the graph by name."""

    name: str

    def __str__(self) -> str:
        return self.name


# An argument: a Ref, a literal (int, float, bool, complex, str, None, DType), or a tuple of those.
Arg = Union[Ref, int, float, bool, complex, str, None, DType, tuple]


class InputKind(Enum):
    INPUT = "input"          # a tensor from get_inputs()
    PARAM = "param"          # a parameter of the module: load("weight")
    BUFFER = "buffer"        # a registered buffer (running_mean, …)
    CONSTANT = "constant"    # a tensor constant lifted by torch.export


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str
    kind: InputKind
    type: TensorType
    target: str | None = None  # the module attribute path for params and buffers


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    op: str                                   # short aten name: "rms_norm", "linear", "add.Tensor"
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...] = ()
    type: TensorType | tuple[TensorType, ...] | None = None
    source: str | None = None                 # "file.py:12: return self.norm(x)" when known

    def kwarg(self, key: str, default: Any = None) -> Any:
        return dict(self.kwargs).get(key, default)


INPUT_UPDATE = "input:"


def input_update(position: int) -> str:
    """The `Graph.updates` entry of the model's `position`-th tensor input."""
    return f"{INPUT_UPDATE}{position}"


def updated_input(target: str) -> int | None:
    """The position among the model's tensor inputs that an update writes, or None where it
    writes a buffer (a module path)."""
    return int(target[len(INPUT_UPDATE):]) if target.startswith(INPUT_UPDATE) else None


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    placeholders: tuple[Placeholder, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Ref, ...]
    tf32: bool = False        # float32 products may round operands to tf32 (Workload.tf32)
    # Buffers the model writes (a KV cache's `self.k[:, pos] = k`), by module path, and model
    # inputs it writes (`x.sigmoid_()` on an argument), as `input_update(i)` of the i-th tensor
    # input: the last len(updates) outputs are their new values, which the caller writes back
    # after the call.
    updates: tuple[str, ...] = ()
    # Values of params, buffers and constants by placeholder name (torch tensors); not part of
    # the graph's identity, so excluded from comparison.
    values: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def node(self, name: str) -> Node | Placeholder:
        for p in self.placeholders:
            if p.name == name:
                return p
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def returned(self) -> tuple[Ref, ...]:
        """What the model returns: the outputs but the buffers' new values."""
        return self.outputs[:len(self.outputs) - len(self.updates)]

    @property
    def inputs(self) -> tuple[Placeholder, ...]:
        return tuple(p for p in self.placeholders if p.kind is InputKind.INPUT)

    def update_label(self, target: str) -> str:
        """How the model holds what an update writes: `buffer k_cache`, `input heat`."""
        i = updated_input(target)
        return f"buffer {target}" if i is None else f"input {self.inputs[i].name}"
