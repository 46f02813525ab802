"""PyTorch CUDA memory snapshots: a safe reader for every format generation, and a writer memory_viz opens.

``read_snapshot(path) -> Snapshot`` loads a ``torch.cuda.memory._dump_snapshot()`` pickle (or the plain segment
list of ``torch.cuda.memory_snapshot()``) WITHOUT ``pickle.load``: :mod:`uvmlab.trace.safe_pickle` refuses every
global, so a malicious file runs nothing. The result is three DataFrames:

- ``Snapshot.segments``: device, address, total_size, allocated_size, active_size, requested_size, stream,
  segment_type, segment_pool_id, is_expandable, n_blocks (sizes in bytes; missing fields are NA).
- ``Snapshot.blocks``: device, segment_address, address, offset, size, requested_size, state, address_inferred.
  G1 blocks have no ``address``; it is rebuilt as segment address + the sizes of the blocks before it (blocks are
  listed in address order), and ``address_inferred`` is True.
- ``Snapshot.events``: device, index (position in that device's trace ring, oldest first), action, address
  (``addr``; NA for oom), size, stream, time_us (NA before G3), device_free (oom only), n_frames. The stack
  ``frames`` are dropped (they hold the original author's paths; see the real-data README).

Sizes follow PyTorch (reference/allocator.md section 3.5): ``alloc`` carries the REQUESTED size,
``free_requested``/``free_completed`` the block's requested size, ``segment_*`` the cudaMalloc/mapped size,
``oom`` the rounded request. ``format_generation`` names the generation detected (section 3.6) and
``format_evidence`` says which fields decided it.

``write_snapshot(path, segments, device_traces, allocator_settings=None)`` pickles dicts in PyTorch's own
format (the allocator simulators produce them with ``to_snapshot_dicts()``); pytorch.org/memory_viz and
``python -m torch.cuda._memory_viz`` open the result. This module never imports torch.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_bytes
from uvmlab.trace.safe_pickle import safe_load_file

KNOWN_TOP_KEYS = frozenset(
    {"segments", "device_traces", "allocator_settings", "external_annotations", "host_segments", "host_traces"}
)
"""Top-level keys of ``_snapshot()`` up to PyTorch main (2026); host_* come with record_pinned_host_memory."""
KNOWN_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "snapshot", "oom", "user_defined", "annotate")  # fmt: skip
"""TraceEntry actions (reference/allocator.md section 3.5; user_defined/annotate are newer)."""
RESERVE_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
"""Sign with which each action changes the device's reserved bytes."""
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
"""Block states; ``active_awaiting_free`` (the spelling of the _snapshot docstring) is read as active_pending_free."""
GENERATIONS = {
    "segments-list": "plain list returned by torch.cuda.memory_snapshot() (segments only, no trace)",
    "G1": "≈2.0: blocks carry history[{addr, real_size, frames}] and no address",
    "G2": "≈2.1: block address and frames; no allocator_settings, no time_us",
    "G3": "≈2.2-2.4: + allocator_settings, + time_us",
    "G4": "≈2.5+: + external_annotations",
    "G5": "newer: + compile_context in trace entries",
    "G6": "newest seen: + user_metadata in trace entries",
}
"""Format generations (reference/allocator.md section 3.6; G6 is our own observation, e.g. the Wedsonlin files).
The mapping to PyTorch versions is approximate."""

MAX_DEVICES = 64
"""Device traces a snapshot may hold (real data: at most 4, ../shared/real-data/snapshots)."""
MAX_EVENTS = 400_000
"""Trace entries over all devices, shared lists counted at every use (real data: at most 22,332; PyTorch's ring
keeps ``max_entries`` per device, 100,000 by default: four full devices). What the commands can process in 1 GiB:
500,000 events (two dicts shared, issue 42) were read, replayed and planned under RLIMIT_AS = 1 GiB, 1,980,000
were not (fragmentation ran 87 s for 500,000 on a loaded 2-core machine)."""
MAX_SEGMENTS = 100_000
"""Segments (real data: at most 1,722)."""
MAX_BLOCKS = 500_000
"""Blocks over all segments (real data: at most 6,644; a table row is ~200 bytes: ~100 MB at the limit)."""
INT64_MAX = 2**63 - 1
"""Largest address/size/stream/time a snapshot may hold (PyTorch stores them as int64/size_t; tables are int64)."""

