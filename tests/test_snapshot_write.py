"""The snapshot writer: round trip through read_snapshot, and torch.cuda._memory_viz accepts what we write."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from uvmlab.errors import InputError
from uvmlab.trace.safe_pickle import safe_load_file
from uvmlab.trace.snapshot import read_snapshot, write_snapshot

MiB = 1024 * 1024


def _tiny_run() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """A hand-made allocator run: one 2 MiB small segment, one 20 MiB large segment, a few allocs and frees."""
    base_s, base_l = 0x7F0000000000, 0x7F0010000000
    trace = [
        {"action": "segment_alloc", "addr": base_s, "size": 2 * MiB, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": base_s, "size": 1000, "stream": 0, "time_us": 2},
        {"action": "segment_alloc", "addr": base_l, "size": 20 * MiB, "stream": 0, "time_us": 3},
        {"action": "alloc", "addr": base_l, "size": 3 * MiB, "stream": 0, "time_us": 4},
        {"action": "alloc", "addr": base_l + 3 * MiB, "size": 5 * MiB, "stream": 0, "time_us": 5},
        {"action": "free_requested", "addr": base_l, "size": 3 * MiB, "stream": 0, "time_us": 6},
        {"action": "free_completed", "addr": base_l, "size": 3 * MiB, "stream": 0, "time_us": 7},
    ]
    segments = [
        {
            "device": 0,
            "address": base_s,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "blocks": [
                {"address": base_s, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
                {"address": base_s + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive"},
            ],
        },
        {
            "device": 0,
            "address": base_l,
            "total_size": 20 * MiB,
            "stream": 0,
            "segment_type": "large",
            "blocks": [
                {"address": base_l, "size": 3 * MiB, "requested_size": 0, "state": "inactive"},
                {"address": base_l + 3 * MiB, "size": 5 * MiB, "requested_size": 5 * MiB, "state": "active_allocated"},
                {"address": base_l + 8 * MiB, "size": 12 * MiB, "requested_size": 0, "state": "inactive"},
            ],
        },
    ]
    return segments, [trace]


def _sim_run() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """A run of the caching-allocator simulator."""
    from uvmlab.sim.allocator.caching import CachingAllocatorSim

    sim = CachingAllocatorSim(record_events=True)
    live = [sim.malloc(s) for s in (100, 3000, 2 * MiB, 7 * MiB, 30 * MiB, 500)]
    for b in live[::2]:
        sim.free(b)
    live.append(sim.malloc(6 * MiB))
    dicts = sim.to_snapshot_dicts()
    if isinstance(dicts, dict):
        return dicts["segments"], dicts["device_traces"]
    return dicts[0], dicts[1]


def test_write_then_read_tiny_run(tmp_path: Path) -> None:
    segments, traces = _tiny_run()
    out = write_snapshot(tmp_path / "s.pickle", segments, traces, allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": ""})
    snap = read_snapshot(out)
    assert snap.events["action"].tolist() == [e["action"] for e in traces[0]]
    assert snap.events["address"].tolist() == [e["addr"] for e in traces[0]]
    assert snap.events["size"].tolist() == [e["size"] for e in traces[0]]
    assert snap.reserved_bytes(0) == 22 * MiB
    assert snap.reserved_at_trace_start(0) == 0
    assert snap.allocated_bytes(0) == 1024 + 5 * MiB
    seg = snap.segments.set_index("address")
    assert seg.loc[0x7F0010000000, "requested_size"] == 5 * MiB


def test_real_snapshot_round_trips_with_identical_events(tmp_path: Path, real_data: Path) -> None:
    src = real_data / "snapshots" / "cranberrii__ftcourse__9f4902cf__memory_snapshot.pickle"
    raw = safe_load_file(src)
    out = write_snapshot(tmp_path / "copy.pickle", raw["segments"], raw["device_traces"], raw.get("allocator_settings"))
    a, b = read_snapshot(src), read_snapshot(out)
    pd.testing.assert_frame_equal(a.events, b.events)
    pd.testing.assert_frame_equal(a.segments, b.segments)
    pd.testing.assert_frame_equal(a.blocks, b.blocks)


def _memory_viz_accepts(path: Path, tmp_path: Path) -> None:
    from torch.cuda import _memory_viz as viz

    with open(path, "rb") as f:  # our own file, written by this test: plain pickle.load is fine here
        data = pickle.load(f)
    stats = viz.segsum(data)
    assert "segments:" in stats and "total_reserved" in stats
    text = viz.trace(data)
    assert "alloc" in text
    html = viz.trace_plot(data)
    assert "<html" in html.lower() and len(html) > 1000
    html_seg = viz.segment_plot(data)
    assert len(html_seg) > 1000


def test_memory_viz_accepts_written_snapshot(tmp_path: Path) -> None:
    segments, traces = _tiny_run()
    out = write_snapshot(tmp_path / "s.pickle", segments, traces)
    _memory_viz_accepts(out, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(out), "-o", str(tmp_path / "t.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t.html").stat().st_size > 1000


def test_simulated_run_exports_and_round_trips(tmp_path: Path) -> None:
    segments, traces = _sim_run()
    assert len(traces[0]) >= 14  # 7 allocs, 3 frees (requested + completed), segment_allocs
    out = write_snapshot(tmp_path / "sim.pickle", segments, traces)
    snap = read_snapshot(out)
    want = [(e["action"], e.get("addr"), e["size"]) for e in traces[0]]
    got = list(zip(snap.events["action"], snap.events["address"], snap.events["size"], strict=True))
    assert got == want
    assert snap.reserved_at_trace_start(0) == 0
    _memory_viz_accepts(out, tmp_path)


def test_write_refuses_malformed_dicts(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="lacks"):
        write_snapshot(tmp_path / "x.pickle", [{"address": 0}], [[]])
    with pytest.raises(InputError, match="TraceEntry"):
        write_snapshot(tmp_path / "x.pickle", [], [[{"action": "warp", "size": 1}]])
    assert not (tmp_path / "x.pickle").exists()
