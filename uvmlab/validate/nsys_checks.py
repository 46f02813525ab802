"""Scorecard checks on the real Nsight Systems exports (real-data/nsys).

``nsys-parser``: every export through uvmlab's parser (:func:`uvmlab.measure.nsys.stats.summarize`) against independent
SQL on the raw tables (GPU fault records and page faults, CPU faults, UM migrations per direction: count and
bytes). The parser must agree exactly (band 1.0). The JSON export's GPU faults are counted from its raw lines.

``nsys-link``: the link-bandwidth fit of ``uvmlab calibrate`` (:func:`uvmlab.measure.calibrate.fit_link_bandwidth`), per
export with UM migrations. Protocol: the bandwidth is fitted on the host-to-device migrations (copyKind 11) only
(those points are marked fitted) and validated on the device-to-host migrations (copyKind 12) of the same export:
their total transfer time and their median achieved bandwidth per transfer size, predicted by the simulator's
transfer model (:func:`uvmlab.sim.uvm.timing.transfer_time_ns`, UVMSmart's atan curve). Exports without DtoH
migrations give only fitted points. Known miss (no band promised): 4 KiB transfers, whose achieved bandwidth the
atan curve over-predicts about 2x on the A100 export (csc746) and under-predicts on the RTX 4060 one.

``nsys-cpu-faults``: the host cost of one CPU page fault besides its transfers
(:func:`uvmlab.measure.calibrate.fit_cpu_fault_ns`: the fixed part of the gaps between the CPU faults that read
managed data back), per export with such faults, against the ``cpu_fault_ns`` uvmlab uses for it: the profile
fitted on that export (a fitted point: csc746 defines the A100 profile's), else the profile a run on the export's
GPU takes (``uvmlab.sim.uvm.profile.pick_profile``; the RTX 4060 laptop export validates the open-driver default).

``nsys-serial-refaults``: an export whose kernels run one thread (csc746's ``add<<<1, 1>>>``) times the GPU fault
path before each copy (:func:`uvmlab.measure.calibrate.fit_serial_refaults`), against the simulator replaying the
same faults on one CPU-initialised block under the export's driver (:func:`simulated_serial_faults`): the median per
size (16-256 pages) is a fitted point (their slope is the A100 profile's ``cpu_unmap_chunk_ns``: driver 525, a CPU
chunk per page), and so is a block's first fault (its excess over the line is ``cpu_chunk_map_ns`` times the
block's 512 chunks); the fit's base is validated against the simulator's fault without the unmapping (band 1.5).

``nsys-batch-blocks``: an export whose kernels fault several blocks in one batch (easycuda's 256 threads over two
arrays) times the gap between two blocks' copies in a batch (:func:`uvmlab.measure.calibrate.batch_block_gaps`):
the second block's service, its CPU pages' unmapping and, on its first touch, its CPU chunks' mapping. Validated
(band 2.0) against the simulator replaying two blocks faulted in the same batches at the export's sizes under its
driver (:func:`simulated_batch_block_gaps`); on R530+ a block is one CPU chunk, so the gap should not grow with
the pages, as the R550 export shows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.files import foreign_sqlite
from uvmlab.files.inputs import decode_json
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.jsonexport import export_lines
from uvmlab.validate.points import Point, check

if TYPE_CHECKING:
    from uvmlab.sim.uvm.timing import CostParams

DATASET = "nsys"
SMALL_TRANSFER_BYTES = 4096  # at or below: the known 4 KiB miss, tabulated without a band
TOTAL_TIME_BAND = 1.5
SIZE_BAND = 1.5
CPU_FAULT_BAND = 1.5
SERIAL_BAND = 1.5
BATCH_BLOCK_BAND = 2.0
JSON_FAULT_TYPE = "CudaUvmGpuPageFaultEvent"  # the JSON export's GPU fault records (real-data/nsys README)


def _raw(path: Path, sql: str) -> list[tuple]:
    """Run ``sql`` on the raw export, opened read-only (independent of uvmlab.measure.nsys)."""
    conn = foreign_sqlite.connect(path, "an nsys SQLite export")
    try:
        foreign_sqlite.refuse_views(conn, path)
        return conn.execute(sql).fetchall()
    except sqlite3.DatabaseError as exc:
        raise InputError(foreign_sqlite.sqlite_failure(exc, path, conn)) from None
    finally:
        conn.close()


def _tables(path: Path) -> set[str]:
    return {r[0] for r in _raw(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def raw_totals(path: Path) -> dict[str, float]:
    """Fault and migration totals by plain SQL on the raw tables (absent tables give no entry)."""
    tables = _tables(path)
    out: dict[str, float] = {}
    if S.GPU_FAULTS in tables:
        n, faults = _raw(path, f"SELECT count(*), sum(numberOfPageFaults) FROM {S.GPU_FAULTS}")[0]
        out["GPU fault records"] = n
        out["GPU page faults"] = faults or 0
    if S.CPU_FAULTS in tables:
        out["CPU page faults"] = _raw(path, f"SELECT count(*) FROM {S.CPU_FAULTS}")[0][0]
    if S.MEMCPY in tables:
        for kind, label in ((S.COPY_KIND_UVM_HTOD, "HtoD"), (S.COPY_KIND_UVM_DTOH, "DtoH")):
            n, nbytes = _raw(path, f"SELECT count(*), sum(bytes) FROM {S.MEMCPY} WHERE copyKind = {kind}")[0]
            out[f"{label} migrations"] = n
            out[f"{label} migrated bytes"] = nbytes or 0
    return out


def parser_totals(path: Path) -> dict[str, float | None]:
    """The same totals through uvmlab's parser (None where it reports the figure as not collected)."""
    from uvmlab.measure.nsys.read import open_export
    from uvmlab.measure.nsys.stats import summarize

    with open_export(path) as ex:
        s = summarize(ex)
    f, m = s.faults, s.migrations.get("by_direction") or {}
    out = {
        "GPU fault records": f["gpu_fault_records"],
        "GPU page faults": f["gpu_fault_count"],
        "CPU page faults": f["cpu_fault_count"],
    }
    for label, key in (("HtoD", "htod"), ("DtoH", "dtoh")):
        d = m.get(key) or {}
        out[f"{label} migrations"] = d.get("count")
        out[f"{label} migrated bytes"] = d.get("bytes")
    return out


