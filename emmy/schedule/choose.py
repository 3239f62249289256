"""Choose each kernel's row: the one the user gave (checked), else the space's default."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from emmy.errors import UserError, unknown_kernel
from emmy.schedule.row import Row, RowError, parse
from emmy.schedule.space import space_of
from emmy.schedule.targets import Target
from emmy.tile_ir.cut import cut_in_two, splits
from emmy.tile_ir.ir import TileProgram


def choose_rows(tp: TileProgram, target: Target, given: Mapping[str, str], *,
                db: str | None = "") -> tuple[TileProgram, dict[str, Row]]:
    """Rows by kernel name: the row given for a kernel ("" names the only one), else the
    schedule database's record for its identity (db: a path, "" the default, None: no
    database), else the space's default. A record the space no longer accepts is skipped.

    A kernel whose row says PLACE=cut and that a template builds (a fused chain of products,
    a product with a computed operand) becomes its two kernels (`<name>_cut0`, `<name>_cut1`,
    emmy.tile_ir.cut) with the buffer between them,
    and each of those gets its own row the same way (so a chain of three cuts twice:
    `<name>_cut0_cut0`, ...); the program returned has them."""
    names = [k.name for k in tp.kernels]
    given = dict(given)
    if "" in given:
        if len(names) != 1:
            raise UserError(f"the program has {len(names)} kernels; say which one the row is "
                            f"for with --kernel ({', '.join(names)})")
        given[names[0]] = given.pop("")
    rows: dict[str, Row] = {}
    kernels, intermediates = [], list(tp.intermediates)
    cut: set[str] = set()       # kernels whose row cut them in two

    def place(k) -> None:
        row = _choose(k, target, given, db)
        parts = cut_in_two(k) if row.get("PLACE") == "cut" else None
        if parts is None:
            kernels.append(k)
            rows[k.name] = row
            return
        first, second, mid = parts
        cut.add(k.name)
        intermediates.append(mid)
        place(first)
        place(second)

    for k in tp.kernels:
        place(k)
    unknown = [n for n in given if n not in rows and n not in names and n not in cut]
    if unknown:
        hint = [f"{k.name}_cut0, {k.name}_cut1 exist when {k.name}'s row has PLACE=cut"
                for k in tp.kernels if splits(k)]
        listed = dict.fromkeys([*(k.name for k in tp.kernels), *rows])   # a chain, its halves
        raise unknown_kernel(unknown[0], listed, "; ".join(hint))
    program = replace(tp, kernels=tuple(kernels), intermediates=tuple(intermediates))
    return program, rows


def _choose(k, target: Target, given: Mapping[str, str], db: str | None) -> Row:
    space = space_of(k, target)
    if k.name not in given:
        return _recorded(k, space, target, db) or space.default()
    text = given[k.name]
    try:
        row = parse(text)
    except RowError as e:
        raise UserError(f"In row for kernel `{k.name}`: {e}") from None
    refusals = space.check(row)
    if refusals:
        reasons = "\n".join(f"  - {r}" for r in refusals)
        raise UserError(f"In row for kernel `{k.name}` on {target.name}: `{text}` is illegal:\n"
                        f"{reasons}")
    return row


def _recorded(k, space, target: Target, db: str | None) -> Row | None:
    if db is None:
        return None
    from emmy.schedule.db import recorded_row

    record = recorded_row(k.identity, target.name, db or None)
    if not record:
        return None
    try:
        row = parse(record.get("row", ""))
    except RowError:
        return None
    return None if space.check(row) else row


def with_cut_chains(kernels, loop_program) -> tuple:
    """The kernels the default rows make, each chain of products that its default row cut
    (into `<name>_cut0` and `<name>_cut1`) listed too, before its halves: a row for it may say
    PLACE=fuse (one back-to-back kernel) as well as cut it."""
    from emmy.tile_ir.lift import lift_program

    names = {k.name for k in kernels}
    if not any(n.endswith("_cut0") for n in names):
        return tuple(kernels)      # no default cut a chain: nothing to lift again
    cut = {k.name: k for k in lift_program(loop_program).kernels
           if k.name not in names and f"{k.name}_cut0" in names}
    out = []
    for k in kernels:
        chain = next((c for n, c in cut.items() if k.name == f"{n}_cut0"), None)
        if chain is not None:
            out.append(chain)
        out.append(k)
    return tuple(out)
