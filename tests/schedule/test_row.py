"""The row codec: exact round trip, canonical-only parsing, and a fuzzed parser."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emmy.schedule.row import KEYS, Row, RowError, make_row, parse

CANON = "WORK=block:256 TILE=v4x2 REDUCE=shuffle STAGE=smem:async RASTER=row PLACE=fuse"


def test_round_trip():
    assert str(parse(CANON)) == CANON
    assert parse(CANON)["STAGE"] == "smem:async"


def test_subset_of_keys_round_trips():
    assert str(parse("WORK=thread:128 TILE=v1x1")) == "WORK=thread:128 TILE=v1x1"


@pytest.mark.parametrize("text, canonical", [
    ("TILE=v4x2 WORK=block:256", "WORK=block:256 TILE=v4x2"),          # key order
    ("WORK=block:256  TILE=v4x2", "WORK=block:256 TILE=v4x2"),         # two spaces
    ("work=block:256", "WORK=block:256"),                              # lowercase key
    ("WORK=block:0256", "WORK=block:256"),                             # leading zero
    (" WORK=block:256", "WORK=block:256"),                             # leading space
    ("WORK=Block:256", "WORK=block:256"),                              # uppercase value
])
def test_non_canonical_text_names_the_canonical_spelling(text, canonical):
    with pytest.raises(RowError, match=f"canonical spelling is `{canonical}`"):
        parse(text)


def test_unknown_key_lists_the_keys():
    with pytest.raises(RowError, match="unknown key `SPEED`.*WORK, TILE"):
        parse("SPEED=fast")


def test_repeated_key():
    with pytest.raises(RowError, match="appears twice"):
        parse("WORK=block:256 WORK=warp:4")


def test_replace_changes_one_decision():
    row = parse(CANON).replace("REDUCE", "smem")
    assert str(row) == CANON.replace("REDUCE=shuffle", "REDUCE=smem")


values = st.from_regex(r"[a-z][a-z0-9]{0,5}(:([a-z][a-z0-9]{0,3}|[1-9][0-9]{0,3}|0)){0,2}",
                       fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, min_size=1))
def test_every_canonical_row_round_trips(decisions):
    row = make_row(decisions)
    assert parse(str(row)) == row
    assert str(parse(str(row))) == str(row)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=60))
def test_random_text_raises_only_row_errors(text):
    try:
        row = parse(text)
    except RowError:
        return
    assert isinstance(row, Row) and str(row) == text


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_rows_raise_only_row_errors(data):
    chars = list(CANON)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(chars) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "swap", "char"]))
        if op == "drop" and len(chars) > 1:
            chars.pop(i)
        elif op == "dup":
            chars.insert(i, chars[i])
        elif op == "swap" and i + 1 < len(chars):
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        else:
            chars[i] = data.draw(st.sampled_from(list("=: 0aZ_\t.")))
    text = "".join(chars)
    try:
        row = parse(text)
    except RowError:
        return
    assert str(row) == text


def test_a_tile_shape_with_a_leading_zero_is_refused_with_the_canonical_number():
    with pytest.raises(RowError, match=r"write 64, not 064"):
        parse("WORK=warps:2x2 TILE=mma:064x64x32 REDUCE=serial STAGE=smem RASTER=row")