SEGMENT_COLUMNS = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                   "segment_type", "segment_pool_id", "is_expandable", "n_blocks"]  # fmt: skip
BLOCK_COLUMNS = ["device", "segment_address", "address", "offset", "size", "requested_size", "state",
                 "address_inferred"]  # fmt: skip
EVENT_COLUMNS = ["device", "index", "action", "address", "size", "stream", "time_us", "device_free", "n_frames"]


@dataclass
class Snapshot:
    """A snapshot read by :func:`read_snapshot` (tables described in the module docstring)."""

    path: str
    format_generation: str
    format_evidence: str
    segments: pd.DataFrame
    blocks: pd.DataFrame
    events: pd.DataFrame
    allocator_settings: dict[str, Any] | None
    devices: list[int]
    external_annotations: pd.DataFrame = field(default_factory=pd.DataFrame)

    def reserved_bytes(self, device: int) -> int:
        """Reserved bytes of ``device`` when the snapshot was taken (sum of its segments' total_size)."""
        seg = self.segments
        return int(seg.loc[seg["device"] == device, "total_size"].sum())

    def allocated_bytes(self, device: int) -> int:
        """Allocated block bytes of ``device`` when the snapshot was taken."""
        seg = self.segments
        return int(seg.loc[seg["device"] == device, "allocated_size"].fillna(0).sum())

    def _reserve_deltas(self, device: int) -> pd.DataFrame:
        ev = self.events[self.events["device"] == device]
        delta = ev["action"].map(RESERVE_DELTA).fillna(0).astype("int64") * ev["size"].astype("int64")
        return pd.DataFrame({"index": ev["index"], "delta": delta})

    def reserved_at_trace_start(self, device: int) -> int:
        """Reserved bytes before the first trace event of ``device``.

        The trace may start mid-run, so this is rebuilt backwards: reserved at the end minus the net
        segment_alloc/map minus segment_free/unmap bytes in the trace.
        """
        return self.reserved_bytes(device) - int(self._reserve_deltas(device)["delta"].sum())

    def reserved_timeline(self, device: int) -> pd.Series:
        """Reserved bytes after each trace event of ``device`` (indexed by event index)."""
        d = self._reserve_deltas(device)
        start = self.reserved_at_trace_start(device)
        return pd.Series(start + d["delta"].cumsum().to_numpy(), index=d["index"].to_numpy(), name="reserved_bytes")

    def summary(self) -> list[dict[str, Any]]:
        """One dict per device: segments, reserved/allocated at the end, trace events by action, peak reserved."""
        rows = []
        for dev in self.devices:
            ev = self.events[self.events["device"] == dev]
            timeline = self.reserved_timeline(dev)
            start = self.reserved_at_trace_start(dev)
            rows.append(
                {
                    "device": dev,
                    "segments": int((self.segments["device"] == dev).sum()),
                    "blocks": int((self.blocks["device"] == dev).sum()),
                    "reserved_bytes": self.reserved_bytes(dev),
                    "allocated_bytes": self.allocated_bytes(dev),
                    "events": len(ev),
                    "actions": dict(sorted(Counter(ev["action"]).items())),
                    "reserved_at_trace_start_bytes": start,
                    "peak_reserved_in_trace_bytes": int(max(start, timeline.max())) if len(timeline) else start,
                }
            )
        return rows


def _not_snapshot(source: str, found: str) -> InputError:
    return InputError(
        f"{source} is a pickle but not a PyTorch memory snapshot ({found}); "
        "expected the dict written by torch.cuda.memory._dump_snapshot()"
    )


def _unknown_format(source: str, found: str) -> InputError:
    return InputError(
        f"{source} looks like a PyTorch memory snapshot in a format generation uvmlab does not know ({found}); "
        f"known generations: {', '.join(GENERATIONS)} (see docs/snapshots.md)"
    )


