"""Invariant checks of CachingAllocatorSim (kept apart so the allocator module stays small)."""

from __future__ import annotations

from collections import defaultdict

from uvmlab.errors import InvariantError
from uvmlab.sim.allocator.blocks import Block, Segment

_DUMP_SEGMENTS = 8
_DUMP_BLOCKS = 12


class InvariantChecks:
    """CachingAllocatorSim's invariant check (a mixin)."""

    def _dump_state(self, groups: dict[Segment, list[Block]]) -> str:
        lines = [
            f"allocated={self.allocated_bytes} reserved={self.reserved_bytes} active={self.active_bytes} "
            f"segments={self.segment} free(small/large)={len(self.small_pool)}/{len(self.large_pool)}"
        ]
        for seg in sorted(groups, key=lambda s: s.address)[:_DUMP_SEGMENTS]:
            blocks = sorted(groups[seg], key=lambda b: b.ptr)
            shown = " ".join(repr(b) for b in blocks[:_DUMP_BLOCKS])
            more = f" ... (+{len(blocks) - _DUMP_BLOCKS})" if len(blocks) > _DUMP_BLOCKS else ""
            lines.append(f"  {seg!r}: {shown}{more}")
        if len(groups) > _DUMP_SEGMENTS:
            lines.append(f"  ... {len(groups) - _DUMP_SEGMENTS} more segments")
        return "\n".join(lines)

    def check_invariants(self) -> None:
        """Blocks tile each segment; free blocks sit in the right pool under the right key; no two adjacent free
        blocks PyTorch would merge; allocated <= reserved; stats equal sums over blocks."""
        problems: list[str] = []
        groups: dict[Segment, list[Block]] = defaultdict(list)
        blocks = self.all_blocks()
        for b in blocks:
            groups[b.segment].append(b)
        live = set(self.segments.values()) | set(self.expandable_segments.values())
        for seg in groups:
            if seg not in live:
                problems.append(f"{seg!r} holds blocks but is not a live segment")
        for seg in live:
            if seg not in groups:
                problems.append(f"{seg!r} has no blocks")
        mapped_total = 0
        for seg, bl in groups.items():
            heads = [b for b in bl if b.prev is None]
            if len(heads) != 1:
                problems.append(f"{seg!r} has {len(heads)} head blocks")
                continue
            b, pos, n, mapped = heads[0], seg.address, 0, 0
            while b is not None:
                if b.ptr != pos:
                    problems.append(f"{seg!r}: {b!r} starts at {b.ptr:#x}, expected {pos:#x} (gap or overlap)")
                    break
                if b.size <= 0:
                    problems.append(f"{seg!r}: {b!r} has no size")
                if b.segment is not seg:
                    problems.append(f"{b!r} linked into the wrong segment")
                nxt = b.next
                if nxt is not None and nxt.prev is not b:
                    problems.append(f"{seg!r}: broken prev link at {nxt!r}")
                if nxt is not None and not b.allocated and not nxt.allocated and b.mapped == nxt.mapped:
                    problems.append(f"{seg!r}: adjacent unmerged free blocks {b!r} {nxt!r}")
                if b.mapped:
                    mapped += b.size
                elif not seg.expandable:
                    problems.append(f"{b!r} is unmapped in a non-expandable segment")
                pos += b.size
                n += 1
                b = nxt
            if pos != seg.address + seg.size and not problems:
                problems.append(f"{seg!r}: blocks cover {pos - seg.address} B of {seg.size} B")
            if n != len(bl):
                problems.append(f"{seg!r}: {len(bl)} blocks known, {n} linked")
            if seg.expandable:
                if mapped != seg.mapped_bytes:
                    problems.append(f"{seg!r}: mapped blocks {mapped} B != mapped pages {seg.mapped_bytes} B")
                mapped_total += mapped
            else:
                mapped_total += seg.size
        for pool in (self.small_pool, self.large_pool):
            n_keys = sum(len(sl) for sl in pool.blocks.values())
            if n_keys != len(pool.by_key):
                problems.append(f"{'small' if pool.small else 'large'} pool: {n_keys} keys, {len(pool.by_key)} blocks")
            for stream, sl in pool.blocks.items():
                for key in sl:
                    b = pool.by_key.get(key)
                    if b is None or b.stream != stream or b.key != key or key != self._key(b):
                        problems.append(f"pool entry {key:#x} on stream {stream} does not match its block {b!r}")
                    elif b.allocated or not b.mapped or b.segment.small != pool.small:
                        problems.append(f"{b!r} is in the wrong pool")
            for ptr, b in pool.unmapped_by_ptr.items():
                if b.mapped or b.allocated or b.ptr != ptr or b.segment.small != pool.small:
                    problems.append(f"unmapped entry {ptr:#x} does not match {b!r}")
        for ptr, b in self.active_blocks.items():
            if not b.allocated or b.ptr != ptr or not b.mapped:
                problems.append(f"active entry {ptr:#x} does not match {b!r}")
        alloc = sum(b.size for b in self.active_blocks.values())
        req = sum(b.requested_size for b in self.active_blocks.values())
        expected = {
            "allocated_bytes": alloc,
            "requested_bytes": req,
            "allocation": len(self.active_blocks),
            "reserved_bytes": mapped_total,
            "segment": len(self.segments),
        }
        for name, want in expected.items():
            got = getattr(self, name)
            if got != want:
                problems.append(f"stat {name}={got} but the blocks sum to {want}")
            if getattr(self, f"peak_{name}") < got:
                problems.append(f"peak {name} below current")
        if self.allocated_bytes > self.reserved_bytes:
            problems.append(f"allocated {self.allocated_bytes} > reserved {self.reserved_bytes}")
        if self.device.used_bytes < self.reserved_bytes:
            problems.append(f"device holds {self.device.used_bytes} B < reserved {self.reserved_bytes} B")
        if problems:
            shown = "; ".join(problems[:5]) + (f"; ... {len(problems) - 5} more" if len(problems) > 5 else "")
            raise InvariantError(f"caching allocator invariant broken: {shown}\n{self._dump_state(groups)}")
