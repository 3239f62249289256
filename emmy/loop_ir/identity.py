"""A kernel's identity: a short hash of its normalized text with buffers named by position.

Two kernels that compute the same thing on buffers of the same types get the same identity,
whatever their names, so a schedule found for one can be reused for the other.
"""

from __future__ import annotations

import dataclasses
import hashlib

from emmy.loop_ir.ir import Buffer, Kernel, Load, Loop, Stmt, Store
from emmy.loop_ir.normalize import normalize
from emmy.loop_ir.printer import print_kernel


def kernel_id(k: Kernel) -> str:
    """sha256 of `identity_text(k)`, 12 hex digits."""
    return hashlib.sha256(identity_text(k).encode()).hexdigest()[:12]


def identity_text(k: Kernel) -> str:
    """The normalized kernel printed with inputs in0, in1, … and outputs out0, …, unnamed."""
    k = normalize(k)
    names = {b.name: f"in{i}" for i, b in enumerate(k.inputs)}
    names.update({b.name: f"out{i}" for i, b in enumerate(k.outputs)})
    k = dataclasses.replace(
        k, name="kernel",
        inputs=tuple(Buffer(names[b.name], b.type) for b in k.inputs),
        outputs=tuple(Buffer(names[b.name], b.type) for b in k.outputs),
        body=_rename_buffers(k.body, names))
    return print_kernel(k, show_id=False)


def _rename_buffers(body: tuple[Stmt, ...], names: dict[str, str]) -> tuple[Stmt, ...]:
    out = []
    for s in body:
        match s:
            case Loop():
                s = dataclasses.replace(s, body=_rename_buffers(s.body, names))
            case Load() | Store():
                s = dataclasses.replace(s, buffer=names[s.buffer])
        out.append(s)
    return tuple(out)
