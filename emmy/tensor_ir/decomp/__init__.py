"""Decompositions of torch ops into Tensor IR, one table per family of ops."""

from __future__ import annotations

from emmy.tensor_ir.decomp import (activations, attention, conv, creation, elementwise, indexing,
                                   layout, linalg, losses, matmul, norms, pooling, reductions,
                                   resample, scans, softmax, spectral)
from emmy.tensor_ir.decomp.table import Decomp

FAMILIES = (elementwise, activations, creation, layout, indexing, reductions, softmax, norms,
            matmul, attention, scans, losses, pooling, conv, resample, spectral, linalg)


def _merge() -> dict[str, Decomp]:
    table: dict[str, Decomp] = {}
    for family in FAMILIES:
        for name, decomp in family.OPS.items():
            if name in table:
                raise ValueError(f"op {name} is in two decomposition tables")
            table[name] = decomp
    return table


REGISTRY: dict[str, Decomp] = _merge()
SUPPORTED_OPS: list[str] = sorted(REGISTRY)