def _unit(quantity: str) -> str:
    return "bytes" if quantity.endswith("bytes") else "count"


def _json_raw_faults(path: Path) -> dict[str, float]:
    """GPU fault records and page faults of a JSON export, counted line by line."""
    records = faults = 0
    for lineno, line in export_lines(path):
        if JSON_FAULT_TYPE not in line:
            continue
        obj = decode_json(line, f"{path} line {lineno}", "an nsys JSON export")
        event = next((v for v in obj.values() if isinstance(v, dict) and "numberOfPageFaults" in v), None)
        if event is None:
            continue
        records += 1
        faults += int(event["numberOfPageFaults"])
    return {"GPU fault records": records, "GPU page faults": faults}


def export_files(folder: Path) -> list[Path]:
    """The SQLite and JSON exports directly in ``folder`` (anything but a folder: a FIFO or device named like an
    export is refused by the reader, never skipped as if absent)."""
    return sorted(p for p in folder.iterdir() if p.suffix in (".sqlite", ".json") and not p.is_dir())


@check("nsys-parser", needs="nsys", fast=True)
def check_nsys_parser(data_dir: Path) -> list[Point]:
    """Parser totals against raw SQL, every export in ``data_dir/nsys``."""
    points: list[Point] = []
    for path in export_files(data_dir / "nsys"):
        raw = _json_raw_faults(path) if path.suffix == ".json" else raw_totals(path)
        parsed = parser_totals(path)
        for quantity, measured in raw.items():
            if not measured:
                continue
            predicted = parsed.get(quantity)
            points.append(
                Point(
                    DATASET,
                    path.stem,
                    f"{quantity} (parser vs raw SQL)",
                    _unit(quantity),
                    float(measured),
                    None if predicted is None else float(predicted),
                    note="" if predicted is not None else "the parser reports it as not collected",
                    band=1.0,
                )
            )
    return points


def _migrations(path: Path, kind: int) -> np.ndarray:
    """(bytes, duration ns) of the UM migrations of ``kind`` with a positive duration."""
    rows = _raw(path, f'SELECT bytes, "end" - start FROM {S.MEMCPY} WHERE copyKind = {kind} AND "end" > start')
    return np.array(rows, dtype=float).reshape(-1, 2)