def _detect_generation(top: dict[str, Any], is_list: bool) -> tuple[str, str]:
    if is_list:
        return "segments-list", "top level is a list of segments (torch.cuda.memory_snapshot())"
    segs = top["segments"]
    blocks = [b for s in segs for b in s["blocks"]]
    entries = [e for d in top.get("device_traces", []) for e in d]
    if any("history" in b for b in blocks) or any("address" not in b for b in blocks):
        return "G1", "blocks carry history/real_size and no address"
    if segs and not any("is_expandable" in s for s in segs):
        return "G1", "segments lack is_expandable/segment_pool_id"
    if any("user_metadata" in e for e in entries):
        return "G6", "trace entries carry user_metadata"
    if any("compile_context" in e for e in entries):
        return "G5", "trace entries carry compile_context"
    if "external_annotations" in top:
        return "G4", "top level has external_annotations"
    if "allocator_settings" in top or any("time_us" in e for e in entries):
        return "G3", "allocator_settings or time_us present, no external_annotations"
    return "G2", "block addresses and frames, no allocator_settings and no time_us"


def _check_structure(top: Any, source: str) -> tuple[dict[str, Any], bool]:
    """Return (snapshot dict, is_segment_list); raise InputError naming what was found otherwise."""
    if isinstance(top, list):
        if all(isinstance(s, dict) and "total_size" in s and "blocks" in s for s in top):
            return {"segments": top, "device_traces": []}, True
        return top, False  # reported below
    if not isinstance(top, dict):
        raise _not_snapshot(source, f"its top level is a {type(top).__name__}")
    if "segments" not in top:
        keys = sorted(map(str, top))[:8]
        raise _not_snapshot(source, f"a dict with keys {keys} and no 'segments'")
    unknown = sorted(str(k) for k in top if k not in KNOWN_TOP_KEYS)
    if unknown:
        raise _unknown_format(source, f"unknown top-level keys {unknown}")
    return top, False


