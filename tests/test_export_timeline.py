"""``--timeline``: Chrome trace-event / Perfetto JSON of simulated (run) and measured (nsys import) runs.

The schema check below is written from the Trace Event Format spec (Google, "Trace Event Format",
docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), independently of the writer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uvmlab.cli import main
from uvmlab.export.timeline import _lanes

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
TINY_ARGS = [TINY, "--option", "hidden=2048", "--batch-size", "256", "--iterations", "2", "--mode", "sim"]

PHASES = {"B", "E", "X", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D", "R", "(", ")"}
METADATA_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_events(doc: Any) -> dict[int, str]:
    """Assert ``doc`` follows the JSON Object Format of the spec; return {tid: thread name}."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    names: dict[int, str] = {}
    stacks: dict[tuple[int, int], list[str]] = defaultdict(list)
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        ph = ev.get("ph")
        assert ph in PHASES, ev
        assert isinstance(ev.get("name"), str), ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
        assert "args" not in ev or isinstance(ev["args"], dict), ev
        if ph == "M":
            assert ev["name"] in METADATA_NAMES, ev
            if ev["name"].endswith("_name"):
                assert isinstance(ev["args"]["name"], str)
                if ev["name"] == "thread_name":
                    names[ev["tid"]] = ev["args"]["name"]
            else:
                assert isinstance(ev["args"].get("sort_index"), int)
            continue
        ts = ev.get("ts")
        assert isinstance(ts, (int, float)) and not isinstance(ts, bool) and np.isfinite(ts), ev
        key = (ev["pid"], ev["tid"])
        if ph == "X":
            assert isinstance(ev.get("dur"), (int, float)) and ev["dur"] >= 0, ev
            spans[key].append((ts, ts + ev["dur"]))
        elif ph == "B":
            stacks[key].append(ev["name"])
        elif ph == "E":
            assert stacks[key], f"E without B: {ev}"
            stacks[key].pop()
        elif ph == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) and np.isfinite(v) for v in ev["args"].values())
        elif ph in ("i", "I"):
            assert ev.get("s", "t") in ("g", "p", "t"), ev
    assert not any(stacks.values()), "unclosed B events"
    for key, sp in spans.items():  # spans of one thread nest or are disjoint (no partial overlap)
        sp.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for s, e in sp:
            while open_ends and open_ends[-1] <= s + 1e-6:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1] + 1e-6, f"partial overlap on {key}: {s}..{e}"
            open_ends.append(e)
    json.dumps(doc, allow_nan=False)  # no NaN / Infinity: not JSON
    return names


def _tracks(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    names = check_trace_events(doc)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            out[names[ev["tid"]].split(" (")[0]].append(ev)
        elif ev["ph"] == "C":
            out["counter " + ev["name"]].append(ev)
    return out


@pytest.fixture(scope="module")
def sim_timeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = tmp_path_factory.mktemp("tl")
    tl = d / "t.json"
    assert main(["run", *TINY_ARGS, "--oversub", "2", "--pca", "off", "-o", str(d / "r"), "--timeline", str(tl)]) == 0
    return d / "r", json.loads(tl.read_text())


def test_simulated_timeline_is_valid_and_has_every_track(sim_timeline: tuple[Path, dict[str, Any]]) -> None:
    import pandas as pd

    run, doc = sim_timeline
    tracks = _tracks(doc)
    for t in ("iterations", "phases", "kernels", "UVM faults", "HtoD migrations", "DtoH migrations", "evictions"):
        assert tracks[t], f"no spans on track {t}"
    for c in ("allocated", "reserved", "resident"):
        assert tracks["counter " + c], f"no counter {c}"
    k = pd.read_parquet(run / "tables" / "kernels.parquet")
    assert len(tracks["kernels"]) == len(k)
    first = min(tracks["kernels"], key=lambda e: e["ts"])
    assert first["ts"] == pytest.approx(k["start_ns"].min() / 1000)  # microseconds
    its = pd.read_parquet(run / "tables" / "iterations.parquet")
    assert [e["name"] for e in sorted(tracks["iterations"], key=lambda e: e["ts"])] == [
        f"iteration {i}" for i in its["iteration"]
    ]
    assert {e["args"]["phase"] for e in tracks["phases"]} >= {"forward", "backward", "optimizer"}
    assert sum(e["args"]["fault_count"] for e in tracks["UVM faults"]) == int(k["fault_count"].sum())
    assert sum(e["args"]["htod_bytes"] for e in tracks["HtoD migrations"]) == int(k["htod_bytes"].sum())
    assert sum(e["args"]["eviction_count"] for e in tracks["evictions"]) == int(k["eviction_count"].sum())


def test_measured_timeline_from_nsys_import(real_data: Path, tmp_path: Path) -> None:
    src = real_data / "nsys" / "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
    tl = tmp_path / "m.json"
    assert main(["nsys", "import", str(src), "-o", str(tmp_path / "m"), "--timeline", str(tl)]) == 0
    tracks = _tracks(json.loads(tl.read_text()))
    import pandas as pd

    mig = pd.read_parquet(tmp_path / "m" / "tables" / "migrations.parquet")
    assert len(tracks["HtoD migrations"]) == int((mig["direction"] == "htod").sum()) > 0
    assert tracks["UVM faults"] and tracks["kernels"]


def test_overlapping_spans_get_separate_lanes() -> None:
    start = np.array([0.0, 1.0, 2.0, 10.0])
    end = np.array([5.0, 3.0, 4.0, 11.0])
    lanes = _lanes(start, end)
    assert lanes.tolist() == [0, 1, 2, 0]
    with pytest.raises(AssertionError, match="partial overlap"):
        check_trace_events(
            {
                "traceEvents": [
                    {"name": "a", "ph": "X", "ts": 0, "dur": 5, "pid": 1, "tid": 1},
                    {"name": "b", "ph": "X", "ts": 1, "dur": 9, "pid": 1, "tid": 1},
                ]
            }
        )


def test_measured_timeline_has_nvtx_ranges_and_memory_counter(real_data: Path, tmp_path: Path) -> None:
    src = real_data / "nsys" / "gemmspmm_a100_cuda_memory_usage_nsys2024.2.3.sqlite"
    tl = tmp_path / "g.json"
    assert main(["nsys", "import", str(src), "-o", str(tmp_path / "g"), "--timeline", str(tl)]) == 0
    doc = json.loads(tl.read_text())
    tracks = _tracks(doc)
    assert tracks["phases"] and all(e["args"].get("text") for e in tracks["phases"])  # the export's NVTX ranges
    assert tracks["counter reserved"] and "counter allocated" not in tracks  # not collected: left out, not 0
    assert doc["otherData"]["mode"] == "measured"