def link_points(path: Path) -> list[Point]:
    """Fit the link bandwidth on the HtoD migrations of one export; validate it on its DtoH migrations."""
    from uvmlab.measure.calibrate import fit_link_bandwidth
    from uvmlab.measure.nsys.read import open_export
    from uvmlab.sim.uvm.timing import transfer_bandwidth, transfer_time_ns

    if S.MEMCPY not in _tables(path):
        return []
    with open_export(path) as ex:
        link, _ = fit_link_bandwidth(ex, copy_kinds=(S.COPY_KIND_UVM_HTOD,))
    if link is None:
        return []
    fit_note = f"link bandwidth fitted on these HtoD migrations: {link / 1e9:.2f} GB/s at 2 MiB"
    points = []
    for kind, label, fitted in ((S.COPY_KIND_UVM_HTOD, "HtoD", True), (S.COPY_KIND_UVM_DTOH, "DtoH", False)):
        mig = _migrations(path, kind)
        if not len(mig):
            continue
        points.append(
            Point(
                DATASET,
                path.stem,
                f"{label} migration time (total)",
                "s",
                float(mig[:, 1].sum()) / 1e9,
                transfer_time_ns(mig[:, 0], link) / 1e9,
                fitted=fitted,
                note=fit_note,
                band=None if fitted else TOTAL_TIME_BAND,
            )
        )
        for size in np.unique(mig[:, 0]):
            dur = mig[mig[:, 0] == size, 1]
            small = size <= SMALL_TRANSFER_BYTES
            points.append(
                Point(
                    DATASET,
                    path.stem,
                    f"{label} median bandwidth, {int(size) // 1024} KiB transfers",
                    "B/s",
                    float(np.median(size / dur * 1e9)),
                    float(transfer_bandwidth(size, link)),
                    fitted=fitted,
                    note=("known miss: the atan curve is off at 4 KiB; " if small else "") + fit_note,
                    band=None if fitted or small else SIZE_BAND,
                )
            )
    return points


def _fitted_on(path: Path, fit: Callable[[Any], tuple[float | None, dict[str, Any]]]) -> tuple[Any, ...] | None:
    """(value, details, costs, fitted, why, GPU name) of ``fit`` (a ``uvmlab.measure.calibrate`` fit) on an export
    and of the costs uvmlab uses for it (:func:`_profile_for`); None when the fit or the GPU gives nothing."""
    from uvmlab.measure.nsys.read import open_export

    if S.MEMCPY not in _tables(path):
        return None
    with open_export(path) as ex:
        value, info = fit(ex)
    if value is None:
        return None
    costs, fitted, why, gpu = _profile_for(path)
    return None if gpu is None else (value, info, costs, fitted, why, gpu)


def cpu_fault_points(path: Path) -> list[Point]:
    """The CPU-fault cost measured in one export against the one uvmlab uses for it (module docstring)."""
    from uvmlab.measure.calibrate import fit_cpu_fault_ns

    got = _fitted_on(path, fit_cpu_fault_ns)
    if got is None:
        return []
    measured, info, costs, fitted, why, _ = got
    predicted = costs.cpu_fault_ns
    note = (
        f"{info['gaps']} gaps between {info['cpu_faults']} CPU faults: {info['fixed_us']:.1f} us fixed + "
        f"{info['program_us_per_kib']:.2f} us per KiB of the program's own work; predicted: {why}"
    )
    return [
        Point(
            DATASET,
            path.stem,
            "CPU fault cost besides its transfers",
            "s",
            measured / 1e9,
            predicted / 1e9,
            fitted=fitted,
            note=note,
            band=None if fitted else CPU_FAULT_BAND,
        )
    ]


def _profile_for(path: Path) -> tuple[CostParams, bool, str, str | None]:
    """(costs, fitted on this export, why, GPU name) uvmlab uses for an export: the profile fitted on it, else the
    one a run on its GPU takes; the GPU name is None when the export's GPU is not in the catalogue and no profile
    was fitted on it (the callers give no point then)."""
    from uvmlab.gpus import GPUS, known_gpu
    from uvmlab.sim.uvm.profile import pick_profile, profile_docs
    from uvmlab.sim.uvm.timing import CostParams

    rows = _raw(path, "SELECT name FROM TARGET_INFO_GPU") if "TARGET_INFO_GPU" in _tables(path) else []
    gpu = known_gpu(str(rows[0][0])) if rows else None
    own = [d for d in profile_docs().values() if any(path.name in x for x in d.get("fitted_on", []))]
    if own:
        why = f"the {own[0]['gpu']} profile, fitted on this export"
        return CostParams.from_file(own[0]["path"]), True, why, gpu or str(own[0]["gpu"])
    if gpu is None:
        return CostParams(), False, "", None
    return pick_profile(GPUS[gpu])[0], False, f"the costs a run on {gpu} takes", gpu


SERIAL_SWEEP_PAGES = (0, 16, 32, 64, 128, 256)
"""The pages a one-thread kernel faults on in a CPU-initialised 2 MiB block, in order: the tree prefetcher then
migrates 16, 16, 32, 64, 128, 256 pages (64 KiB ... 1 MiB), as the csc746 export's records show."""


