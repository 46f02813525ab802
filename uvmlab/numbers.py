"""User-given numbers: the one parser for every number a user types or a user's JSON holds (docs/safety.md).

Python turns any digit string into an ``int`` until its 4,300-digit guard raises ``ValueError``, and ``float()``
takes ``inf``, ``nan`` and ``1e400`` (infinity) without a word. Every number from a user passes here first:

- an integer is at most :data:`MAX_INT_DIGITS` digits long, refused *before* it is converted, then checked
  against the caller's range (by default int64, what every table and PyTorch store);
- a real number is finite (``inf``, ``nan`` and literals that overflow to infinity are refused), then checked
  against the caller's range;
- a refused value is quoted as a short prefix (:func:`prefix`), never whole: an error is one short sentence.

Where the numbers come from: the CLI's integer and real options (``uvmlab.cli.options.harden_numbers`` gives
every one of them these types, for every command of the click tree), KEY=VALUE JSON values (``--option``,
``--sim-option``, per-job options of ``colocate``, evaluate's ``config`` column: :func:`json_loads`), a
``colocate`` job's batch size, the oversubscription factor, and the numbers of a ``--params`` file.
"""

from __future__ import annotations

import json
import math
from typing import Any

from uvmlab.errors import InputError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
"""Largest integer a foreign data file may hold (:func:`json_loads` with ``int_max``): tools write unsigned 64-bit
counters and hashes (DLPerf's benchmark files label every entry with uint64 hashes up to 1.8e19)."""
MAX_INT_DIGITS = 19
"""Digits of the longest integer accepted (int64's largest, 9,223,372,036,854,775,807, has 19)."""
MAX_NUMBER_CHARS = 64
"""Characters of the longest integer text parsed (with signs, underscores and leading zeros)."""
PREFIX_CHARS = 24
"""Characters of a refused value quoted in a sentence."""


def prefix(text: Any) -> str:
    """``text`` quoted for an error sentence: whole when short, else its first :data:`PREFIX_CHARS` characters and
    its length (``'99999999999999999999...' (5,000 characters)``)."""
    if isinstance(text, int) and not isinstance(text, bool) and text.bit_length() > 256:
        return f"an integer of about {int(text.bit_length() * math.log10(2)):,} digits"
    s = text if isinstance(text, str) else str(text) if isinstance(text, int | float) else repr(text)
    if len(s) <= PREFIX_CHARS + 8:
        return repr(s) if isinstance(text, str) else s
    return f"{s[:PREFIX_CHARS]!r}... ({len(s):,} characters)"


def _digits(text: str) -> int:
    body = text.strip().lstrip("+-").replace("_", "")
    return len(body.lstrip("0")) if body.isdigit() else -1


def parse_int(value: Any, what: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """``value`` (text or an int, never a bool) as an int in ``[lo, hi]``; anything else is an InputError naming
    ``what`` and quoting a short prefix of the value."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a whole number, not {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        text = value.strip()
        digits = _digits(text)
        if len(text) > MAX_NUMBER_CHARS or digits > MAX_INT_DIGITS:
            raise InputError(f"{what} must be a whole number of at most {MAX_INT_DIGITS} digits, not {prefix(value)}")
        if digits < 0:
            raise InputError(f"{what} must be a whole number, not {prefix(value)}")
        n = int(text)
    else:
        raise InputError(f"{what} must be a whole number, not {prefix(value)}")
    if not lo <= n <= hi:
        raise InputError(f"{what} must be {_range(lo, hi)}, not {prefix(n)}")
    return n


def parse_float(value: Any, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """``value`` (text or a number, never a bool) as a finite float in ``[lo, hi]``; ``inf``, ``nan`` and
    overflowing literals are refused (InputError quoting a short prefix)."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a number, not {value!r}")
    if isinstance(value, int):
        if abs(value) > 10**308:
            raise InputError(f"{what} must be a finite number, not {prefix(value)}")
        f = float(value)
    elif isinstance(value, float):
        f = value
    elif isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            raise InputError(f"{what} must be a number, not {prefix(value)}") from None
    else:
        raise InputError(f"{what} must be a number, not {prefix(value)}")
    if not math.isfinite(f):
        raise InputError(f"{what} must be a finite number, not {prefix(value)}")
    if not lo <= f <= hi:
        raise InputError(f"{what} must be {_range(lo, hi)}, not {f:g}")
    return f


def _range(lo: float, hi: float) -> str:
    if lo in (INT64_MIN, -math.inf) and hi in (INT64_MAX, math.inf):
        return "a 64-bit number"
    if lo in (INT64_MIN, -math.inf):
        return f"<= {hi:,}" if isinstance(hi, int) else f"<= {hi:g}"
    if hi in (INT64_MAX, math.inf):
        return f">= {lo:,}" if isinstance(lo, int) else f">= {lo:g}"
    return f"from {lo:,} to {hi:,}" if isinstance(lo, int) and isinstance(hi, int) else f"from {lo:g} to {hi:g}"


# -- JSON ---------------------------------------------------------------------------------------------------------
def _json_int(text: str, int_max: int = INT64_MAX) -> int:
    if _digits(text) > len(str(int_max)) or not INT64_MIN <= int(text) <= int_max:
        raise InputError(f"the integer {prefix(text)} does not fit 64 bits")
    return int(text)


def _json_float(text: str) -> float:
    if not math.isfinite(f := float(text)):
        raise InputError(f"the number {prefix(text)} is not a finite 64-bit float")
    return f


def _json_constant(name: str) -> float:
    raise InputError(f"{name} is not a number uvmlab accepts (only finite numbers)")


def json_loads(text: str | bytes, what: str, int_max: int = INT64_MAX) -> Any:
    """``json.loads(text)`` with every number checked while it is decoded: integers within int64 (up to ``int_max``:
    :data:`UINT64_MAX` for a foreign data file; a 5,000-digit literal is refused before Python converts it), reals
    finite (``1e400``), no ``NaN`` / ``Infinity``. A refused number is an InputError naming ``what``; text that is
    not JSON raises ``json.JSONDecodeError`` as ``json.loads`` does."""
    try:
        return json.loads(
            text,
            parse_int=_json_int if int_max == INT64_MAX else lambda t: _json_int(t, int_max),
            parse_float=_json_float,
            parse_constant=_json_constant,
        )
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_INT_DIGITS",
    "MAX_NUMBER_CHARS",
    "UINT64_MAX",
    "json_loads",
    "parse_float",
    "parse_int",
    "prefix",
]
