"""A synthetic nsys export of GPU fault migrations over two CPU-initialised arrays (no torch): the kernel touches
``x`` then ``y`` at 64 KiB, 64 KiB, 128 KiB ... 1 MiB steps of each 2 MiB block, and each touch is one fault group
(a 4 KiB HtoD record of cause "fault", then the prefetched rest), as in the csc746 and easycuda exports."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from uvmlab.measure.nsys.synthetic import GLOBAL_PID, write_synthetic_export
from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES

STEPS_KIB = (64, 64, 128, 256, 512, 1024)


def write_fault_group_export(
    path: Path, gap_us: Callable[[int, int, int], float], blocks: int, threads: int, driver: str | None = None
) -> None:
    """Write the export: ``gap_us(array, offset KiB, group KiB)`` is the time from the previous group's last copy to
    this group's first; the kernel runs ``threads`` threads; ``driver`` goes to ``NvDriverVersion`` when given."""
    write_synthetic_export(path, faults=0, migrations=0, iterations=1, kernels_per_iteration=1)
    rows, t = [], 10**9
    for blk in range(blocks):
        off = 0
        for kib in STEPS_KIB:
            for arr in (0, 1):
                addr = (1 << 40) + arr * (1 << 32) + blk * VA_BLOCK_BYTES + off * 1024
                t += round(gap_us(arr, off, kib) * 1e3)
                rows += [
                    (t, t + 2_000, 4096, 2, addr),
                    (t + 2_000, t + 2_000 + kib * 40, (kib - 4) * 1024, 3, addr + 4096),
                ]
                t += 2_000 + kib * 40
            off += kib
    con = sqlite3.connect(path)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, globalPid,"
        f" bytes, copyKind, srcKind, dstKind, migrationCause, virtualAddress) VALUES (?, ?, 0, 1, 0, 0, {GLOBAL_PID},"
        " ?, 11, 7, 7, ?, ?)",
        rows,
    )
    con.execute(
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = {threads}, gridY = 1, gridZ = 1, "
        "blockX = 1, blockY = 1, blockZ = 1"
    )
    if driver is not None:
        con.execute(
            "CREATE TABLE IF NOT EXISTS TARGET_INFO_SYSTEM_ENV "
            "(globalVid INTEGER, devStateName TEXT, name TEXT, nameEnum INTEGER, value TEXT)"
        )
        con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'Local', 'NvDriverVersion', 205, ?)", (driver,))
    con.commit()
    con.close()
