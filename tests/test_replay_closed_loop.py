"""Closed loop: a simulated run, written as a PyTorch snapshot, replays identically through ``uvmlab replay``.

This exercises what the real snapshots do not cover (several streams, max_split_size_mb,
roundup_power2_divisions, expandable segments with empty_cache) and the initial-state reconstruction: keeping
only the last N trace entries imitates PyTorch's ring buffer (``max_entries``), so the replay must rebuild the
state at the start of the kept trace from the final segments.
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uvmlab.memory.replay import replay_snapshot
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.trace.snapshot import write_snapshot

MiB = 1 << 20
CONFS = ["", "max_split_size_mb:40,roundup_power2_divisions:[2:4,>:8]", "roundup_power2_divisions:8"]


def simulated_snapshot(path: Path, conf: str, seed: int, n: int, keep: int | None) -> Path:
    rng = random.Random(seed)
    s = AllocatorSettings.parse(conf)
    a = CachingAllocatorSim(s, record_events=True)
    live = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5 or not live:
            size = rng.choice([rng.randint(1, MiB), rng.randint(MiB, 10 * MiB), rng.randint(10 * MiB, 120 * MiB)])
            live.append(a.malloc(size, rng.choice((0, 0, 3))))
        elif r < 0.995:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache()
    a.check_invariants()
    segments, traces = a.to_snapshot_dicts()
    if keep is not None:
        traces = [traces[0][-keep:]]
    return write_snapshot(path, segments, traces, allocator_settings=s.to_snapshot())


RUN = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@RUN
@given(seed=st.integers(0, 10**6), conf=st.sampled_from([*CONFS, "expandable_segments:True"]))
def test_full_trace_replays_identically(tmp_path: Path, seed: int, conf: str) -> None:
    report = replay_snapshot(simulated_snapshot(tmp_path / f"full{seed}.pickle", conf, seed, 1200, None))
    d = report.devices[0]
    assert report.identical, (d.first_divergence, d.notes)
    assert d.initial_segments == 0


@RUN
@given(seed=st.integers(0, 10**6), conf=st.sampled_from(CONFS), keep=st.sampled_from([150, 600, 1500]))
def test_ring_buffer_trace_replays_identically(tmp_path: Path, seed: int, conf: str, keep: int) -> None:
    report = replay_snapshot(simulated_snapshot(tmp_path / f"ring{seed}.pickle", conf, seed, 2000, keep))
    d = report.devices[0]
    assert report.identical, (d.first_divergence, d.notes)