def _host_written_sim(costs: CostParams, gpu_name: str, driver: str | None, blocks: int) -> Any:
    """A simulator on ``gpu_name`` under ``driver`` (None: the default) with ``blocks`` managed 2 MiB ranges the
    host has written (ranges 0, 1, ...)."""
    from uvmlab.gpus import GPUS
    from uvmlab.sim.uvm.driver import UvmSim
    from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES, UvmKnobs

    gpu = GPUS[gpu_name] if driver is None else GPUS[gpu_name].with_driver(driver)
    sim = UvmSim(4 * blocks * VA_BLOCK_BYTES, UvmKnobs(), costs, gpu)
    for r in range(blocks):
        sim.map_range(r, VA_BLOCK_BYTES)
        sim.host_write(r, 0, VA_BLOCK_BYTES)
    return sim


def _touch(range_id: int, page: int) -> tuple[int, int, int, bool]:
    """A 4-byte read of ``page`` of range ``range_id``: one fault where the page is not resident."""
    from uvmlab.sim.uvm.knobs import PAGE_BYTES

    return (range_id, page * PAGE_BYTES, 4, False)


def _latency_ns(sim: Any, c: Any, htod_bytes: int) -> float:
    """``c``'s stall minus the transfer of ``htod_bytes`` (one migration)."""
    from uvmlab.sim.uvm.timing import transfer_time_ns

    return float(c.stall_ns) - float(transfer_time_ns(np.array([htod_bytes]), sim.costs.link_bytes_per_s))


def _with_driver(why: str, driver: str | None) -> str:
    return f"{why}, driver {driver or 'not recorded: the default'}"


