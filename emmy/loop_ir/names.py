"""Names for kernels and short descriptions of Tensor IR definitions (for notes)."""

from __future__ import annotations

import re

from emmy.tensor_ir.ir import Cast, Def, Elementwise, Gather, IndexMap, Input, Iota, Reduce, Scan

_GENERATED = re.compile(r"^(v\d+|%\d+)$")  # the Tensor IR builder's fresh names


def is_generated(name: str) -> bool:
    return bool(_GENERATED.match(name))


def kernel_name(i: int, d: Def, program: str, single: bool) -> str:
    """`k{i}_{name}`: the stored tensor's name; for a generated name, the program's name when
    it has one kernel, else the tensor's op (`k1_divide`)."""
    base = d.name if not is_generated(d.name) else program if single else op_name(d)
    return f"k{i}_{sanitize(base)}"


def buffer_names(stored: list[Def], outputs: tuple[str, ...], taken: set[str]) -> dict[str, str]:
    """Buffer names for stored tensors: their own, or `out{i}` / `{op}{j}` for generated ones
    (which would read like SSA values in a kernel: `v1[a0] = v1`)."""
    names: dict[str, str] = {}
    used = set(taken)
    counts: dict[str, int] = {}
    for d in stored:
        if not is_generated(d.name):
            names[d.name] = d.name
            used.add(d.name)
    for d in stored:
        if d.name in names:
            continue
        if d.name in outputs:
            stem, j = "out", outputs.index(d.name)
        else:
            stem = op_name(d)
            j = counts.get(stem, 0)
        while f"{stem}{j}" in used:
            j += 1
        counts[stem] = j + 1
        names[d.name] = f"{stem}{j}"
        used.add(names[d.name])
    return names


def sanitize(name: str) -> str:
    text = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_").lower()
    return text or "kernel"


def op_name(d: Def) -> str:
    """The primitive's short name: `divide`, `sum`, `cumsum`, `cast`, `copy`, `iota`."""
    match d:
        case Elementwise():
            return str(d.op)
        case Reduce():
            return str(d.op)
        case Scan():
            return f"cum{d.op}"
        case Cast():
            return "cast"
        case IndexMap():
            return "copy"
        case Iota():
            return "iota"
        case Gather():
            return "gather"
        case Input():
            return "input"
    return "kernel"


def describe(d: Def) -> str:
    """A few words for a note: `a sum reduction`, `an index_map`, `a scan`."""
    match d:
        case Reduce():
            return f"a {d.op} reduction"
        case Scan():
            return f"a cum{d.op} scan"
        case IndexMap():
            return "an index_map"
        case Gather():
            return "a gather"
        case Elementwise():
            return f"elementwise {d.op}"
        case Cast():
            return "a cast"
    return type(d).__name__.lower()
