"""The uvm-eval Titan V logs (real-data/uvm, prefetch off) reproduced by simulating the same access pattern.

abc.cu: three managed 2 MiB arrays a, b, c; the CPU initialises the first 32 pages of each; one warp of 32 threads
does c[p] = a[p] + b[p], one page per thread. The log shows 96 faults in 3 batches: 56 reads (2 VA blocks),
8 reads (1 block), 32 writes (1 block); then cudaFree destroys the ranges.

What the simulator reproduces and what it cannot (docs/uvm-sim.md): total faults, the read/write split, the VA
blocks, reads serviced before the dependent writes, and range destruction without DtoH. The split of the 64 reads
into 56 + 8 is arrival timing (8 entries were not yet in the buffer when the driver fetched the batch); the model
has no arrival times (its warp faults a's pages, b's, then c's: one batch per step): merging consecutive same-type
batches gives the same batches on both sides.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.validate.titanv_checks import cublas_unique_pages, merge_same_kind, parse_abc, simulate_abc


@pytest.mark.real_data
def test_abc_logs_reproduced(real_data: Path) -> None:
    """workloads/files/abc.py through the path of ``uvmlab run`` (titanv_checks.simulate_abc) against the logs."""
    logs = sorted((real_data / "uvm" / "uvm-eval_titanv_460.27.04").glob("abc_short_log_32_ts_abc_*.kmsg"))
    assert len(logs) == 4
    sim, sim_batches = simulate_abc(costs=CostParams())  # the defaults: their fault-path constants come from these logs
    for log in logs:
        real = parse_abc(log)
        assert real["batches"] == [("read", 56, 2), ("read", 8, 1), ("write", 32, 1)], log.name
        # totals and the read/write split match exactly
        assert sim["fault_count"] == sum(n for _, n, _ in real["batches"]) == 96
        assert sim["read_fault_count"] == 64 and sim["write_fault_count"] == 32
        # same batches once the log's arrival split is merged; reads before the dependent writes
        assert merge_same_kind(real["batches"]) == merge_same_kind(sim_batches) == [("read", 64), ("write", 32)]
        # the reads touch two VA blocks, the writes one (the warp's steps: a's pages, b's pages, then c's)
        assert [b for _, _, b in sim_batches] == [1, 1, 1] and [k for k, _, _ in sim_batches] == [
            "read",
            "read",
            "write",
        ]
        # prefetch off: each faulted 4 KiB page migrates alone (CPU-initialised pages: HtoD, not zero-fill)
        assert sim["htod_bytes"] == 96 * PAGE_BYTES and sim["zero_fill_bytes"] == 0
        # wall time of the fault handling: same order as the log (the cost defaults come from these logs,
        # so this is a consistency check, not a validation)
        assert 0.3 < (sim["stall_ns"] / 1e3) / real["wall_us"] < 3.0
    # cudaFree destroys the 2 MiB ranges without copying anything back
    real = parse_abc(logs[0])
    assert sum(1 for _, size in real["destroyed"] if size == VA_BLOCK_BYTES) == 4
    assert sim["dtoh_bytes"] == 0


@pytest.mark.real_data
def test_cublas_log_duplicate_ratio_is_the_default_batch_concurrency(real_data: Path) -> None:
    """The default batch_unique_pages (43) is 256 minus the mean duplicates of the cuBLAS log."""
    path = real_data / "uvm" / "uvm-eval_titanv_460.27.04" / "cublas_wq256-3.dmesg"
    assert sum("BC:" in line for line in path.read_text().splitlines()) == 43
    assert round(cublas_unique_pages(path)) == UvmKnobs().batch_unique_pages
