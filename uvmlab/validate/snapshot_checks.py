"""Scorecard check: every replayable real snapshot (real-data/snapshots) through the allocator simulator.

Each snapshot with an alloc/free trace is replayed with :func:`uvmlab.memory.replay.replay_snapshot` (PyTorch's
CUDACachingAllocator rules, reference/allocator.md; nothing is fitted). Per device, four quantities, each promised
exact (band 1.0): allocations placed at the real address (measured = the trace's allocations, predicted = those
the simulator put at the same address), peak reserved bytes, peak requested bytes, and segment events
(segment_alloc/free/map/unmap; only where the trace has some). State-only snapshots (no trace) are not
points: the number skipped is in each point's note.
"""

from __future__ import annotations

from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_rows
from uvmlab.validate.points import Point, check

DATASET = "snapshots"
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
SNAPSHOT_FOLDERS = ("snapshots", "incoming/snapshots")
"""Where the real snapshots live under the real-data folder (read where they are: shared/ is read-only).
``incoming/snapshots`` (its README) holds four later arrivals: three replay identically (ZidongLiu/DeComFL, the
current format from Windows; Maphsge4/select_n 1f2f5480 and 04d383cd, the pre-2.1 format, the latter with 584
segment_alloc / 579 segment_free release bursts, emulated as empty_cache); dec166a3 is state-only (no trace: not a
point). docs/snapshots.md "Incoming snapshots"."""


def snapshot_files(folder: Path) -> list[Path]:
    """The snapshots listed in MANIFEST.tsv (in its order), else every *.pickle / *.pkl in ``folder``."""
    manifest = folder / "MANIFEST.tsv"
    if manifest.exists():
        _, rows = read_csv_rows(manifest, MAX_DATA_FILE_BYTES, "a snapshot MANIFEST.tsv", delimiter="\t")
        names = [row.get("file") or "" for row in rows]
        return [folder / n for n in names if n and (folder / n).exists()]
    return sorted(p for p in folder.iterdir() if p.suffix in SNAPSHOT_SUFFIXES)


def _case(path: Path, device: int, n_devices: int) -> str:
    name = path.stem
    return f"{name} (device {device})" if n_devices > 1 else name


def snapshot_points(path: Path) -> list[Point]:
    """The points of one snapshot (empty for a snapshot without a trace)."""
    from uvmlab.memory.replay import replay_snapshot

    try:
        report = replay_snapshot(path)
    except InputError as exc:
        if "no alloc/free trace" in str(exc):
            return []
        raise
    points = []
    for d in report.devices:
        case = _case(path, d.device, len(report.devices))
        why = "" if d.first_divergence is None else f"first divergence: {d.first_divergence}"
        pairs = [
            ("allocations at the real address", "count", d.allocs, d.allocs_matched),
            ("peak reserved", "bytes", d.peak_reserved_real, d.peak_reserved_sim),
            ("peak requested", "bytes", d.peak_requested_real, d.peak_requested_sim),
            ("segment events", "count", d.segment_events_real, d.segment_events_sim),
        ]
        points += [
            Point(DATASET, case, q, unit, float(real), float(sim), note=why, band=1.0)
            for q, unit, real, sim in pairs
            if real  # a quantity the trace does not have (e.g. no segment events) is not a point
        ]
    return points


@check("snapshots-replay", needs="snapshots", fast=True)
def check_snapshots(data_dir: Path) -> list[Point]:
    """Every replayable snapshot in the ``SNAPSHOT_FOLDERS`` of ``data_dir`` (a folder that is absent is skipped)."""
    points: list[Point] = []
    for folder in SNAPSHOT_FOLDERS:
        if (data_dir / folder).is_dir():
            for path in snapshot_files(data_dir / folder):
                points += snapshot_points(path)
    return points
