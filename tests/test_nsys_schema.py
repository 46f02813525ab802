"""Version detection and the collected / zero / not_collected / unknown rules."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest

from uvmlab.measure.nsys import schema as S


def flags(**kv: bool) -> S.CaptureFlags:
    return S.CaptureFlags(present=True, values={f"PROCESS_0:{k}": v for k, v in kv.items()})


@pytest.mark.parametrize(
    ("rows", "fl", "gpu_work", "want"),
    [
        (5, S.CaptureFlags(present=False), False, "collected"),
        (None, flags(COLLECT_UVM_GPU_PAGE_FAULTS=False), True, "not_collected"),
        (None, flags(COLLECT_UVM_GPU_PAGE_FAULTS=True), True, "zero"),
        (None, flags(COLLECT_UVM_GPU_PAGE_FAULTS=True), False, "unknown"),
        (None, S.CaptureFlags(present=False), True, "unknown"),
        (0, S.CaptureFlags(present=False), True, "zero"),  # the table exists (non-lazy export) and is empty
        (None, flags(COLLECT_NVTX_TRACE=True), True, "unknown"),  # the GPU-fault key is absent
    ],
)
def test_gpu_fault_status(rows, fl, gpu_work, want) -> None:
    assert S.collection_status(S.GPU_FAULTS, rows, fl, gpu_work)[0] == want


def test_migration_status_needs_no_flag() -> None:
    none = S.CaptureFlags(present=False)
    assert S.collection_status(S.MEMCPY, None, none, True)[0] == "zero"
    assert S.collection_status(S.MEMCPY, None, none, False)[0] == "unknown"
    assert S.collection_status(S.MEMCPY, 3, none, True)[0] == "collected"


def test_unprefixed_and_prefixed_flags() -> None:
    f = S.CaptureFlags(
        present=True, values={"COLLECT_UVM_GPU_PAGE_FAULTS": False, "PROCESS_0:COLLECT_UVM_GPU_PAGE_FAULTS": True}
    )
    assert f.flag("COLLECT_UVM_GPU_PAGE_FAULTS") is True  # any process on
    assert f.flag("COLLECT_GPU_MEMORY_USAGE") is None


def test_version_sources(tmp_path) -> None:
    legacy = sqlite3.connect(tmp_path / "a.sqlite")
    legacy.execute("CREATE TABLE EXPORT_META_DATA (name TEXT, value TEXT)")
    legacy.executemany(
        "INSERT INTO EXPORT_META_DATA VALUES (?, ?)",
        [("EXPORT_PRODUCT_VERSION", "2022.2.1.31"), ("EXPORT_SCHEMA_VERSION", "2.9.1")],
    )
    v = S.detect_version(legacy, {"EXPORT_META_DATA"})
    assert (v.nsys_version, v.schema_version, v.source) == ("2022.2.1.31", "2.9.1", "EXPORT_META_DATA")
    old = sqlite3.connect(tmp_path / "b.sqlite")
    old.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    old.execute("INSERT INTO StringIds VALUES (1, '/opt/nvidia/nsight-systems/2021.2.1/target-linux-x64/libcupti.so')")
    v = S.detect_version(old, {"StringIds"})
    assert (v.nsys_version, v.schema_version, v.source) == ("2021.2.1", None, "StringIds path")
    assert S.detect_version(old, set()).source == "unknown"


def test_pid_decoding() -> None:
    from uvmlab.measure.nsys.read import _pid  # what every table reader uses

    pids = _pid(pd.Series([339211836194816, None]))
    assert pids.iloc[0] == 3441385  # CMB, reference/nsys.md §1.9
    assert pids.isna().iloc[1]
