"""``uvmlab run --snapshot``: frames (op, category, phase, iteration) and simulated time, read back by torch."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.trace.schema import CATEGORIES, PHASES
from uvmlab.trace.snapshot import read_snapshot

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
TINY_ARGS = [TINY, "--option", "hidden=2048", "--batch-size", "256", "--iterations", "2", "--mode", "sim"]


@pytest.fixture(scope="module", params=["on", "off"])
def snap(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = tmp_path_factory.mktemp("snap")
    out = d / "s.pickle"
    args = ["run", *TINY_ARGS, "--oversub", "2", "--pca", request.param, "-o", str(d / "r"), "--snapshot", str(out)]
    assert main(args) == 0
    with open(out, "rb") as f:  # our own file, written by this test: plain pickle.load is fine here
        return d / "r", pickle.load(f)


def test_every_entry_has_op_category_phase_iteration_frames(snap: tuple[Path, dict[str, Any]]) -> None:
    from torch.cuda import _memory_viz as viz

    _, data = snap
    entries = data["device_traces"][0]
    assert len(entries) > 50
    for e in entries:
        lines = viz._frames_fmt(e["frames"])  # torch's own frame formatter
        assert [ln.split(":")[0] for ln in lines] == ["op", "category", "phase", "iteration"], e
        op, cat = lines[0].split(":", 2)[2], lines[1].split(":", 2)[2]
        assert cat in CATEGORIES
        assert op.startswith("aten::") or (cat == "workspace" and op.endswith("_workspace")), e
        assert lines[2].split(":", 2)[2] in PHASES
    phases = {e["frames"][2]["name"] for e in entries}
    assert {"forward", "backward"} <= phases


def test_time_us_is_simulated_time(snap: tuple[Path, dict[str, Any]]) -> None:
    run, data = snap
    t = [e["time_us"] for e in data["device_traces"][0]]
    assert all(isinstance(x, int) for x in t)
    assert t == sorted(t) and t[-1] > len(t)  # not the event index: microseconds of simulated time
    k = pd.read_parquet(run / "tables" / "kernels.parquet")
    assert t[-1] <= round(k["end_ns"].max() / 1000)
    its = pd.read_parquet(run / "tables" / "iterations.parquet")
    it1 = [e for e in data["device_traces"][0] if e["frames"][3]["line"] == 1 and e["action"] == "alloc"]
    assert it1 and all(e["time_us"] >= round(its["start_ns"].iloc[1] / 1000) - 1 for e in it1)


def test_memory_viz_reads_frames_back(snap: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from torch.cuda import _memory_viz as viz

    _, data = snap
    flame = viz.segments(data, format_flamegraph=lambda lines: lines)  # block frames, through torch's code
    live = [ln for ln in flame.splitlines() if ";active_allocated;" in ln and "<gaps>" not in ln]
    assert live and all(";op:0:" in ln and ";category:0:" in ln and "iteration:" in ln for ln in live)
    assert sum("op:0:aten::" in ln for ln in live) > len(live) / 2
    assert "<non-python>" not in "\n".join(live)
    html = viz.trace_plot(data)
    assert "<html" in html.lower() and len(html) > 1000  # the trace plot embeds the pickle itself
    assert "alloc" in viz.trace(data)


def test_snapshot_matches_the_run(snap: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, data = snap
    out = tmp_path / "copy.pickle"
    out.write_bytes(pickle.dumps(data))
    s = read_snapshot(out)  # our safe reader accepts it
    res = json.loads((run / "result.json").read_text())
    assert int(s.reserved_timeline(0).max()) == res["peak_reserved_bytes"]
    assert s.events["n_frames"].eq(4).all()


def test_estimate_snapshot_has_frames_too(tmp_path: Path) -> None:
    snap = tmp_path / "est.pickle"
    args = ["estimate", TINY, "--option", "hidden=512", "--batch-size", "64", "-n", "2", "--snapshot", str(snap)]
    assert main([*args, "-o", str(tmp_path / "e")]) == 0
    with open(snap, "rb") as f:  # our own file, written by this test: plain pickle.load is fine here
        data = pickle.load(f)
    entries = data["device_traces"][0]
    assert entries and all(
        [fr["filename"] for fr in e["frames"]] == ["op", "category", "phase", "iteration"] for e in entries
    )
    assert [e["time_us"] for e in entries] == list(range(len(entries)))  # estimate has no clock: event index


def test_settings_name_the_caching_switch_only_when_caching_is_off(snap: tuple[Path, dict[str, Any]]) -> None:
    """PYTORCH_NO_CUDA_MEMORY_CACHING set to any value turns caching off: a PCA-on snapshot must not carry it."""
    run_dir, data = snap
    pca = json.loads((run_dir / "result.json").read_text())["pca"]
    settings = data["allocator_settings"]
    assert ("PYTORCH_NO_CUDA_MEMORY_CACHING" in settings) is (not pca)
