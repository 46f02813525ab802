"""uvmlab.numbers, the one parser of user-given numbers: properties (hypothesis) and the issue's values."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.numbers import INT64_MAX, INT64_MIN, UINT64_MAX, json_loads, parse_float, parse_int, prefix

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@given(st.integers(INT64_MIN, INT64_MAX))
def test_every_int64_parses_back(n: int) -> None:
    assert parse_int(str(n), "x") == n
    assert parse_int(n, "x") == n


@given(
    st.integers(0, 10**30).map(lambda k: INT64_MAX + 1 + k) | st.integers(0, 10**30).map(lambda k: INT64_MIN - 1 - k)
)
def test_beyond_int64_is_one_short_sentence(n: int) -> None:
    with pytest.raises(InputError) as info:
        parse_int(str(n), "the value")
    assert len(str(info.value)) < 200


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_parses_back(x: float) -> None:
    assert parse_float(repr(x), "x") == x


@given(JSON_VALUES)
def test_json_loads_agrees_with_json_on_what_it_takes(value: object) -> None:
    text = json.dumps(value)
    assert json_loads(text, "x") == json.loads(text)


@pytest.mark.parametrize(
    "text", ["9" * 5000, "-" + "9" * 5000, "Infinity", "-Infinity", "NaN", "1e400", "-1e400", "9223372036854775808"]
)
def test_the_issue_values_are_refused_in_json(text: str) -> None:
    with pytest.raises(InputError) as info:
        json_loads(f'{{"n_layer": {text}}}', "--option n_layer")
    message = str(info.value)
    assert message.startswith("--option n_layer: ") and len(message) < 200 and "9" * 100 not in message


@pytest.mark.parametrize("text", ["9" * 5000, "inf", "-inf", "nan", "Infinity", "1e400", "0x10", "", "1.5"])
def test_parse_int_refuses_with_a_prefix(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_int(text, "-n", lo=1)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("text", ["9" * 5000, "inf", "nan", "-inf", "1e400", True])
def test_parse_float_refuses_non_finite(text: object) -> None:
    with pytest.raises(InputError):
        parse_float(text, "x")


def test_prefix_never_prints_a_huge_value() -> None:
    assert prefix("abc") == "'abc'"
    assert prefix("9" * 5000) == "'999999999999999999999999'... (5,000 characters)"
    assert prefix(10**5000) == "an integer of about 5,000 digits"  # str() of it would raise (4,300-digit limit)
    assert prefix(12) == "12" and prefix(math.pi).startswith("3.14")


def test_a_foreign_data_file_may_hold_unsigned_64_bit_integers() -> None:
    """DLPerf's benchmark files label entries with uint64 hashes (1.58e19): read with ``int_max=UINT64_MAX``, and
    nothing wider; a user's file stays within int64."""
    assert json_loads(f"[{UINT64_MAX}]", "x", UINT64_MAX) == [UINT64_MAX]
    for text in (str(UINT64_MAX + 1), "9" * 21, "9" * 5000):
        with pytest.raises(InputError, match="does not fit 64 bits"):
            json_loads(f"[{text}]", "x", UINT64_MAX)
    with pytest.raises(InputError, match="does not fit 64 bits"):
        json_loads(f"[{INT64_MAX + 1}]", "x")