def simulated_serial_faults(
    costs: CostParams, gpu_name: str, driver: str | None, unmap: bool = True
) -> dict[float, float]:
    """The simulator's latency before the copy (stall minus the transfer, ns) of each fault of a one-thread kernel
    over one CPU-initialised 2 MiB block on ``driver`` (None: the default): {pages migrated: latency}, the block's
    first fault under key -pages; ``unmap`` False: with ``cpu_unmap_chunk_ns`` 0."""
    from dataclasses import replace

    from uvmlab.sim.uvm.knobs import PAGE_BYTES

    sim = _host_written_sim(costs if unmap else replace(costs, cpu_unmap_chunk_ns=0.0), gpu_name, driver, 1)
    out = {}
    for page in SERIAL_SWEEP_PAGES:
        c = sim.access([_touch(0, page)])
        pages = float(c.htod_bytes // PAGE_BYTES)
        out[-pages if page == 0 else pages] = _latency_ns(sim, c, c.htod_bytes)
    return out


def serial_refault_points(path: Path) -> list[Point]:
    """The latency before each back-to-back fault's copy of a one-thread kernel, measured against the simulator's
    replay of the same faults (module docstring)."""
    from uvmlab.measure.calibrate import fit_serial_refaults

    got = _fitted_on(path, fit_serial_refaults)
    if got is None:
        return []
    _, info, costs, fitted, why, gpu = got
    driver = info.get("driver")
    sim = simulated_serial_faults(costs, gpu, driver)
    base_ns = simulated_serial_faults(costs, gpu, driver, unmap=False)[16.0]  # a fault's path without the unmapping
    why = _with_driver(why, driver)
    fit = f"{info['fitted_faults']} back-to-back faults: {info['base_us']:.1f} us + {info['per_page_us']:.3f} us/page"
    points = [
        Point(DATASET, path.stem, f"GPU fault latency before the copy, {int(pages)} pages", "s",
              info["median_us_by_pages"][f"{pages:g}"] / 1e6, sim[pages] / 1e9, fitted=fitted,
              note=f"median; {fit} (cpu_unmap_chunk_ns is this fit's slope); predicted: the simulator with {why}",
              band=None if fitted else SERIAL_BAND)
        for pages in sorted(p for p in sim if p > 0)
        if f"{pages:g}" in info["median_us_by_pages"]
    ]  # fmt: skip
    points.append(
        Point(DATASET, path.stem, "GPU fault latency before the copy, base", "s", info["base_us"] / 1e6,
              base_ns / 1e9, note=f"{fit}; predicted: the simulator's one-fault batch without the unmapping",
              band=SERIAL_BAND)
    )  # fmt: skip
    first = [p for p in sim if p < 0]
    if info["block_first_median_us"] is not None and first:
        points.append(
            Point(DATASET, path.stem, "GPU fault latency before the copy, a block's first fault", "s",
                  info["block_first_median_us"] / 1e6, sim[first[0]] / 1e9, fitted=fitted,
                  note=f"median; cpu_chunk_map_ns is this excess over a later fault, per CPU chunk of the block; "
                  f"predicted: the simulator with {why}", band=None if fitted else SERIAL_BAND)
        )  # fmt: skip
    return points


def simulated_batch_block_gaps(costs: CostParams, gpu_name: str, driver: str | None) -> dict[float, float]:
    """The simulator's cost (ns, besides its transfer) of a second CPU-initialised block serviced in one fault batch
    with a first, the two faulted at the same pages in the order of :data:`SERIAL_SWEEP_PAGES` (as easycuda's
    kernel faults ``x`` and ``y``): {pages the second block migrated: cost}, its first touch under key -pages.
    Each is the two-block batch's stall minus that of the same batch without the second block (a simulator that
    never touches it) and minus the second block's transfer."""
    from uvmlab.sim.uvm.knobs import PAGE_BYTES

    both, alone = (_host_written_sim(costs, gpu_name, driver, 2) for _ in range(2))
    out = {}
    for page in SERIAL_SWEEP_PAGES:
        c_both, c_alone = both.access([_touch(0, page), _touch(1, page)]), alone.access([_touch(0, page)])
        moved = c_both.htod_bytes - c_alone.htod_bytes
        pages = float(moved // PAGE_BYTES)
        out[-pages if page == 0 else pages] = _latency_ns(both, c_both, moved) - float(c_alone.stall_ns)
    return out


def batch_block_points(path: Path) -> list[Point]:
    """The gap between two blocks serviced in one fault batch, measured against the simulator (module
    docstring): a block touched before, the median of the simulator's cost at each measured gap's pages
    (interpolated between the sweep's sizes); a block's first touch, the sweep's first."""
    from uvmlab.measure.calibrate import batch_block_gaps
    from uvmlab.measure.nsys.read import open_export

    if S.MEMCPY not in _tables(path):
        return []
    with open_export(path) as ex:
        info = batch_block_gaps(ex)
    if "reason" in info:
        return []
    costs, fitted, why, gpu = _profile_for(path)
    if gpu is None:
        return []
    driver = info["driver"]
    why = _with_driver(why, driver)
    sim = simulated_batch_block_gaps(costs, gpu, driver)
    later = sorted((p, t) for p, t in sim.items() if p > 0)
    predicted = {
        "later": float(np.median(np.interp(info["later"]["pages"], *zip(*later, strict=True)))),
        "first": next(t for p, t in sim.items() if p < 0),
    }
    points = []
    for key, label in (("later", "a block touched before"), ("first", "a block's first touch")):
        got = info[key]
        if got["median_us"] is None:
            continue
        points.append(
            Point(DATASET, path.stem, f"gap between two blocks of one fault batch, {label}", "s",
                  got["median_us"] / 1e6, predicted[key] / 1e9, fitted=fitted,
                  band=None if fitted else BATCH_BLOCK_BAND,
                  note=f"median of {got['count']} gap(s) ({min(got['pages'])}-{max(got['pages'])} pages; split at "
                  f"{info['split_us']:.1f} us); predicted: the simulator's second block of a batch at the same "
                  f"pages, with {why}")
        )  # fmt: skip
    return points


@check("nsys-batch-blocks", needs="nsys", fast=True)
def check_nsys_batch_blocks(data_dir: Path) -> list[Point]:
    """The service of a second block in one fault batch, every SQLite export whose kernels share batches."""
    return _every_sqlite(data_dir, batch_block_points)


@check("nsys-serial-refaults", needs="nsys", fast=True)
def check_nsys_serial_refaults(data_dir: Path) -> list[Point]:
    """GPU fault latency of one-thread kernels over CPU-initialised memory, every SQLite export with one."""
    return _every_sqlite(data_dir, serial_refault_points)


def _every_sqlite(data_dir: Path, points_of: Callable[[Path], list[Point]]) -> list[Point]:
    """``points_of`` of every SQLite export in ``data_dir/nsys``."""
    return [pt for path in export_files(data_dir / "nsys") if path.suffix == ".sqlite" for pt in points_of(path)]


@check("nsys-cpu-faults", needs="nsys", fast=True)
def check_nsys_cpu_faults(data_dir: Path) -> list[Point]:
    """The host cost of a CPU fault, every SQLite export whose CPU faults migrate data back."""
    return _every_sqlite(data_dir, cpu_fault_points)


@check("nsys-link", needs="nsys", fast=True)
def check_nsys_link(data_dir: Path) -> list[Point]:
    """Link bandwidth fitted on HtoD, validated on DtoH, every SQLite export with UM migrations."""
    return _every_sqlite(data_dir, link_points)
