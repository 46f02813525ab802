"""Replay a real PyTorch memory snapshot through CachingAllocatorSim and compare with what the GPU did.

``replay_snapshot(path)`` reads the snapshot with :func:`uvmlab.trace.snapshot.read_snapshot`, and for every
device with a trace:

1. **Initial state** (allocator.md 2.20). The trace ring buffer may start mid-run, so the state at its start is
   rebuilt from the final ``segments`` by undoing the trace backwards: segments ``segment_alloc``-ed in the trace
   are removed, ``segment_free``-d ones restored; blocks allocated in the trace are un-allocated, blocks freed
   in it re-allocated. The sizes of blocks freed in the trace but allocated before it are not recorded
   (``free_*`` entries carry the requested size). They are ``round_size(requested)`` plus, in the large pool
   (non-expandable), the unsplit slack PyTorch leaves when <= 1 MiB would remain: every free large-pool block is
   > 1 MiB, so a gap of <= 1 MiB after such a block belongs to it; and the first trace allocation that lands
   in the gap after such a block (before the block is freed) marks where the free block began, because
   allocations always take the lowest part of a free block (:func:`uvmlab.memory.replay_state.initial_state`). When the
   replay still diverges because the simulator took the free gap right after such a block, that block's slack
   is raised by the excess and the replay restarts (:func:`replay_device`).
2. **Replay.** ``alloc`` entries are replayed with ``malloc(requested size, stream)``; ``free_requested`` frees the
   block the real allocator put at that address. A ``segment_free``/``segment_unmap`` burst that the simulator
   did not produce itself is modelled as ``empty_cache()`` (release_cached_blocks: the same release rules as the
   OOM path). Device addresses of NEW segments come from the snapshot (the driver's placement is not modelled,
   see :mod:`uvmlab.sim.allocator.device`): the k-th simulated ``segment_alloc`` (or the VA reservation behind the k-th
   ``segment_map``) gets the address of the k-th real one if the sizes agree; everything else - which block
   serves which request, splits, merges, when segments are created and released - is the simulator's.
   An ``oom`` entry marks a malloc that failed on the GPU: the simulator (unlimited device) is not asked.
3. **Report**: % identical allocation addresses, identical segment event sequence (action, address, size),
   peak reserved and peak requested bytes (real values rebuilt from the trace), the final state compared block
   by block with the snapshot's segments, and the first divergence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError, OutOfMemoryError
from uvmlab.memory.replay_state import DeviceEvents, InitialState, device_events, initial_state
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.constants import K_MIN_BLOCK_SIZE_BYTES, K_SMALL_SIZE_BYTES
from uvmlab.sim.allocator.device import DeviceSim

MADE_UP_VA_GAP_BYTES = 2**40
"""Made-up addresses (new segments after a divergence) grow down from 1 TiB below the lowest real address of the
snapshot when that leaves room (>= 1 TiB), else from 64 TiB above the highest real one: never into real ones."""
MADE_UP_VA_ABOVE_BYTES = 2**46
CREATE_ACTIONS = ("segment_alloc", "segment_map")
RELEASE_ACTIONS = ("segment_free", "segment_unmap")
SEGMENT_ACTIONS = CREATE_ACTIONS + RELEASE_ACTIONS


@dataclass
class DeviceReplay:
    """Replay result of one device's trace (byte counts in bytes)."""

    device: int
    events: int
    allocs: int
    allocs_matched: int
    frees: int
    frees_unknown: int
    segment_events_real: int
    segment_events_sim: int
    segment_sequence_equal: bool
    segment_sizes_equal: bool
    release_bursts: int
    peak_reserved_real: int
    peak_reserved_sim: int
    peak_requested_real: int
    peak_requested_sim: int
    peak_allocated_sim: int
    final_reserved_real: int
    final_reserved_sim: int
    final_allocated_real: int
    final_allocated_sim: int
    final_blocks_equal: bool
    ooms_real: int
    ooms_sim: int
    capacity_bytes: int | None
    initial_segments: int
    initial_reserved: int
    initial_blocks_inferred: int
    first_divergence: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def address_match_pct(self) -> float:
        """Share of ``alloc`` entries that got the real address (100 when there are none)."""
        return 100.0 * self.allocs_matched / self.allocs if self.allocs else 100.0

    @property
    def identical(self) -> bool:
        """Every address, the segment sequence, peak reserved and the final blocks are identical."""
        return (
            self.allocs_matched == self.allocs
            and self.segment_sequence_equal
            and self.peak_reserved_real == self.peak_reserved_sim
            and self.peak_requested_real == self.peak_requested_sim
            and self.final_blocks_equal
            and self.frees_unknown == 0
            and (self.capacity_bytes is None or self.ooms_sim == self.ooms_real)
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready), with the derived fields."""
        d = asdict(self)
        d["address_match_pct"] = round(self.address_match_pct, 3)
        d["identical"] = self.identical
        return d


@dataclass
class ReplayReport:
    """Replay of a whole snapshot: one DeviceReplay per device with a trace."""

    path: str
    format_generation: str
    alloc_conf: str
    devices: list[DeviceReplay]

    @property
    def identical(self) -> bool:
        """True when every replayed device is identical."""
        return all(d.identical for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return {
            "path": self.path,
            "format_generation": self.format_generation,
            "alloc_conf": self.alloc_conf,
            "identical": self.identical,
            "devices": [d.to_dict() for d in self.devices],
        }


class _ActionCount:
    """How many entries of a growing ``segment_events`` list have an action in ``actions`` (counted incrementally,
    so asking after every event stays linear in the list's length)."""

    def __init__(self, actions: tuple[str, ...]):
        self.actions = actions
        self.seen = 0
        self.count = 0

    def __call__(self, events: list[tuple[Any, ...]]) -> int:
        if len(events) > self.seen:
            self.count += sum(1 for e in events[self.seen :] if e[1] in self.actions)
            self.seen = len(events)
        return self.count


class _Oracle:
    """Gives the k-th simulated segment creation the address of the k-th real one when the sizes agree."""

    def __init__(self, creations: list[tuple[int, str, int, int]], sim_ref: list[CachingAllocatorSim]):
        self.creations = creations  # (event index, action, addr, size)
        self.sim_ref = sim_ref
        self.created = _ActionCount(CREATE_ACTIONS)

    def __call__(self, kind: str, size: int) -> int | None:
        sim = self.sim_ref[0]
        k = self.created(sim.segment_events)
        if k >= len(self.creations):
            return None
        _, action, addr, real_size = self.creations[k]
        if kind == "malloc":
            if action != "segment_alloc" or real_size != size or sim.device.in_use(addr):
                return None
            return addr
        # "reserve": a new expandable segment; its VA base is where the next real mapping starts
        # (the simulated VA size, 9/8 of an assumed device size, may overlap the next real reservation: harmless,
        # the unmapped tail of a segment is never touched)
        if action != "segment_map" or addr in sim.expandable_segments:
            return None
        return addr


def _inferred_capacity(ev: DeviceEvents, init_reserved: int) -> int | None:
    """Bytes the device had for PyTorch at the first real OOM: reserved then + cudaMemGetInfo free (device_free)."""
    reserved = init_reserved
    for _, action, addr, size, _ in ev.events:
        if action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in RELEASE_ACTIONS:
            reserved -= size
        elif action == "oom":
            return reserved + addr if addr >= 0 else None
    return None


def _make_sim(
    settings: AllocatorSettings, ev: DeviceEvents, device: int, real_addresses: bool, capacity: int | None
) -> CachingAllocatorSim:
    creations = [(i, a, addr, size) for i, a, addr, size in ev.segment_events if a in CREATE_ACTIONS]
    ref: list[CachingAllocatorSim] = []
    real = [addr for _, _, addr, _ in ev.segment_events] + [s[0] for s in ev.final_segments] or [0]
    lowest, highest = min(real), max(real) + max([s[1] for s in ev.final_segments] + [0])
    if lowest >= 2 * MADE_UP_VA_GAP_BYTES:
        va_top = lowest - MADE_UP_VA_GAP_BYTES
    else:
        va_top = highest + MADE_UP_VA_ABOVE_BYTES
    oracle = _Oracle(creations, ref) if real_addresses else None
    dev = DeviceSim(capacity, va_top=va_top, oracle=oracle)
    sim = CachingAllocatorSim(settings, dev, device_index=device)
    ref.append(sim)
    return sim


def replay_device(
    ev: DeviceEvents,
    settings: AllocatorSettings,
    device: int = 0,
    real_addresses: bool = True,
    infer_capacity: bool = True,
) -> DeviceReplay:
    """Replay one device's events (see the module docstring).

    ``real_addresses=False`` gives new segments made-up addresses (what a CPU-only simulation of a new workload
    has to do): allocation addresses then differ, but segment sizes and peaks can still be compared.
    ``infer_capacity``: when the trace has an ``oom`` entry, the device gets the capacity PyTorch had then
    (reserved + device_free at the OOM) and the simulator must decide the OOM itself: release what the real
    allocator released (its OOM path, not an emulated empty_cache), then fail the same request.
    """
    extra: dict[int, int] = {}
    for _ in range(MAX_SLACK_REPAIRS + 1):
        init = initial_state(ev, settings, extra)
        result, blame = _replay_once(ev, settings, device, real_addresses, infer_capacity, init)
        if blame is None:
            break
        ptr, need = blame
        if extra.get(ptr, 0) + need > K_SMALL_SIZE_BYTES:  # larger slack would have been split off
            break
        extra[ptr] = extra.get(ptr, 0) + need
    if extra:
        result.notes.insert(
            0,
            f"{len(extra)} pre-trace block size(s) refined from replay divergences (the trace did not record them)",
        )
    return result


MAX_SLACK_REPAIRS = 32
"""Replays retried with refined pre-trace block sizes (allocator.md 2.20: the ring buffer drops them)."""


def _replay_once(
    ev: DeviceEvents,
    settings: AllocatorSettings,
    device: int,
    real_addresses: bool,
    infer_capacity: bool,
    init: InitialState,
) -> tuple[DeviceReplay, tuple[int, int] | None]:
    """One replay from ``init``; the second value names a pre-trace block whose slack explains the first
    divergence (ptr, slack bytes) when there is one: the simulator took the free gap right after a block of
    unknown size, while the real allocator did not, so that gap must have been smaller by at least the excess."""
    blame: tuple[int, int] | None = None
    capacity = _inferred_capacity(ev, init.reserved_bytes) if infer_capacity else None
    sim = _make_sim(settings, ev, device, real_addresses, capacity)
    real2block: dict[int, Any] = {}
    for seg in init.segments:
        blocks = sim.seed_segment(seg.address, seg.size, seg.stream, seg.small, seg.allocated)
        for b in blocks:
            real2block[b.ptr] = b
    sim.segment_events.clear()
    allocs = matched = frees = unknown = bursts = ooms = 0
    real_released = 0
    sim_released = _ActionCount(RELEASE_ACTIONS)
    first: dict[str, Any] | None = None
    notes = list(init.notes)
    requested = init.requested_bytes
    peak_requested = requested
    events = ev.events
    for pos, (idx, action, addr, size, stream) in enumerate(events):
        if action == "alloc":
            allocs += 1
            requested += size
            peak_requested = max(peak_requested, requested)
            try:
                b = sim.malloc(size, stream)
            except OutOfMemoryError:
                first = first or {"event": idx, "action": action, "expected": addr, "got": "OOM"}
                continue
            if b.ptr == addr:
                matched += 1
            elif first is None:
                first = {"event": idx, "action": "alloc", "size": size, "expected": addr, "got": b.ptr}
                owner = init.ambiguous.get(b.ptr)
                if owner is not None:
                    nxt = b.next
                    found = b.size + (nxt.size if nxt is not None and not nxt.allocated and nxt.mapped else 0)
                    need = found - sim.round_size(size) + K_MIN_BLOCK_SIZE_BYTES
                    if 0 < need <= K_SMALL_SIZE_BYTES:
                        blame = (owner, need)
            if addr in real2block:
                notes.append(f"event {idx}: alloc at {addr:#x} which is still allocated in the real trace")
            real2block[addr] = b
        elif action == "free_requested":
            frees += 1
            b = real2block.pop(addr, None)
            if b is None:
                unknown += 1
                if first is None:
                    first = {"event": idx, "action": action, "expected": addr, "got": "no such allocation"}
                continue
            requested -= b.requested_size
            sim.free(b)
        elif action in RELEASE_ACTIONS:
            real_released += 1
            if sim_released(sim.segment_events) < real_released and not (
                capacity is not None and _oom_path_burst(events, pos)
            ):
                bursts += 1
                sim.empty_cache()
        elif action == "oom":
            ooms += 1
            if capacity is not None:
                try:
                    b = sim.malloc(size, stream)
                except OutOfMemoryError:
                    continue
                sim.free(b)
                if first is None:
                    first = {"event": idx, "action": "oom", "expected": "OOM", "got": b.ptr}
    sim.check_invariants()
    real_seq = [(a, addr, size) for _, a, addr, size in ev.segment_events]
    sim_seq = [(a, addr, size) for _, a, addr, size, _ in sim.segment_events]
    seq_equal = real_seq == sim_seq
    if not seq_equal:
        k = next(
            (i for i, (r, s) in enumerate(zip(real_seq, sim_seq, strict=False)) if r != s),
            min(len(real_seq), len(sim_seq)),
        )
        where = ev.segment_events[k][0] if k < len(ev.segment_events) else (ev.events[-1][0] if ev.events else 0)
        d = {
            "event": where,
            "action": "segment sequence",
            "expected": list(real_seq[k]) if k < len(real_seq) else None,
            "got": list(sim_seq[k]) if k < len(sim_seq) else None,
        }
        if first is None or where < first["event"]:
            first = d
    peak_real = max([init.reserved_bytes, *ev.reserved_after()])
    final_real = {(a, s, alloc) for a, s, alloc in ev.final_blocks}
    final_sim = {(b.ptr, b.size, b.allocated) for b in sim.all_blocks() if b.mapped}
    blocks_equal = final_real == final_sim
    if not blocks_equal:
        diff = sorted(final_real ^ final_sim)[:3]
        notes.append(f"final blocks differ ({len(final_real ^ final_sim)} differences), e.g. {diff}")
    result = DeviceReplay(
        device=device,
        events=len(ev.events),
        allocs=allocs,
        allocs_matched=matched,
        frees=frees,
        frees_unknown=unknown,
        segment_events_real=len(real_seq),
        segment_events_sim=len(sim_seq),
        segment_sequence_equal=seq_equal,
        segment_sizes_equal=[(a, n) for a, _, n in real_seq] == [(a, n) for a, _, n in sim_seq],
        release_bursts=bursts,
        peak_reserved_real=peak_real,
        peak_reserved_sim=sim.peak_reserved_bytes,
        peak_requested_real=peak_requested,
        peak_requested_sim=sim.peak_requested_bytes,
        peak_allocated_sim=sim.peak_allocated_bytes,
        final_reserved_real=sum(s[1] for s in ev.final_segments),
        final_reserved_sim=sim.reserved_bytes,
        final_allocated_real=sum(s for _, s, alloc in ev.final_blocks if alloc),
        final_allocated_sim=sim.allocated_bytes,
        final_blocks_equal=blocks_equal,
        ooms_real=ooms,
        ooms_sim=sim.num_ooms,
        capacity_bytes=capacity,
        initial_segments=len(init.segments),
        initial_reserved=init.reserved_bytes,
        initial_blocks_inferred=init.inferred_blocks,
        first_divergence=first,
        notes=notes[:20],
    )
    return result, blame


def _oom_path_burst(events: list, pos: int) -> bool:
    """A release burst the allocator's OOM path makes: followed by a new segment or by an ``oom`` entry."""
    n = len(events)
    while pos < n and events[pos][1] in RELEASE_ACTIONS:
        pos += 1
    return pos < n and events[pos][1] in ("oom", *CREATE_ACTIONS)


def replay_snapshot(
    path: str | Path,
    device: int | None = None,
    alloc_conf: str | None = None,
    real_addresses: bool = True,
    infer_capacity: bool = True,
    **settings_extra: Any,
) -> ReplayReport:
    """Replay every device with a trace (or only ``device``); ``alloc_conf`` overrides the snapshot's settings;
    ``settings_extra`` sets AllocatorSettings fields such as ``tie_break``."""
    from uvmlab.trace.snapshot import read_snapshot

    snap = read_snapshot(path)
    if alloc_conf is not None:
        settings = AllocatorSettings.parse(alloc_conf, **settings_extra)
    else:
        settings = AllocatorSettings.from_snapshot(snap.allocator_settings, **settings_extra)
    ev = snap.events
    replayable = ev[ev["action"].isin(["alloc", "free_requested", *SEGMENT_ACTIONS])]
    traced = sorted({int(d) for d in replayable["device"].unique()})
    if device is not None:
        if device not in snap.devices:
            raise InputError(f"{path}: device {device} is not in the snapshot (devices: {snap.devices})")
        traced = [d for d in traced if d == device]
    if not traced:
        raise InputError(
            f"{path}: the snapshot has no alloc/free trace to replay"
            + (f" for device {device}" if device is not None else "")
            + " (record it with torch.cuda.memory._record_memory_history() before _dump_snapshot())"
        )
    results = [replay_device(device_events(snap, d), settings, d, real_addresses, infer_capacity) for d in traced]
    return ReplayReport(str(path), snap.format_generation, settings.raw, results)
