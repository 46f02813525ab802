"""The trace-table helpers computed on column arrays equal their pandas formulations (the frame operations they
replaced, kept here as the reference), on random tables: iteration bounds, first kernels per stream, the event
list, live bytes per category, and the checks of Trace.validate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.trace.orchestrate import (
    CUBLAS_OPS,
    OrchestrationRules,
    _first_kernels,
    _iteration_bounds,
    op_base,
    to_cuda,
)
from uvmlab.trace.schema import CATEGORIES, NEVER_FREED, PHASES, Trace
from uvmlab.trace.summary import live_by_category

NAMES = ("aten::mm", "aten::addmm", "aten::add", "aten.convolution.default", "aten::_foreach_add_")


@st.composite
def tables(draw: Any, missing_phases: bool = False) -> Trace:
    """Random allocations and kernels sharing one shuffled event sequence (frees included)."""
    n_a = draw(st.integers(0, 25))
    n_k = draw(st.integers(0, 25))
    frees = draw(st.lists(st.booleans(), min_size=n_a, max_size=n_a))
    n_events = n_a + sum(frees) + n_k
    order = draw(st.permutations(range(n_events)))
    seqs = iter(order)
    phase = st.sampled_from(PHASES + ((None,) if missing_phases else ()))
    allocs = []
    for i in range(n_a):
        a, f = next(seqs), (next(seqs) if frees[i] else NEVER_FREED)
        if f != NEVER_FREED and f < a:
            a, f = f, a
        allocs.append(
            {"alloc_id": i, "size_bytes": draw(st.integers(0, 1 << 40)), "alloc_seq": a, "free_seq": f,
             "category": draw(st.sampled_from(CATEGORIES)), "phase": draw(phase),
             "iteration": draw(st.integers(-1, 3)), "op": "aten::empty", "stream": draw(st.integers(0, 2))}
        )  # fmt: skip
    kernels = [
        {"kernel_id": i, "seq": next(seqs), "name": draw(st.sampled_from(NAMES)), "phase": draw(phase),
         "iteration": draw(st.integers(-1, 3)), "flops": 1.0, "stream": draw(st.integers(0, 2))}
        for i in range(n_k)
    ]  # fmt: skip
    a_cols = ["alloc_id", "size_bytes", "alloc_seq", "free_seq", "category", "phase", "iteration", "op", "stream"]
    k_cols = ["kernel_id", "seq", "name", "phase", "iteration", "flops", "stream"]
    return Trace(
        allocations=pd.DataFrame(allocs, columns=a_cols).astype({"alloc_seq": "int64", "free_seq": "int64"}),
        kernels=pd.DataFrame(kernels, columns=k_cols).astype({"seq": "int64", "stream": "int64"}),
    )


@settings(max_examples=150, deadline=None)
@given(tables(missing_phases=True))
def test_iteration_bounds_equal_the_groupby(trace: Trace) -> None:
    a = trace.allocations[["iteration", "phase", "alloc_seq"]].rename(columns={"alloc_seq": "seq"})
    ev = pd.concat([a, trace.kernels[["iteration", "phase", "seq"]]], ignore_index=True)
    ref = ev.groupby(["iteration", "phase"])["seq"].agg(["min", "max"])
    first, last = _iteration_bounds(trace)
    assert first == {(int(i), p): int(v) for (i, p), v in ref["min"].items()}
    assert last == {(int(i), p): int(v) for (i, p), v in ref["max"].items()}


@settings(max_examples=150, deadline=None)
@given(tables())
def test_first_kernels_equal_the_frame_formulation(trace: Trace) -> None:
    k = trace.kernels
    hits = k[k["name"].map(op_base).isin(CUBLAS_OPS)]
    ref = hits.sort_values("seq", kind="stable").groupby("stream", sort=True).head(1)
    assert _first_kernels(k, CUBLAS_OPS).tolist() == ref.index.tolist()


@settings(max_examples=150, deadline=None)
@given(tables())
def test_events_equal_the_frame_formulation(trace: Trace) -> None:
    a = trace.allocations
    cols = ["alloc_id", "size_bytes", "stream"]
    allocs = a[["alloc_seq", *cols]].rename(columns={"alloc_seq": "seq"}).assign(is_alloc=True)
    f = a[a["free_seq"] != NEVER_FREED]
    frees = f[["free_seq", *cols]].rename(columns={"free_seq": "seq"}).assign(is_alloc=False)
    ref = pd.concat([allocs, frees], ignore_index=True).sort_values("seq", kind="stable").reset_index(drop=True)
    ref = ref[["seq", "alloc_id", "size_bytes", "is_alloc", "stream"]].astype({"is_alloc": bool})
    pd.testing.assert_frame_equal(trace.events(), ref)


@settings(max_examples=150, deadline=None)
@given(tables(), st.integers(-1, 80))
def test_live_by_category_equals_the_groupby(trace: Trace, seq: int) -> None:
    a = trace.allocations
    alive = (a["alloc_seq"] <= seq) & ((a["free_seq"] > seq) | (a["free_seq"] == NEVER_FREED))
    sums = a.loc[alive].groupby("category")["size_bytes"].sum()
    ref = {str(k): int(v) for k, v in sums.items() if v > 0}
    got = live_by_category(trace, seq)
    assert got == ref
    assert list(got) == list(ref)  # the same (sorted) order


def test_validate_names_the_allocation_freed_before_it_is_made() -> None:
    trace = Trace(
        allocations=pd.DataFrame(
            {
                "alloc_id": [7, 9],
                "size_bytes": [1, 2],
                "alloc_seq": [0, 5],
                "free_seq": [3, 4],
                "category": ["input", "input"],
                "phase": ["data", "data"],
                "iteration": [0, 0],
                "op": ["x", "x"],
                "stream": [0, 0],
            }
        )
    )
    with pytest.raises(InputError, match=r"allocation 9 is freed \(seq 4\) before it is made"):
        trace.validate()


@pytest.mark.parametrize(
    ("orders", "bad"),
    [(["", None, np.nan, "tiled"], None), (["strided", "zigzag"], "zigzag"), ([None, 3], "3")],
)
def test_validate_reads_a_missing_access_order_as_the_default(orders: list[Any], bad: str | None) -> None:
    trace = _one_alloc_trace()
    n = len(orders)
    trace.kernels = pd.DataFrame(
        {"kernel_id": range(n), "seq": range(1, n + 1), "name": ["aten::add"] * n, "phase": ["forward"] * n,
         "iteration": [0] * n, "flops": [1.0] * n, "stream": [0] * n, "order": pd.Series(orders, dtype=object)}
    )  # fmt: skip
    if bad is None:
        trace.validate()
    else:
        with pytest.raises(InputError, match=f"unknown access orders.*{bad}"):
            trace.validate()


def test_validate_refuses_an_unknown_category() -> None:
    trace = _one_alloc_trace()
    trace.allocations.loc[0, "category"] = "scratch"
    with pytest.raises(InputError, match=r"unknown categories \['scratch'\]"):
        trace.validate()


def test_inserted_workspaces_keep_the_captured_dtypes() -> None:
    trace = _one_alloc_trace()
    trace.allocations = trace.allocations.astype({"iteration": "int32", "stream": "int32"})
    trace.kernels = pd.DataFrame(
        {"kernel_id": [0], "seq": [1], "name": ["aten::addmm"], "phase": ["forward"], "iteration": [0], "flops": [1.0],
         "stream": [0]}
    )  # fmt: skip
    trace.allocations.loc[0, "free_seq"] = 2
    out = to_cuda(trace, get_gpu("A100-40GB"), OrchestrationRules())
    assert len(out.allocations) == 3  # the cuBLAS and cuBLASLt workspaces before the addmm
    assert out.allocations.dtypes.to_dict() == trace.allocations.dtypes.to_dict()
    assert out.allocations["op"].tolist()[1:] == ["cublas_workspace", "cublaslt_workspace"]


def _one_alloc_trace() -> Trace:
    return Trace(
        allocations=pd.DataFrame(
            {
                "alloc_id": [0],
                "size_bytes": [8],
                "alloc_seq": [0],
                "free_seq": [NEVER_FREED],
                "category": ["input"],
                "phase": ["data"],
                "iteration": [0],
                "op": ["aten::empty"],
                "stream": [0],
            }
        )
    )


def test_a_column_beyond_the_schema_survives_inserted_workspaces() -> None:
    trace = _one_alloc_trace()
    trace.allocations["note"] = [5]  # a trace's own integer column: the inserted rows cannot give it
    trace.kernels = pd.DataFrame(
        {"kernel_id": [0], "seq": [1], "name": ["aten::addmm"], "phase": ["forward"], "iteration": [0], "flops": [1.0],
         "stream": [0]}
    )  # fmt: skip
    out = to_cuda(trace, get_gpu("A100-40GB"), OrchestrationRules())
    assert out.allocations["note"].iloc[0] == 5
    assert out.allocations["note"].iloc[1:].isna().all()  # missing for the two workspaces, not a crash
