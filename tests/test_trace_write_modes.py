"""write_trace without per-file fsync (the trace cache's private folder) writes the same files as the durable mode."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.uvm_synth import make_trace
from uvmlab.trace.schema import SCHEMAS, read_trace, write_trace


def test_cache_mode_writes_what_the_durable_mode_writes(tmp_path: Path) -> None:
    trace = make_trace(n_iter=2)
    durable = write_trace(trace, tmp_path / "durable")
    cached = write_trace(trace, tmp_path / "cached", durable=False)
    assert (durable / "trace.json").read_text() == (cached / "trace.json").read_text()
    a, b = read_trace(durable), read_trace(cached)
    for name in SCHEMAS:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert sorted(p.name for p in cached.iterdir()) == sorted(p.name for p in durable.iterdir())  # no temp files
