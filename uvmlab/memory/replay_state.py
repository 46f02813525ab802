"""The inputs of a snapshot replay: one device's events as plain tuples, and the rebuilt initial state.

See :mod:`uvmlab.memory.replay` for what is inferred and why. Torch-free; no pandas on the per-event path (the tables
of :class:`~uvmlab.trace.snapshot.Snapshot` are turned into lists once).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from uvmlab.errors import InputError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.constants import K_SMALL_BUFFER_BYTES, K_SMALL_SIZE_BYTES
from uvmlab.sim.allocator.rounding import round_size

RESERVE_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass
class DeviceEvents:
    """One device of a snapshot: trace events and final segments/blocks as plain tuples."""

    device: int
    events: list[tuple[int, str, int, int, int]]  # (index, action, addr, size, stream); oom: addr = device_free
    segment_events: list[tuple[int, str, int, int]]  # (index, action, addr, size)
    final_segments: list[tuple[int, int, int, bool, bool]]  # (address, total_size, stream, small, expandable)
    final_blocks: list[tuple[int, int, bool]]  # (address, size, allocated)
    final_requested: dict[int, int]  # allocated block address -> requested size

    def reserved_after(self) -> list[int]:
        """Real reserved bytes after each segment event (starting from the rebuilt start value)."""
        start = sum(s[1] for s in self.final_segments) - sum(RESERVE_SIGN[a] * n for _, a, _, n in self.segment_events)
        out, cur = [], start
        for _, a, _, n in self.segment_events:
            cur += RESERVE_SIGN[a] * n
            out.append(cur)
        return out


@dataclass
class SeedSegment:
    """A segment present when the trace starts, with its allocated blocks (ptr, block size, requested size)."""

    address: int
    size: int
    stream: int
    small: bool
    allocated: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class InitialState:
    """State of the allocator when the trace starts."""

    segments: list[SeedSegment]
    reserved_bytes: int
    requested_bytes: int
    inferred_blocks: int
    notes: list[str]
    ambiguous: dict[int, int] = field(default_factory=dict)  # gap start -> ptr of the pre-trace block before it


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def device_events(snap: Any, device: int) -> DeviceEvents:
    """Extract one device's events and final state from a :class:`~uvmlab.trace.snapshot.Snapshot`."""
    ev = snap.events[snap.events["device"] == device].sort_values("index")
    events = []
    for idx, action, addr, size, stream, dfree in zip(
        ev["index"].tolist(),
        ev["action"].tolist(),
        ev["address"].tolist(),
        ev["size"].tolist(),
        ev["stream"].tolist(),
        ev["device_free"].tolist(),
        strict=True,
    ):
        a = _int(dfree, -1) if action == "oom" else _int(addr, -1)
        events.append((int(idx), str(action), a, int(size), int(stream)))
    seg_events = [(i, a, addr, size) for i, a, addr, size, _ in events if a in RESERVE_SIGN]
    segs = snap.segments[snap.segments["device"] == device]
    final_segments = [
        (int(a), int(t), _int(s), str(st) == "small" if st is not None else int(t) == K_SMALL_BUFFER_BYTES, bool(e))
        for a, t, s, st, e in zip(
            segs["address"].tolist(),
            segs["total_size"].tolist(),
            segs["stream"].tolist(),
            segs["segment_type"].tolist(),
            segs["is_expandable"].fillna(False).tolist(),
            strict=True,
        )
    ]
    bl = snap.blocks[snap.blocks["device"] == device]
    final_blocks, final_req = [], {}
    for a, s, r, st in zip(
        bl["address"].tolist(), bl["size"].tolist(), bl["requested_size"].tolist(), bl["state"], strict=True
    ):
        alloc = st in ("active_allocated", "active_pending_free")
        final_blocks.append((int(a), int(s), alloc))
        if alloc:
            final_req[int(a)] = _int(r)
    return DeviceEvents(device, events, seg_events, final_segments, final_blocks, final_req)


