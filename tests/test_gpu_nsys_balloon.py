"""Defect 3: the balloon is a real cudaMalloc inside the profiled process, so an nsys export of a GPU run lists it
among the device allocations; live bytes, per-kernel reserved bytes and result.json's peak must not count it.

The export is synthetic: a real one (gemmspmm A100, nsys 2024.2.3, from ../shared/real-data) copied to a temporary
folder, with a 40 GiB balloon allocation inserted before everything and its free after everything, as the shim
makes them (device memory, the same process)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.read import open_export
from uvmlab.measure.nsys.stats import summarize

GEMM = "gemmspmm_a100_cuda_memory_usage_nsys2024.2.3.sqlite"
BALLOON_ADDR, BALLOON_BYTES = 0x7F0000000000, 40 << 30
JOB_PEAK = 37_752_520_704  # tests/test_nsys_real.py: the export's own peak of live device bytes


def with_balloon(real_data: Path, dest: Path) -> Path:
    src = real_data / "nsys" / GEMM
    if not src.is_file():
        pytest.skip(f"{src} not found (real data)")
    out = dest / "profile.sqlite"
    shutil.copyfile(src, out)
    con = sqlite3.connect(out)
    (pid, dev, ctx, first, last) = con.execute(
        f"SELECT globalPid, deviceId, contextId, MIN(start), MAX(start) FROM {S.MEMORY_USAGE} WHERE start > 0"
    ).fetchone()
    row = "(start, globalPid, deviceId, contextId, address, pc, bytes, memKind, memoryOperationType)"
    for t, op in ((first - 1000, S.MEM_OPER_ALLOC), (last + 1000, S.MEM_OPER_FREE)):
        con.execute(
            f"INSERT INTO {S.MEMORY_USAGE} {row} VALUES (?, ?, ?, ?, ?, 0, ?, 2, ?)",
            (t, pid, dev, ctx, BALLOON_ADDR, BALLOON_BYTES, op),
        )
    con.commit()
    con.close()
    return out


def test_the_balloon_is_not_the_jobs_memory(real_data: Path, tmp_path: Path) -> None:
    path = with_balloon(real_data, tmp_path)
    with open_export(path) as ex:  # what the GPU path read before: the balloon counted
        assert summarize(ex).memory["peak_live_bytes_by_kind"]["device"] == JOB_PEAK + BALLOON_BYTES
    with open_export(path, exclude_allocations=[(BALLOON_ADDR, BALLOON_BYTES)]) as ex:
        s = summarize(ex)
        assert ex.excluded_memory_rows == 2
        assert s.memory["peak_live_bytes_by_kind"]["device"] == JOB_PEAK
        assert int(ex.memory_usage()["live_bytes"].max()) < BALLOON_BYTES
        assert (s.kernels["reserved_bytes"] < BALLOON_BYTES).all()


def test_an_unrelated_address_excludes_nothing(real_data: Path, tmp_path: Path) -> None:
    path = with_balloon(real_data, tmp_path)
    with open_export(path, exclude_allocations=[(BALLOON_ADDR + 4096, BALLOON_BYTES)]) as ex:
        assert ex.excluded_memory_rows == 0
        assert summarize(ex).memory["peak_live_bytes_by_kind"]["device"] == JOB_PEAK + BALLOON_BYTES


def test_collect_excludes_the_balloon_the_shim_logged(real_data: Path, tmp_path: Path) -> None:
    """End to end through uvmlab.measure.gpu.collect: run.alloc.bin names the balloon, profile.sqlite holds it."""
    from dataclasses import replace

    from test_gpu_worker import _cfg, _fake_gpu_outputs, _shim_log

    from uvmlab.files.rundir import RunDir
    from uvmlab.measure.gpu import collect
    from uvmlab.measure.gpu.detect import GpuStatus
    from uvmlab.measure.gpu.runner import GpuRunOptions, plan_run

    cfg = replace(_cfg(), pca=True)  # peaks from the worker; the memory and kernel tables from the export
    status = GpuStatus(True, "", "Fake GPU", 80 * (1 << 30), "1", "13.0", 0, 1)
    opts = GpuRunOptions(footprint=16 << 30, host_memory_bytes=512 << 30, nsys=True)
    plan = plan_run(cfg, opts, tmp_path, status=status)
    rd = RunDir(tmp_path)
    log = _shim_log([(4, BALLOON_ADDR, BALLOON_BYTES, 79 << 30, 0, 10), (5, BALLOON_ADDR, BALLOON_BYTES, -1, 0, 99)])
    _fake_gpu_outputs(rd, [30.0, 20.0, 22.0], None, log)
    with_balloon(real_data, rd.logs)
    collect.collect_run(cfg, opts, plan, rd, status)
    mem = rd.read_table("memory")
    assert len(mem) == 25 and mem["reserved_bytes"].max() < BALLOON_BYTES  # with the balloon: >= 40 GiB
    kernels = rd.read_table("kernels")
    assert len(kernels) and (kernels["reserved_bytes"] < BALLOON_BYTES).all()
    # the regime from the export's UM migrations: the gemmspmm export has none of cause eviction
    assert rd.read_result()["regime"]["verdict"] == "fits"
