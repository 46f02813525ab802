"""Scorecard check ``nsys-records``: the simulator's nsys-style UM migration record count against real exports.

The counting rule (``UvmCounters.htod_records``: one record per run of adjacent pages with one cause per block
copy, as ``block_copy_resident_pages_between`` in uvm_va_block.c notifies them, open-gpu-kernel-modules 595.45.04)
was read off ``csc746_a100_um_migrations`` (fit set); it is validated on ``easycuda_rtx4060_um_migrations`` (another
GPU and nsys version). Both exports are one kernel sweeping CPU-initialised managed arrays once in address order
(real-data/nsys README), which the simulator replays as a one-fault-per-batch sweep of as many 2 MiB blocks as the
export moved. Band 1.0: the count must match exactly.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.files import foreign_sqlite
from uvmlab.measure.nsys import schema as S
from uvmlab.validate.points import Point, check

DATASET = "nsys"
SWEEP_EXPORTS = {
    "csc746_a100_um_migrations_nsys2022.2.1.sqlite": True,  # fitted: the rule was read from it
    "easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite": False,  # validation
}
"""Exports of a single sequential sweep of CPU-initialised managed memory: file name -> used for fitting."""


def export_htod(path: Path) -> tuple[int, int]:
    """(record count, bytes) of the export's UM HtoD migrations, by plain SQL on the file opened read-only."""
    conn = foreign_sqlite.connect(path, "an nsys SQLite export")
    try:
        foreign_sqlite.refuse_views(conn, path)
        n, b = conn.execute(
            f"SELECT count(*), sum(bytes) FROM {S.MEMCPY} WHERE copyKind = {S.COPY_KIND_UVM_HTOD}"
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise InputError(foreign_sqlite.sqlite_failure(exc, path, conn)) from None
    finally:
        conn.close()
    return int(n), int(b or 0)


def sweep_records(n_blocks: int) -> tuple[int, int]:
    """(htod_records, htod_bytes) of a one-fault-per-batch sweep of ``n_blocks`` CPU-resident 2 MiB blocks."""
    from uvmlab.gpus import GPUS
    from uvmlab.sim.uvm.driver import UvmSim
    from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES, UvmKnobs
    from uvmlab.sim.uvm.timing import CostParams

    size = n_blocks * VA_BLOCK_BYTES
    sim = UvmSim(size + VA_BLOCK_BYTES, UvmKnobs(batch_unique_pages=1), CostParams(), GPUS["A100-80GB"])
    sim.map_range(0, size)
    sim.host_write(0, 0, size)
    c = sim.access([(0, 0, size, False)])
    return int(c.htod_records), int(c.htod_bytes)


@check("nsys-records", needs="nsys", fast=True)
def check_nsys_records(data_dir: Path) -> list[Point]:
    """HtoD record counts of the sequential-sweep exports: measured vs the simulator's count."""
    from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES

    points = []
    for name, fitted in SWEEP_EXPORTS.items():
        path = data_dir / "nsys" / name
        if not path.exists():
            continue
        n, nbytes = export_htod(path)
        blocks = nbytes // VA_BLOCK_BYTES
        pred_n, pred_b = sweep_records(blocks)
        note = f"sequential sweep of {blocks} blocks; " + ("rule read from this export" if fitted else "validation")
        points.append(
            Point(DATASET, path.stem, "UM HtoD records", "count", n, pred_n, fitted, note, None if fitted else 1.0)
        )
        points.append(
            Point(DATASET, path.stem, "UM HtoD bytes", "bytes", nbytes, pred_b, fitted, note, None if fitted else 1.0)
        )
    return points
