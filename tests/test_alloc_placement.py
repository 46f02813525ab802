"""place(): blocks inside their ranges, ranges never overlap while live, peaks and OOM as the simulators say."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from uvmlab.errors import InputError
from uvmlab.sim.allocator.placement import place
from uvmlab.trace.schema import Trace

MiB = 1 << 20


def make_trace(n: int = 300, seed: int = 1, zero_every: int = 50) -> Trace:
    rng = random.Random(seed)
    rows, live, seq = [], [], 0
    for i in range(n):
        size = 0 if i % zero_every == 7 else rng.choice([100, 4096, 300_000, 3 * MiB, 12 * MiB, 40 * MiB])
        rows.append([i, size, seq, -1, "activation", "forward", 0, "op", 0])
        live.append(i)
        seq += 1
        if len(live) > 12:
            j = live.pop(rng.randrange(len(live)))
            rows[j][3] = seq
            seq += 1
    cols = ["alloc_id", "size_bytes", "alloc_seq", "free_seq", "category", "phase", "iteration", "op", "stream"]
    return Trace(allocations=pd.DataFrame(rows, columns=cols))


def check_layout(trace: Trace, p) -> None:
    a = trace.allocations.set_index("alloc_id")
    b = p.blocks.set_index("alloc_id")
    r = p.ranges.set_index("range_id")
    for aid, row in b.iterrows():
        size = a.loc[aid, "size_bytes"]
        if size == 0:
            assert row.block_bytes == 0 and row.range_id == -1
            continue
        assert row.block_bytes >= size
        rng = r.loc[row.range_id]
        assert rng.address <= row.address < rng.address + rng.size_bytes
        assert rng.alloc_seq <= a.loc[aid, "alloc_seq"]
        assert rng.free_seq == -1 or rng.free_seq >= a.loc[aid, "free_seq"] >= 0
        # the whole block is covered by ranges live when it is allocated (with expandable segments a block may
        # run on into the next mapping of the same contiguous VA)
        seq = a.loc[aid, "alloc_seq"]
        pos, end = row.address, row.address + row.block_bytes
        live_now = r[(r.alloc_seq <= seq) & ((r.free_seq == -1) | (r.free_seq > seq))].sort_values("address")
        for x in live_now.itertuples():
            if x.address <= pos < x.address + x.size_bytes:
                pos = x.address + x.size_bytes
        assert pos >= end, f"block {aid} is not inside mapped ranges"
    # ranges live at the same time never overlap
    events = sorted(
        [(x.alloc_seq, 1, x) for x in r.itertuples()] + [(x.free_seq, 0, x) for x in r.itertuples() if x.free_seq >= 0]
    )
    live: dict[int, tuple[int, int]] = {}
    for _, is_open, x in events:
        if is_open:
            for s, e in live.values():
                assert x.address + x.size_bytes <= s or e <= x.address
            live[x.Index] = (x.address, x.address + x.size_bytes)
        else:
            live.pop(x.Index)


@pytest.mark.parametrize(("allocator", "conf"), [("pca", ""), ("pca", "expandable_segments:True"), ("nocache", None)])
def test_place_layout(allocator: str, conf: str | None) -> None:
    t = make_trace()
    p = place(t, allocator, conf)
    assert p.oom_seq is None
    assert len(p.blocks) == len(t.allocations)
    assert len(p.timeline) == len(t.events())
    assert p.timeline["reserved_bytes"].max() == p.peak_reserved_bytes
    assert p.timeline["allocated_bytes"].max() == p.peak_allocated_bytes
    assert (p.timeline["allocated_bytes"] <= p.timeline["reserved_bytes"]).all()
    check_layout(t, p)
    if allocator == "nocache":
        nonzero = (t.allocations["size_bytes"] > 0).sum()
        assert len(p.ranges) == nonzero
        assert p.peak_reserved_bytes == p.peak_allocated_bytes
    else:
        assert p.peak_reserved_bytes >= p.peak_allocated_bytes


def test_place_caching_beats_or_matches_nocache_on_reserved_count() -> None:
    t = make_trace(600)
    pca, nc = place(t, "pca"), place(t, "nocache")
    assert len(pca.ranges) < len(nc.ranges)  # segments are reused, tensors are not
    assert pca.peak_reserved_bytes >= nc.peak_reserved_bytes - 40 * MiB


def test_place_with_capacity_reports_oom_seq() -> None:
    t = make_trace(400)
    free_run = place(t, "pca")
    cap = free_run.peak_reserved_bytes // 2
    p = place(t, "pca", capacity_bytes=cap)
    assert p.oom_seq is not None
    assert p.peak_reserved_bytes <= cap
    assert p.stats["num_ooms"] == 1 and p.stats["num_alloc_retries"] >= 1
    assert len(p.blocks) < len(t.allocations)  # nothing placed after the OOM
    assert place(t, "pca", capacity_bytes=free_run.peak_reserved_bytes).oom_seq is None


def test_place_bad_allocator() -> None:
    with pytest.raises(InputError):
        place(make_trace(10), "magic")
