"""Normalize a kernel so that equivalent programs get the same body (and the same identity).

The passes, each a pure function `Kernel -> Kernel` in its own module:

    drop_unit_loops              unit_loops.py  a parallel loop that runs once is its body
    fold_constants               simplify.py  ops of literals computed; masks' bool round trips gone
    dedupe_loads                 cse.py       same buffer and index -> one load
    eliminate_common_subexpr…    cse.py       same op and operands in scope -> one value
    order_commutative_operands   commute.py   add(y, x+x) whichever way it was written
    hoist_invariants             hoist.py     what does not depend on a loop runs before it
    eliminate_dead_code          dce.py       nothing unread survives
    order_statements             schedule.py  each block re-emitted from its effects
    rename_ssa                   rename.py    in0…, v0…, acc0…, a0… in order of appearance
"""

from __future__ import annotations

from emmy.loop_ir.commute import order_commutative_operands
from emmy.loop_ir.cse import dedupe_loads, eliminate_common_subexpressions
from emmy.loop_ir.dce import eliminate_dead_code
from emmy.loop_ir.hoist import hoist_invariants
from emmy.loop_ir.ir import Kernel
from emmy.loop_ir.rename import rename_ssa
from emmy.loop_ir.schedule import order_statements
from emmy.loop_ir.simplify import fold_constants
from emmy.loop_ir.unit_loops import drop_unit_loops

__all__ = ["normalize", "drop_unit_loops", "fold_constants", "dedupe_loads",
           "eliminate_common_subexpressions", "order_commutative_operands", "hoist_invariants",
           "eliminate_dead_code", "order_statements", "rename_ssa"]

PASSES = (drop_unit_loops, fold_constants, dedupe_loads, eliminate_common_subexpressions,
          order_commutative_operands, eliminate_common_subexpressions, hoist_invariants,
          eliminate_common_subexpressions, eliminate_dead_code, order_statements, rename_ssa)


def normalize(k: Kernel) -> Kernel:
    """Run the passes in order, until the kernel stops changing (at most three rounds)."""
    for _ in range(3):
        before = k
        for run in PASSES:
            k = run(k)
        if k == before:
            break
    return k
