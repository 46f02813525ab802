"""The Trace tables: round trip through Parquet, validation of event order, clear refusals."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from uvmlab.errors import InputError
from uvmlab.trace.schema import KERNEL_OPTIONAL, NEVER_FREED, Trace, empty_table, read_trace, write_trace


def _tiny_trace() -> Trace:
    alloc = pd.DataFrame(
        {
            "alloc_id": [0, 1, 2],
            "size_bytes": [100, 200, 50],
            "alloc_seq": [0, 1, 3],
            "free_seq": [NEVER_FREED, 2, 4],
            "category": ["parameter", "activation", "temporary"],
            "phase": ["setup", "forward", "backward"],
            "iteration": [-1, 0, 0],
            "op": ["aten.empty", "aten.mm", "aten.add"],
            "stream": [0, 0, 0],
        }
    )
    return Trace(allocations=alloc, header={"workload": "tiny"})


def test_round_trip(tmp_path) -> None:
    t = _tiny_trace()
    write_trace(t, tmp_path / "t")
    back = read_trace(tmp_path / "t")
    pd.testing.assert_frame_equal(back.allocations, t.allocations, check_dtype=False)
    assert back.header["workload"] == "tiny"
    # every read has the optional kernel columns too (filled with their defaults: an older trace reads the same)
    assert list(back.kernels.columns) == list(empty_table("kernels").columns) + list(KERNEL_OPTIONAL)


def test_live_bytes_follow_events() -> None:
    live = _tiny_trace().live_bytes()
    assert live.tolist() == [100, 300, 100, 150, 100]
    assert live.index.tolist() == [0, 1, 2, 3, 4]


def test_free_before_alloc_is_refused() -> None:
    t = _tiny_trace()
    t.allocations.loc[1, "free_seq"] = 0
    with pytest.raises(InputError, match="freed"):
        t.validate()


def test_reader_refuses_other_folders_and_versions(tmp_path) -> None:
    with pytest.raises(InputError, match="not a uvmlab trace"):
        read_trace(tmp_path)
    write_trace(_tiny_trace(), tmp_path / "t")
    head = tmp_path / "t" / "trace.json"
    head.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(InputError, match="schema version 99"):
        read_trace(tmp_path / "t")
    head.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_trace(tmp_path / "t")
