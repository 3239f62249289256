"""The schedule row codec: canonical text `KEY=value KEY=value …` <-> a `Row`.

A row is the complete set of decisions for one kernel. Keys come in a fixed order and are
spelled in capitals; a value is a lowercase word optionally followed by `:`-separated
parameters (words or decimal integers without leading zeros):

    WORK=block:256 TILE=v4x2 REDUCE=shuffle STAGE=smem:async RASTER=row PLACE=fuse

`parse(text)` accepts canonical text only: an alias, a reordered key, an extra space or a
leading zero is refused with a `RowError` that spells the canonical form, so that
`str(parse(text)) == text` for every accepted text. What a value means, and whether it is
legal for a kernel, is decided by the space and the legality rules, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYS: tuple[str, ...] = ("WORK", "TILE", "REDUCE", "STAGE", "RASTER", "PLACE")

_WORD = r"[a-z][a-z0-9]*"
_INT = r"(?:0|[1-9][0-9]*)"
_DIMS = rf"{_INT}(?:x{_INT})+"         # 128x128x32: a tile shape
_VALUE = re.compile(rf"{_WORD}(?::(?:{_WORD}|{_DIMS}|{_INT}))*")
_LOOSE_PAIR = re.compile(r"^\s*([A-Za-z_]+)\s*[=:]\s*(\S+)\s*$")


class RowError(ValueError):
    """A row's text is not canonical or not well-formed; the message says what would be."""


@dataclass(frozen=True, slots=True)
class Row:
    """Decisions by key, in canonical key order."""

    items: tuple[tuple[str, str], ...]

    def __post_init__(self):
        keys = [k for k, _ in self.items]
        if keys != sorted(keys, key=KEYS.index) or len(set(keys)) != len(keys):
            raise RowError(f"keys out of order or repeated: {' '.join(keys)}")
        for key, value in self.items:
            if key not in KEYS:
                raise RowError(f"unknown key {key}; keys are {', '.join(KEYS)}")
            if not _VALUE.fullmatch(value):
                raise RowError(f"{key}={value}: a value is a lowercase word with optional "
                               ":parameters, e.g. block:256 or mma:128x128x32")

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items)

    def __getitem__(self, key: str) -> str:
        for k, v in self.items:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.items).get(key, default)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.items)

    def replace(self, key: str, value: str) -> "Row":
        """A copy with one decision changed (or added)."""
        d = dict(self.items)
        d[key] = value
        return make_row(d)


def make_row(decisions: dict[str, str]) -> Row:
    """Build a row from decisions in any order."""
    unknown = [k for k in decisions if k not in KEYS]
    if unknown:
        raise RowError(f"unknown key {unknown[0]}; keys are {', '.join(KEYS)}")
    return Row(tuple((k, decisions[k]) for k in KEYS if k in decisions))


def parse(text: str) -> Row:
    """Parse canonical row text; anything else raises RowError naming the canonical spelling."""
    if not isinstance(text, str):
        raise RowError(f"a row is text, got {type(text).__name__}")
    if not text.strip():
        raise RowError("empty row; a row looks like `WORK=block:256 REDUCE=shuffle`")
    pairs = text.split(" ")
    if any(not p for p in pairs) or text != text.strip():
        _refuse(text, "separate KEY=value pairs with exactly one space")
    decisions: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            _refuse(text, f"`{pair}` is not KEY=value")
        if key not in KEYS:
            if key.upper() in KEYS:
                _refuse(text, f"keys are spelled in capitals: {key.upper()}, not {key}")
            raise RowError(f"unknown key `{key}` in `{pair}`; keys are {', '.join(KEYS)}")
        if key in decisions:
            raise RowError(f"key {key} appears twice in `{text}`")
        if not _VALUE.fullmatch(value):
            _refuse(text, f"{key}={value}: {_value_problem(value)}")
        decisions[key] = value
    row = make_row(decisions)
    if str(row) != text:
        _refuse(text, f"keys go in the order {' '.join(KEYS)}")
    return row


def _value_problem(value: str) -> str:
    parts = [n for p in value.split(":") for n in (p.split("x") if re.fullmatch(r"[0-9x]+", p) else [p])]
    for p in parts:
        if re.fullmatch(r"0[0-9]+", p):
            return f"write {int(p)}, not {p} (no leading zeros)"
    if value != value.lower():
        return f"values are lowercase: {value.lower()}"
    return ("a value is a lowercase word with optional :parameters, e.g. block:256 or "
            "mma:128x128x32")


def _canonical_guess(text: str) -> str | None:
    """Best effort canonical spelling of loosely written text, for error messages."""
    decisions: dict[str, str] = {}
    for chunk in text.replace(",", " ").split():
        m = _LOOSE_PAIR.match(chunk)
        if not m:
            return None
        key = m.group(1).upper()
        parts = m.group(2).lower().split(":")
        value = ":".join(str(int(p)) if p.isdigit() else p for p in parts)
        if key not in KEYS or key in decisions or not _VALUE.fullmatch(value):
            return None
        decisions[key] = value
    return str(make_row(decisions)) if decisions else None


def _refuse(text: str, why: str):
    guess = _canonical_guess(text)
    hint = f"; the canonical spelling is `{guess}`" if guess and guess != text else ""
    raise RowError(f"row `{text}` is not canonical: {why}{hint}")
