"""Choose each kernel's row: the one the user gave (checked), else the space's default."""

from __future__ import annotations

from typing import Mapping

from emmy.errors import UserError
from emmy.schedule.row import Row, RowError, parse
from emmy.schedule.space import Space
from emmy.schedule.targets import Target
from emmy.tile_ir.ir import TileProgram


def choose_rows(tp: TileProgram, target: Target, given: Mapping[str, str], *,
                db: str | None = "") -> dict[str, Row]:
    """Rows by kernel name: the row given for a kernel ("" names the only one), else the
    schedule database's record for its identity (db: a path, "" the default, None: no
    database), else the space's default. A record the space no longer accepts is skipped."""
    names = [k.name for k in tp.kernels]
    given = dict(given)
    if "" in given:
        if len(names) != 1:
            raise UserError(f"the program has {len(names)} kernels; say which one the row is "
                            f"for with --kernel ({', '.join(names)})")
        given[names[0]] = given.pop("")
    for name in given:
        if name not in names:
            raise UserError(f"no kernel `{name}`; the kernels are {', '.join(names)}")
    rows: dict[str, Row] = {}
    for k in tp.kernels:
        space = Space(k, target)
        if k.name not in given:
            rows[k.name] = _recorded(k, space, target, db) or space.default()
            continue
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
        rows[k.name] = row
    return rows


def _recorded(k, space: Space, target: Target, db: str | None) -> Row | None:
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
