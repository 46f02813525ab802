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


def test_a_fresh_capture_reads_back_with_the_same_frames(tmp_path) -> None:
    from pathlib import Path

    from uvmlab.config import WorkloadConfig
    from uvmlab.trace.capture import capture_trace

    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py"
    fresh = capture_trace(WorkloadConfig(str(example), batch_size=4, optimizer="adam", iterations=2))
    write_trace(fresh, tmp_path / "t")
    back = read_trace(tmp_path / "t")
    for name in ("allocations", "kernels", "accesses"):  # dtypes included (warp_size is int32 both ways)
        pd.testing.assert_frame_equal(getattr(back, name), getattr(fresh, name), check_exact=True)


def test_optional_kernel_columns_take_their_schema_dtypes() -> None:
    from uvmlab.trace.schema import with_optional_columns

    given = pd.DataFrame({"kernel_id": [0, 1], "warp_size": [32.0, None], "order": ["tiled", None]})
    out = with_optional_columns(given)
    assert out["warp_size"].tolist() == [32, 0] and out["warp_size"].dtype == "int32"
    assert out["order"].tolist() == ["tiled", ""]
    assert out["threads"].dtype == "int64" and out["touched_bytes"].isna().all()
    assert out["api"].tolist() == ["", ""]


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


@pytest.mark.parametrize(
    ("table", "column", "values", "message"),
    [
        ("allocations", "size_bytes", [100, None, 50], "missing values in column size_bytes"),
        ("allocations", "category", ["parameter", None, "temporary"], "missing values in column category"),
        ("kernels", "flops", [float("nan")], "missing values in column flops"),
        ("allocations", "alloc_id", [0, 2, 2], "repeats alloc_id 2"),
        ("allocations", "size_bytes", [100, 200, 50], None),
    ],
)
def test_a_read_refuses_missing_values_and_repeated_ids(tmp_path, table, column, values, message) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = _tiny_trace()
    t.kernels = pd.DataFrame(
        {"kernel_id": [0], "seq": [5], "name": ["aten::mm"], "phase": ["forward"], "iteration": [0], "flops": [2.0],
         "stream": [0]}
    )  # fmt: skip
    write_trace(t, tmp_path / "t")
    path = tmp_path / "t" / f"{table}.parquet"
    stored = pq.read_table(path)
    i = stored.schema.get_field_index(column)
    field = stored.schema.field(i).with_nullable(True)
    column_values = pa.array(values, type=field.type, from_pandas=False)
    pq.write_table(stored.set_column(i, field, column_values), path)  # the write id stays in the schema metadata
    if message is None:
        assert read_trace(tmp_path / "t").allocations["size_bytes"].tolist() == values
    else:
        with pytest.raises(InputError, match=message):
            read_trace(tmp_path / "t")
