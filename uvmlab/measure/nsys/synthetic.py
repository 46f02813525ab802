"""Synthetic nsys exports in the real schema (column names and types of nsys 2023.4.4 / schema 3.7.2, CMB in
reference/nsys.md §1) for tests and benchmarks. Deterministic for a given seed; no real data is copied.

The layout of a synthetic run: ``iterations`` NVTX ranges "iteration N" on the main thread, each with phase ranges
("forward", "backward", "optimizer"), ``kernels_per_iteration`` kernels launched by ``cudaLaunchKernel`` calls
inside the ranges, GPU faults spread over time (inside kernels and between them) and UM migrations.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np

from uvmlab.measure.nsys import schema as S

PID = 4242
GLOBAL_PID = (PID << 24) | (1 << 48)
MAIN_TID = GLOBAL_PID | PID

DDL = {
    S.STRING_IDS: "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    S.META_EXPORT: "name TEXT NOT NULL, value TEXT",
    S.META_CAPTURE: "name TEXT NOT NULL, value TEXT",
    S.GPU_FAULTS: (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "address INTEGER NOT NULL, numberOfPageFaults INTEGER NOT NULL, faultAccessType INTEGER NOT NULL"
    ),
    S.MEMCPY: (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
        "dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, "
        "migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"
    ),
    S.KERNEL: (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
        "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
        "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
        "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER "
        "NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, "
        "graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER"
    ),
    S.RUNTIME: (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
        "correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"
    ),
    S.NVTX: (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, "
        "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, "
        "uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
        "floatValue REAL, jsonTextId INTEGER, jsonText TEXT"
    ),
}

PHASES = ("forward", "backward", "optimizer")


def write_synthetic_export(
    path: str | os.PathLike[str],
    *,
    iterations: int = 3,
    kernels_per_iteration: int = 30,
    faults: int = 2000,
    migrations: int = 500,
    seed: int = 0,
    chunk_rows: int = 1_000_000,
) -> dict[str, int]:
    """Write a synthetic export; return the ground truth totals it contains (for tests)."""
    path = Path(path)
    if path.exists():
        path.unlink()
    rng = np.random.default_rng(seed)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    for table, cols in DDL.items():
        conn.execute(f'CREATE TABLE "{table}" ({cols})')
    conn.executemany(
        f"INSERT INTO {S.META_EXPORT} VALUES (?, ?)",
        [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", "2023.4.4.54"),
            ("EXPORT_SCHEMA_VERSION", "3.7.2"),
        ],
    )
    conn.executemany(
        f"INSERT INTO {S.META_CAPTURE} VALUES (?, ?)",
        [
            ("PROCESS_0:COLLECT_UVM_GPU_PAGE_FAULTS", "true"),
            ("PROCESS_0:COLLECT_UVM_CPU_PAGE_FAULTS", "true"),
            ("PROCESS_0:COLLECT_GPU_MEMORY_USAGE", "false"),
            ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
        ],
    )
    strings = {1: "cudaLaunchKernel_v7000", 2: "cudaMemcpy_v3020", 3: "cudaMalloc_v3020"}
    kernel_names = [f"kernel_{j % 7}" for j in range(kernels_per_iteration)]
    for j, name in enumerate(sorted(set(kernel_names))):
        strings[100 + j] = name
    name_id = {v: k for k, v in strings.items()}
    conn.executemany(f"INSERT INTO {S.STRING_IDS} VALUES (?, ?)", sorted(strings.items()))

    # timeline: iteration i occupies [t0, t0 + iter_ns) on the CPU; kernels run on the GPU 50 µs after launch
    iter_ns = 10_000_000
    k_ns = iter_ns // (kernels_per_iteration + 1)
    nvtx, runtime, kernels = [], [], []
    corr = 0
    for i in range(iterations):
        t0 = 1_000_000 + i * iter_ns
        nvtx.append((t0, t0 + iter_ns - 1000, S.NVTX_PUSHPOP_RANGE, f"iteration {i}", MAIN_TID))
        bounds = np.linspace(t0, t0 + iter_ns - 2000, len(PHASES) + 1).astype(np.int64)
        for p, phase in enumerate(PHASES):
            nvtx.append((int(bounds[p]), int(bounds[p + 1]), S.NVTX_PUSHPOP_RANGE, phase, MAIN_TID))
        for j in range(kernels_per_iteration):
            corr += 1
            launch = t0 + j * k_ns + 100
            runtime.append((launch, launch + 2000, 0, MAIN_TID, corr, name_id["cudaLaunchKernel_v7000"], 0, None))
            ks = launch + 50_000
            kernels.append((ks, ks + k_ns // 2, 0, 1, None, 7, corr, GLOBAL_PID, name_id[kernel_names[j]]))
    conn.executemany(f"INSERT INTO {S.NVTX} (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)", nvtx)
    conn.executemany(f"INSERT INTO {S.RUNTIME} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", runtime)
    conn.executemany(
        f"INSERT INTO {S.KERNEL} (start, end, deviceId, contextId, greenContextId, streamId, correlationId, "
        "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
        "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 0)",
        [(*k[:9], k[8]) for k in kernels],
    )
    t_end = 1_000_000 + iterations * iter_ns
    truth = {"faults": 0, "fault_records": 0, "read_faults": 0, "write_faults": 0}
    done = 0
    while done < faults:
        n = min(chunk_rows, faults - done)
        start = np.sort(rng.integers(1_000_000, t_end, n))
        dur = rng.integers(1_000, 20_000, n)
        count = rng.integers(1, 4, n)
        access = rng.choice([1, 2, 3], n, p=[0.6, 0.35, 0.05])
        addr = (rng.integers(0, 1 << 20, n) << 16) + (1 << 40)
        rows = zip(
            start.tolist(),
            (start + dur).tolist(),
            [GLOBAL_PID] * n,
            [0] * n,
            addr.tolist(),
            count.tolist(),
            access.tolist(),
            strict=True,
        )
        conn.executemany(f"INSERT INTO {S.GPU_FAULTS} VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        truth["faults"] += int(count.sum())
        truth["fault_records"] += n
        truth["read_faults"] += int(count[access == 1].sum())
        truth["write_faults"] += int(count[access == 2].sum())
        done += n
    truth.update(htod_bytes=0, dtoh_bytes=0, htod_count=0, dtoh_count=0)
    done = 0
    while done < migrations:
        n = min(chunk_rows, migrations - done)
        start = np.sort(rng.integers(1_000_000, t_end, n))
        size = rng.choice([4096, 65536, 1 << 20], n)
        kind = rng.choice([11, 12], n, p=[0.7, 0.3])
        cause = rng.choice([2, 3, 4, 1], n, p=[0.5, 0.3, 0.15, 0.05])
        addr = (rng.integers(0, 1 << 20, n) << 16) + (1 << 40)
        rows = zip(
            start.tolist(),
            (start + size // 10).tolist(),
            size.tolist(),
            kind.tolist(),
            cause.tolist(),
            addr.tolist(),
            strict=True,
        )
        conn.executemany(
            f"INSERT INTO {S.MEMCPY} (start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, "
            f"copyKind, srcKind, dstKind, migrationCause, virtualAddress) "
            f"VALUES (?, ?, 0, 1, 0, 0, {GLOBAL_PID}, ?, ?, 7, 7, ?, ?)",
            rows,
        )
        truth["htod_bytes"] += int(size[kind == 11].sum())
        truth["dtoh_bytes"] += int(size[kind == 12].sum())
        truth["htod_count"] += int((kind == 11).sum())
        truth["dtoh_count"] += int((kind == 12).sum())
        done += n
    conn.commit()
    conn.close()
    truth["kernels"] = len(kernels)
    truth["iterations"] = iterations
    return truth
