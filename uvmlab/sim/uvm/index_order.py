"""The index order of a gather or scatter: which rows of the indexed operand it visits, and when (issue 41 section 4).
Torch-free.

A declared gather / scatter (``uvm.kernel(..., pattern="gather", index=...)``, workloads.program) says what its
index holds, because real access streams are data (a CSR graph's sorted edges, an embedding batch's skewed ids):

``uniform``
    ``lookups`` rows drawn uniformly at random (with replacement) from ``rows``;
``zipf:A``
    a Zipf law of exponent ``A`` > 0 over the ``rows`` (row of rank ``k`` drawn with probability proportional to
    ``k^-A``; ranks shuffled over the table by the kernel's seed, so the hot rows are not all at its start): the
    skew of embedding ids and word frequencies;
``sorted``
    uniform rows, then sorted (a CSR edge list's targets, a sorted-then-gathered batch);
``rows:KEY``
    the exact rows the program gave (a tensor, an array or a ``.npy`` file), kept in the trace header under
    ``kernel_indices[KEY]`` (:func:`encode_rows`).

The trace's ``index`` column holds the spec with the table's row count and the lookups:
``"zipf:1.1;rows=1000000;lookups=65536"``. The replay turns it into the pages each thread visits step by step
(:func:`thread_page_visits`): thread ``t`` of ``n`` handles lookups ``t*L/n ... (t+1)*L/n - 1`` in order, and at step
``j`` touches the page holding its ``j``-th row (``row x row_bytes``, ``row_bytes`` = the indexed range's bytes /
``rows``). The seeded uniform permutation a gather gets without a spec (uvmlab.sim.uvm.order) is kept as the default.
Approximation: a row is taken to start a page visit of its own (a row spanning two pages touches the first).
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from uvmlab.errors import InputError

KINDS = ("uniform", "zipf", "sorted", "rows")
MAX_INDEX_ROWS = 1 << 24
"""Largest explicit index a program may give (16 M rows; kept in the trace header, about 4 bytes a row compressed):
a larger one is better described by a distribution."""
MAX_ZIPF_ROWS = 1 << 27
"""Largest table a Zipf law is drawn over (the probabilities are a float64 array of its rows)."""


@dataclass(frozen=True)
class IndexSpec:
    """A parsed ``index`` column value (module docstring)."""

    kind: str
    rows: int
    lookups: int
    exponent: float = 0.0
    key: str = ""

    def to_text(self) -> str:
        """The ``index`` column value."""
        head = {"zipf": f"zipf:{self.exponent:g}", "rows": f"rows:{self.key}"}.get(self.kind, self.kind)
        return f"{head};rows={self.rows};lookups={self.lookups}"


def parse_spec(text: str) -> IndexSpec:
    """Parse an ``index`` column value; a malformed one is an InputError naming it."""
    parts = [p.strip() for p in str(text).split(";")]
    head, fields = parts[0], dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    kind, _, arg = head.partition(":")
    try:
        rows, lookups = int(fields["rows"]), int(fields["lookups"])
    except (KeyError, ValueError):
        raise InputError(f"index order {text!r} needs ';rows=R;lookups=L' (whole numbers)") from None
    if kind not in KINDS or rows < 1 or lookups < 0:
        raise InputError(f"index order {text!r}: kind must be one of {', '.join(KINDS)}, rows >= 1, lookups >= 0")
    if kind == "zipf":
        try:
            exponent = float(arg)
        except ValueError:
            exponent = -1.0
        if not exponent > 0 or not np.isfinite(exponent):
            raise InputError(f"index order {text!r}: zipf needs an exponent > 0 (zipf:1.1)")
        if rows > MAX_ZIPF_ROWS:
            raise InputError(f"index order {text!r}: a Zipf law over more than {MAX_ZIPF_ROWS:,} rows is not drawn")
        return IndexSpec(kind, rows, lookups, exponent=exponent)
    if kind == "rows":
        if not arg:
            raise InputError(f"index order {text!r}: rows needs a key (rows:KEY)")
        return IndexSpec(kind, rows, lookups, key=arg)
    return IndexSpec(kind, rows, lookups)


def encode_rows(rows: np.ndarray) -> dict[str, Any]:
    """Explicit index rows as JSON for the trace header: int64, zlib, base64."""
    a = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).ravel())
    return {"n": int(a.size), "int64_zlib_b64": base64.b64encode(zlib.compress(a.tobytes(), 6)).decode("ascii")}


def decode_rows(doc: Any) -> np.ndarray:
    """The rows :func:`encode_rows` kept; a damaged entry is an InputError."""
    try:
        raw = zlib.decompress(base64.b64decode(doc["int64_zlib_b64"]), bufsize=8 * int(doc["n"]) + 64)
        a = np.frombuffer(raw, dtype=np.int64)
    except (KeyError, TypeError, ValueError, zlib.error):
        raise InputError("trace header kernel_indices entry is damaged (re-capture the workload)") from None
    if a.size != int(doc["n"]):
        raise InputError("trace header kernel_indices entry has the wrong length (re-capture the workload)")
    return a


def draw_rows(spec: IndexSpec, seed: int, arrays: dict[str, Any] | None = None) -> np.ndarray:
    """The row each lookup visits, in lookup order (module docstring)."""
    rng = np.random.default_rng(seed)
    if spec.kind == "rows":
        doc = (arrays or {}).get(spec.key)
        if doc is None:
            raise InputError(f"index rows {spec.key!r} are not in the trace header (re-capture the workload)")
        rows = decode_rows(doc)
        if rows.size and (rows.min() < 0 or rows.max() >= spec.rows):
            raise InputError(f"index rows {spec.key!r} fall outside the table's {spec.rows} rows")
        return rows
    if spec.kind == "zipf":
        weights = np.arange(1, spec.rows + 1, dtype=float) ** -spec.exponent
        ranks = rng.choice(spec.rows, size=spec.lookups, p=weights / weights.sum())
        return rng.permutation(spec.rows)[ranks]  # the hot ranks spread over the table
    rows = rng.integers(0, spec.rows, size=spec.lookups)
    return np.sort(rows) if spec.kind == "sorted" else rows


def thread_page_visits(rows: np.ndarray, row_bytes: float, n_threads: int, page_bytes: int) -> np.ndarray:
    """(n_threads, steps) page indices in the indexed range that each thread visits step by step (-1: none): thread
    ``t`` takes its contiguous share of the lookups in order (module docstring)."""
    n = max(1, int(n_threads))
    pages = (rows.astype(float) * row_bytes // page_bytes).astype(np.int64)
    steps = max(1, -(-pages.size // n))
    out = np.full(n * steps, -1, dtype=np.int64)
    out[: pages.size] = pages
    return out.reshape(n, steps)


__all__ = ["KINDS", "IndexSpec", "decode_rows", "draw_rows", "encode_rows", "parse_spec", "thread_page_visits"]
