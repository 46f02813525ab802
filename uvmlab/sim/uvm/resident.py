"""Resident marks: a kernel's large access whose VA blocks are all GPU-resident is not listed block by block
(mixed into :class:`uvmlab.sim.uvm.driver.UvmSim`). A speed-up only: results are identical with it off.

``UvmSim.access`` lists a kernel's touched blocks per stage (reads, then writes) in first-touch order, and
``_run_stage`` visits each: a block whose every page is GPU-resident does nothing but end a pending run of the run
path. Most visits are to such blocks (GCN at 5M nodes: 3.2 of 3.9 million; Whisper-small x4, PCA on: 264 of 350
thousand per replay; line profiles, 2026-11-28).

An access of at least ``mark_min_blocks`` blocks, the only access of its stage to its range, whose blocks are all
resident when the kernel is listed, is listed as one :class:`ResidentMark`. When ``_run_stage`` reaches it, its
first block is visited as itself (that visit ends a pending run, whose evictions may take the mark's blocks). Then
the other blocks are skipped if no page has left the GPU since the listing, or if they are all still
fully resident; else they are visited one by one with the spans they would have had. If the first block has no
chunk after its visit, it was evicted since the listing and joined the run path's pending run, whose evictions are
not made yet: the other blocks are then always visited one by one (a fix of 2026-11-28: skipping them there made
AlexNet's in-place ``_foreach_addcdiv_`` at x1.25, PCA off, miss 19,093 of its 20,254 write faults).
No other access of the stage touches the mark's blocks, so their positions and spans are those of the
block-by-block listing.

Every call that takes pages off the GPU counts in ``_decreases`` and takes their ranges out of ``_full_ranges``, the
ranges once found entirely resident (which spares the block-by-block check).

Off once cudaMemAdvise state exists (``_pol_any``): the policy path of ``_run_stage`` acts on resident blocks too.
Discards and read duplication act outside ``_run_stage`` (``uvmlab.sim.uvm.hints``). Equality with marks off:
tests/test_uvm_resident_marks.py (random programs, the whole state compared).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK, VA_BLOCK_BYTES


@dataclass(frozen=True, slots=True)
class ResidentMark:
    """One access kept whole in a stage listing."""

    range_id: int
    p0: int
    p1: int
    """The range's pages [p0, p1) the access touches (``_page_span``)."""
    stamp: int
    """``_decreases`` at the listing."""


class ResidentMarks:
    """The marking half of UvmSim (uses its state: ranges, per-slot counts, ``_decreases``, ``_full_ranges``)."""

    resident_marks: ClassVar[bool] = True
    """Off: every access is listed block by block (tests compare both)."""
    mark_min_blocks: ClassVar[int] = 16
    """Accesses of fewer blocks are listed block by block: a mark's bookkeeping costs more than it saves (with 4,
    Whisper-small x4 replays took about 5 % longer, with 16 as long as without marks; GCN gains the same with either;
    2026-11-28)."""

    def _marks_for(self, accesses: list[tuple[int, int, int, bool]]) -> dict[int, ResidentMark] | None:
        """The accesses (by index) to keep as marks, or None when there are none."""
        if not self.resident_marks or self._pol_any is not None:  # advised blocks take the policy path, resident or not
            return None
        min_bytes = (self.mark_min_blocks - 1) * VA_BLOCK_BYTES
        if not any(a[2] > min_bytes for a in accesses):
            return None
        uses = Counter((a[3], a[0]) for a in accesses)  # accesses per (stage, range)
        marks: dict[int, ResidentMark] = {}
        for i, (rid, off, size, is_write) in enumerate(accesses):
            if size <= min_bytes or uses[is_write, rid] > 1:
                continue  # small, or another access of the stage may share its blocks (their spans merge)
            pages = self._page_span(int(rid), int(off), int(size))
            if pages is None:
                continue
            p0, p1 = pages
            b0, b1 = p0 // PAGES_PER_BLOCK, (p1 - 1) // PAGES_PER_BLOCK
            if b1 - b0 + 1 < self.mark_min_blocks:
                continue
            if (
                rid in self._full_ranges
                or self._resident(  # a range known entirely resident: no list to build
                    rid, self._ranges[rid][b0 : b1 + 1].tolist(), whole=b0 == 0 and b1 == len(self._ranges[rid]) - 1
                )
            ):
                marks[i] = ResidentMark(int(rid), p0, p1, self._decreases)
        return marks or None

    def _resident(self, rid: int, slots: list[int], whole: bool) -> bool:
        """Every page of ``slots`` (blocks of range ``rid``; ``whole``: all of them) is GPU-resident."""
        if rid in self._full_ranges:
            return True
        res_count, npages = self._res_count, self._npages
        last, first = slots[-1], slots[0]  # the ends first: where a check fails, the first miss is near an end
        # (GCN 10M with user prefetch: 8,987 failing checks, the median at 99.5 % of the range, 12.4 M blocks scanned)
        if res_count[last] < npages[last] or res_count[first] < npages[first]:
            return False
        if not all(res_count[s] >= npages[s] for s in slots):
            return False
        if whole:
            self._full_ranges.add(rid)
        return True

    def _count_decrease(self, slots: Iterable[int]) -> None:
        """Pages of ``slots`` leave the GPU (one call: one eviction, a run's evictions, a CPU migration): their ranges
        may no longer be entirely resident."""
        self._decreases += 1
        if self._full_ranges:
            self._full_ranges.difference_update(map(self._slot_range.__getitem__, slots))

    def _stage_items(self, touched: dict[int, Any]) -> Iterator[tuple[int, Any]]:
        """``touched.items()`` with each mark replaced (module docstring) when ``_run_stage`` reaches it: its first
        block as itself (visiting it ends a pending run, whose evictions may take the mark's blocks, unless the block
        itself joins that run), then the rest if the first block joined a pending run, or if pages left the GPU
        since the listing and these blocks are not all still resident."""
        for key, span in touched.items():
            if key >= 0:
                yield key, span
                continue
            rid = span.range_id
            b0, b1 = span.p0 // PAGES_PER_BLOCK, (span.p1 - 1) // PAGES_PER_BLOCK
            base = b0 * PAGES_PER_BLOCK
            first = int(self._ranges[rid][b0])
            yield first, (span.p0 - base, min(span.p1 - base, PAGES_PER_BLOCK))  # as listed
            if b1 == b0:
                continue  # no other block
            if self._has_chunk[first]:  # so its visit ended any pending run: the check below sees every eviction
                if span.stamp == self._decreases:
                    continue  # no page left the GPU since the listing
                if self._resident(rid, self._ranges[rid][b0 + 1 : b1 + 1].tolist(), False):
                    continue  # every other block of the mark is resident: visiting them would do nothing
            # else the first block (evicted since the listing) joined the run path's pending run, whose evictions
            # are not made yet and may take the other blocks: they are visited one by one, as without marks
            for s, lo, hi in self._blocks_of(rid, span.p0, span.p1)[1:]:
                yield s, (lo, hi)


__all__ = ["ResidentMark", "ResidentMarks"]
