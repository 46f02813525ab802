"""Compare the allocation sequences of two traces (e.g. a meta capture against a CPU capture), torch-free.

Matching rule: each trace's allocations, in ``alloc_seq`` order, become a sequence of (category, phase,
size_bytes) tokens. The two sequences are aligned with ``difflib.SequenceMatcher`` (longest matching blocks,
no junk heuristic); an allocation matches when it lies in a matching block. Agreement is the Dice coefficient
on bytes: ``2 * matched_bytes / (bytes_a + bytes_b)``, where ``matched_bytes`` sums the sizes of the matched
allocations (the same in both traces by construction). 1.0 means identical sequences.
"""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any

from uvmlab.trace.schema import Trace


def _tokens(trace: Trace) -> list[tuple[str, str, int]]:
    a = trace.allocations.sort_values("alloc_seq", kind="stable")
    return list(zip(a["category"], a["phase"], a["size_bytes"].astype(int), strict=True))


def compare_allocations(a: Trace, b: Trace, max_unmatched: int = 10) -> dict[str, Any]:
    """Align the allocation sequences of ``a`` and ``b``; return agreement and the largest unmatched tokens."""
    ta, tb = _tokens(a), _tokens(b)
    sm = difflib.SequenceMatcher(a=ta, b=tb, autojunk=False)
    matched_a = [False] * len(ta)
    matched_b = [False] * len(tb)
    matched_bytes = 0
    for block in sm.get_matching_blocks():
        for k in range(block.size):
            matched_a[block.a + k] = True
            matched_b[block.b + k] = True
            matched_bytes += ta[block.a + k][2]
    bytes_a = sum(t[2] for t in ta)
    bytes_b = sum(t[2] for t in tb)
    total = bytes_a + bytes_b
    only_a = Counter(t for t, m in zip(ta, matched_a, strict=True) if not m)
    only_b = Counter(t for t, m in zip(tb, matched_b, strict=True) if not m)

    def top(c: Counter[tuple[str, str, int]]) -> list[dict[str, Any]]:
        rows = sorted(c.items(), key=lambda kv: -kv[0][2] * kv[1])[:max_unmatched]
        return [{"category": k[0], "phase": k[1], "size_bytes": k[2], "count": n} for k, n in rows]

    return {
        "allocations_a": len(ta),
        "allocations_b": len(tb),
        "bytes_a": bytes_a,
        "bytes_b": bytes_b,
        "matched_allocations": sum(matched_a),
        "matched_bytes": matched_bytes,
        "agreement": 2 * matched_bytes / total if total else 1.0,
        "unmatched_bytes_a": bytes_a - matched_bytes,
        "unmatched_bytes_b": bytes_b - matched_bytes,
        "only_a": top(only_a),
        "only_b": top(only_b),
    }
