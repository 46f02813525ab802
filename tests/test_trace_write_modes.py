"""write_trace without per-file fsync (the trace cache's private folder) writes the same files as the durable mode."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tests.uvm_synth import make_trace
from uvmlab.files.owned import BOOKKEEPING
from uvmlab.trace.schema import SCHEMAS, read_trace, write_trace


def test_cache_mode_writes_what_the_durable_mode_writes(tmp_path: Path) -> None:
    trace = make_trace(n_iter=2)
    durable = write_trace(trace, tmp_path / "durable")
    cached = write_trace(trace, tmp_path / "cached", durable=False)
    head_a, head_b = (json.loads((d / "trace.json").read_text()) for d in (durable, cached))
    assert head_a.pop("write_id") != head_b.pop("write_id")  # each write has its own id
    assert head_a == head_b
    a, b = read_trace(durable), read_trace(cached)
    for name in SCHEMAS:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    durable_names = sorted(p.name for p in durable.iterdir() if p.name not in BOOKKEEPING)  # lock, marker, manifest
    assert sorted(p.name for p in cached.iterdir()) == durable_names  # no temp files