def _require(items: Any, kind: str, keys: tuple[str, ...], source: str) -> None:
    if not isinstance(items, list):
        raise _unknown_format(source, f"{kind} list is a {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _unknown_format(source, f"{kind} {i} is a {type(item).__name__}, not a dict")
        missing = [k for k in keys if k not in item]
        if missing:
            raise _unknown_format(source, f"{kind} {i} lacks {missing}; it has {sorted(map(str, item))}")


def _norm_state(state: str) -> str:
    return "active_pending_free" if state == "active_awaiting_free" else state


def _num(value: Any, what: str, source: str, optional: bool = False) -> int | None:
    """``value`` as an int (None allowed if ``optional``); anything else means a format we do not know."""
    if value is None and optional:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _unknown_format(source, f"{what} is a {type(value).__name__} ({str(value)[:40]!r}), not an integer")
    if not 0 <= value <= INT64_MAX:
        raise InputError(f"{source}: {what} {str(value)[:40]} is outside 0..2**63-1; it is not a real snapshot value")
    return value


def _check_limits(top: dict[str, Any], source: str) -> None:
    """Refuse a snapshot larger than the documented limits, counted from list lengths before any table is built."""
    segs, traces = top.get("segments"), top.get("device_traces", [])
    counts = {"devices": len(traces) if isinstance(traces, list) else 0,
              "trace events": sum(len(d) for d in traces if isinstance(d, list)) if isinstance(traces, list) else 0,
              "segments": len(segs) if isinstance(segs, list) else 0,
              "blocks": sum(len(s["blocks"]) for s in segs if isinstance(s, dict) and isinstance(s.get("blocks"), list))
              if isinstance(segs, list) else 0}  # fmt: skip
    limits = {"devices": MAX_DEVICES, "trace events": MAX_EVENTS, "segments": MAX_SEGMENTS, "blocks": MAX_BLOCKS}
    for what, n in counts.items():
        if n > limits[what]:
            raise InputError(
                f"{source} was refused: it holds {n:,} {what} (shared references count at every use), more than "
                f"uvmlab's limit of {limits[what]:,} for untrusted snapshots (docs/safety.md)"
            )


def _tables(top: dict[str, Any], source: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    segs = top["segments"]
    _require(segs, "segment", ("address", "total_size", "blocks"), source)
    seg_rows, block_rows = [], []
    for s in segs:
        _require(s["blocks"], "block", ("size", "state"), source)
        dev = _num(s.get("device", 0), "segment device", source)
        seg_addr = _num(s["address"], "segment address", source)
        pool = s.get("segment_pool_id")
        seg_rows.append(
            (
                dev,
                seg_addr,
                _num(s["total_size"], "segment total_size", source),
                _num(s.get("allocated_size"), "segment allocated_size", source, True),
                _num(s.get("active_size"), "segment active_size", source, True),
                _num(s.get("requested_size"), "segment requested_size", source, True),
                _num(s.get("stream"), "segment stream", source, True),
                s.get("segment_type"),
                None if pool is None else ",".join(map(str, pool)) if isinstance(pool, (list, tuple)) else str(pool),
                s.get("is_expandable"),
                len(s["blocks"]),
            )
        )
        offset = 0
        for b in s["blocks"]:
            state = _norm_state(b["state"]) if isinstance(b["state"], str) else b["state"]
            if state not in BLOCK_STATES:
                raise _unknown_format(source, f"block state {str(b['state'])[:40]!r}")
            inferred = "address" not in b
            addr = seg_addr + offset if inferred else _num(b["address"], "block address", source)
            size = _num(b["size"], "block size", source)
            requested = b.get("requested_size")
            history = b.get("history")
            if requested is None and isinstance(history, list) and history and isinstance(history[0], dict):
                requested = history[0].get("real_size")
            requested = _num(requested, "block requested_size", source, True)
            block_rows.append((dev, seg_addr, addr, addr - seg_addr, size, requested, state, inferred))
            offset += size
    segments = pd.DataFrame(seg_rows, columns=SEGMENT_COLUMNS)
    blocks = pd.DataFrame(block_rows, columns=BLOCK_COLUMNS)
    for df, cols in ((segments, ("allocated_size", "active_size", "requested_size", "stream")), (blocks, ())):
        for col in cols:
            df[col] = df[col].astype("Int64")
    blocks["requested_size"] = blocks["requested_size"].astype("Int64")
    segments = segments.sort_values(["device", "address"], kind="stable").reset_index(drop=True)

    traces = top.get("device_traces", [])
    if not isinstance(traces, list):
        raise _unknown_format(source, f"device_traces is a {type(traces).__name__}")
    ev_rows = []
    for dev, entries in enumerate(traces):
        _require(entries, f"device {dev} trace entry", ("action", "size"), source)
        for i, e in enumerate(entries):
            action = e["action"]
            if not isinstance(action, str) or action not in KNOWN_ACTIONS:
                raise _unknown_format(source, f"trace action {str(action)[:40]!r} on device {dev}")
            frames = e.get("frames")
            ev_rows.append(
                (
                    dev,
                    i,
                    action,
                    _num(e.get("addr"), "trace entry addr", source, True),
                    _num(e["size"], "trace entry size", source),
                    _num(e.get("stream", 0), "trace entry stream", source),
                    _num(e.get("time_us"), "trace entry time_us", source, True),
                    _num(e.get("device_free"), "trace entry device_free", source, True),
                    len(frames) if isinstance(frames, list) else 0,
                )
            )
    events = pd.DataFrame(ev_rows, columns=EVENT_COLUMNS)
    for col in ("address", "time_us", "device_free"):
        events[col] = events[col].astype("Int64")
    for col in ("device", "index", "size", "stream", "n_frames"):
        events[col] = events[col].astype("int64")
    return segments, blocks, events


def read_snapshot(path: str | Path) -> Snapshot:
    """Read a PyTorch memory snapshot pickle safely (no code in the file runs); see the module docstring.

    Raises InputError with one sentence for: a missing, empty, truncated or non-pickle file; a pickle that asks
    for any global (refused, nothing ran); a pickle that is not a snapshot; a snapshot generation not known.
    """
    source = str(path)
    raw = safe_load_file(path)
    top, is_list = _check_structure(raw, source)
    if isinstance(top, list):
        raise _not_snapshot(source, "a list whose items are not segments")
    _check_limits(top, source)
    segments, blocks, events = _tables(top, source)  # validates the structure first
    generation, evidence = _detect_generation(top, is_list)
    settings = top.get("allocator_settings")
    if settings is not None and not isinstance(settings, dict):
        raise _unknown_format(source, f"allocator_settings is a {type(settings).__name__}")
    ann = top.get("external_annotations")
    annotations = pd.DataFrame([a for a in ann if isinstance(a, dict)] if isinstance(ann, list) else [])
    devices = sorted(set(segments["device"].tolist()) | set(range(len(top.get("device_traces", [])))))
    return Snapshot(
        path=source,
        format_generation=generation,
        format_evidence=evidence,
        segments=segments,
        blocks=blocks,
        events=events,
        allocator_settings=settings,
        devices=[int(d) for d in devices],
        external_annotations=annotations,
    )


def _validate_for_write(segments: Any, device_traces: Any) -> None:
    if not isinstance(segments, list):
        raise InputError(f"write_snapshot: segments must be a list of dicts, got {type(segments).__name__}")
    for i, s in enumerate(segments):
        missing = [k for k in ("device", "address", "total_size", "stream", "segment_type", "blocks") if k not in s]
        if missing:
            raise InputError(f"write_snapshot: segment {i} lacks {missing} (PyTorch's segment format needs them)")
        for j, b in enumerate(s["blocks"]):
            lacks = [k for k in ("address", "size", "requested_size", "state") if k not in b]
            if lacks:
                raise InputError(f"write_snapshot: block {j} of segment {i} lacks {lacks}")
    if not isinstance(device_traces, list) or not all(isinstance(d, list) for d in device_traces):
        raise InputError("write_snapshot: device_traces must be a list (one per device) of lists of trace entries")
    for dev, entries in enumerate(device_traces):
        for i, e in enumerate(entries):
            if "action" not in e or "size" not in e or e["action"] not in KNOWN_ACTIONS:
                raise InputError(f"write_snapshot: trace entry {i} of device {dev} is not a TraceEntry: {e!r}")


def _complete_segment(s: dict[str, Any]) -> dict[str, Any]:
    """Fill the optional fields memory_viz reads (frames, sizes) with PyTorch's defaults."""
    blocks = [{"frames": [], **b} for b in s["blocks"]]
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in blocks if b["state"] != "inactive")
    return {
        "allocated_size": allocated,
        "active_size": active,
        "requested_size": requested,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        **s,
        "blocks": blocks,
    }


def write_snapshot(
    path: str | Path,
    segments: list[dict[str, Any]],
    device_traces: list[list[dict[str, Any]]],
    allocator_settings: dict[str, Any] | None = None,
    external_annotations: list[dict[str, Any]] | None = None,
) -> Path:
    """Write a snapshot pickle in PyTorch's format (section 3.2) that memory_viz and :func:`read_snapshot` open.

    ``segments``: Segment dicts (device, address, total_size, stream, segment_type, blocks[{address, size,
    requested_size, state}], optional sizes/frames, filled in when absent). ``device_traces``: one list of
    TraceEntry dicts (action, addr, size, stream, optional time_us/frames) per device. Written atomically with
    the standard pickle module (only plain containers, so the restricted reader loads it back).
    """
    _validate_for_write(segments, device_traces)
    data: dict[str, Any] = {
        "segments": [_complete_segment(s) for s in segments],
        "device_traces": [[{"frames": [], **e} for e in d] for d in device_traces],
    }
    if allocator_settings is not None:
        data["allocator_settings"] = dict(allocator_settings)
    data["external_annotations"] = list(external_annotations or [])
    out = Path(path)
    atomic_write_bytes(out, pickle.dumps(data, protocol=4))
    return out