def initial_state(
    ev: DeviceEvents, settings: AllocatorSettings, extra_slack: dict[int, int] | None = None
) -> InitialState:
    """Undo the trace on the final state (allocator.md 2.20), inferring the sizes of blocks freed in the trace.

    ``extra_slack`` (block ptr -> bytes) adds slack to blocks whose size the trace did not pin down (the replay
    learns it from a divergence, see :func:`uvmlab.memory.replay.replay_device`); ``ambiguous`` in the result names
    them.
    """
    extra_slack = extra_slack or {}
    notes: list[str] = []
    divisions = settings.roundup_power2_divisions if any(settings.roundup_power2_divisions) else None
    expandable = any(s[4] for s in ev.final_segments) or any(
        a in ("segment_map", "segment_unmap") for _, a, _, _ in ev.segment_events
    )
    segs: dict[int, tuple[int, int, bool]] = {a: (t, s, sm) for a, t, s, sm, _ in ev.final_segments}
    sizes = {a: s for a, s, alloc in ev.final_blocks if alloc}
    allocated: dict[int, tuple[int | None, int]] = {a: (sizes[a], r) for a, r in ev.final_requested.items()}
    free_index: dict[int, int] = {}
    for idx, action, addr, size, stream in reversed(ev.events):
        if action == "segment_alloc":
            if segs.pop(addr, None) is None:
                raise InputError(f"trace event {idx}: segment_alloc at {addr:#x} has no matching segment")
        elif action == "segment_free":
            segs[addr] = (size, stream, size == K_SMALL_BUFFER_BYTES)
        elif action == "alloc":
            allocated.pop(addr, None)
        elif action == "free_requested":
            allocated[addr] = (None, size)
            free_index[addr] = idx
    reserved = sum(RESERVE_SIGN[a] * -n for _, a, _, n in ev.segment_events) + sum(s[1] for s in ev.final_segments)
    if expandable:
        if reserved != 0 or allocated:
            notes.append(
                "expandable segments held memory before the trace started; that state is not rebuilt (replay starts"
                " empty)"
            )
        return InitialState([], 0, 0, 0, notes)
    starts = sorted(segs)
    seeds = {a: SeedSegment(a, segs[a][0], segs[a][1], segs[a][2]) for a in starts}
    unknown: list[tuple[int, int]] = []
    for addr, (bsize, req) in allocated.items():
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= starts[i] + segs[starts[i]][0]:
            raise InputError(f"block {addr:#x} allocated at the start of the trace lies in no segment")
        seed = seeds[starts[i]]
        if bsize is None:
            bsize = round_size(req, divisions, settings.roundup_bypass_threshold_bytes)
            unknown.append((addr, seed.address))
        seed.allocated.append((addr, bsize, req))
    # slack of unknown-size large-pool blocks (every free large-pool block is > 1 MiB)
    alloc_addrs = [(i, a) for i, act, a, _, _ in ev.events if act == "alloc"]
    ambiguous: dict[int, int] = {}
    for addr, seg_addr in unknown:
        seed = seeds[seg_addr]
        if seed.small:
            continue
        seed.allocated.sort()
        j = next(k for k, b in enumerate(seed.allocated) if b[0] == addr)
        ptr, bsize, req = seed.allocated[j]
        if settings.max_split_set and bsize >= settings.max_split_size_bytes:
            # an over-size request is never split: it holds a whole segment (a fresh one, or a cached whole
            # segment within the max_non_split_rounding slack; free over-size blocks are always whole segments)
            if ptr == seed.address and len(seed.allocated) == 1:
                seed.allocated[j] = (ptr, seed.size, req)
            continue
        end = ptr + bsize
        nxt = seed.allocated[j + 1][0] if j + 1 < len(seed.allocated) else seed.address + seed.size
        gap = nxt - end
        slack = 0
        if 0 < gap <= K_SMALL_SIZE_BYTES:
            slack = gap
        elif gap > K_SMALL_SIZE_BYTES:
            until = free_index.get(addr, len(ev.events) + 1)  # never freed in the trace: the whole trace
            x = next((a for i, a in alloc_addrs if i < until and end <= a < nxt), None)
            if x is not None and 0 < x - end <= K_SMALL_SIZE_BYTES:
                slack = x - end
            elif x is None:
                slack = min(extra_slack.get(ptr, 0), gap)
                ambiguous[end + slack] = ptr
        if slack:
            seed.allocated[j] = (ptr, bsize + slack, req)
    for seed in seeds.values():
        seed.allocated.sort()
    requested = sum(r for _, r in allocated.values())
    return InitialState(list(seeds.values()), reserved, requested, len(unknown), notes, ambiguous)
