"""Baseline estimators: shape inference (peak live bytes) and the DNNMem-style BFC arena."""

from __future__ import annotations

import pytest
from eval_helpers import make_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.evaluate.bfc import BFC_ROUND_BYTES, BfcArena, round_bfc
from uvmlab.evaluate.estimators import EvalCase, bfc_peak, get_estimators, shape_inference_peak


def test_round_bfc() -> None:
    assert round_bfc(1) == BFC_ROUND_BYTES
    assert round_bfc(0) == BFC_ROUND_BYTES
    assert round_bfc(257) == 512
    assert round_bfc(512) == 512


def test_bfc_best_fit_split_and_coalesce() -> None:
    a = BfcArena()
    x = a.malloc(1024)  # [0, 1024)
    y = a.malloc(512)  # [1024, 1536)
    z = a.malloc(2048)  # [1536, 3584)
    assert (x, y, z) == (0, 1024, 1536) and a.peak_bytes == 3584
    a.free(x)
    a.free(y)  # coalesces with x: one free chunk [0, 1536)
    a.check_invariants()
    w = a.malloc(256)  # best fit: the 1536 chunk, split
    assert w == 0 and a.top_bytes == 3584
    a.free(z)  # top chunk returns to the arena
    assert a.top_bytes == 256
    a.check_invariants()
    assert a.peak_bytes == 3584


def test_estimators_on_a_known_trace() -> None:
    # 1000 B live, freed; then 300 B + 300 B live together: peak live = 1000; BFC rounds to 1024 and reuses it
    trace = make_trace([(1000, 1), (300, 2), (300, 0)])
    assert shape_inference_peak(trace) == 1000
    assert bfc_peak(trace) == 1024
    case = EvalCase("c", 10**9, False, 2048.0, trace=trace)
    names = [e.name for e in get_estimators(["shape-inference", "dnnmem"])]
    assert names == ["shape-inference", "dnnmem"]
    assert [e.estimate(case) for e in get_estimators(["shape-inference", "dnnmem"])] == [1000, 1024]


def test_unknown_estimator() -> None:
    with pytest.raises(InputError, match="unknown estimator"):
        get_estimators(["nope"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 8)), min_size=1, max_size=40))
def test_bfc_never_below_live_bytes(ops) -> None:
    trace = make_trace(ops)
    assert bfc_peak(trace) >= shape_inference_peak(trace)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 10**5), st.integers(0, 10**6)), max_size=60))
def test_bfc_invariants_hold(ops) -> None:
    a = BfcArena()
    live: list[int] = []
    for is_free, size, pick in ops:
        if is_free and live:
            a.free(live.pop(pick % len(live)))
        else:
            live.append(a.malloc(size))
        a.check_invariants()
        assert a.allocated_bytes <= a.top_bytes <= a.peak_bytes
    assert len(set(live)) == len(live)  # no two live chunks share an address
