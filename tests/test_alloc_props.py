"""Hypothesis state machines: allocator invariants hold after every malloc/free/empty_cache step.

check_invariants() verifies: blocks tile each segment (no gap, no overlap), free blocks sit in the right pool
under their (stream, size, tie) key, no two adjacent free blocks stay unmerged, allocated <= reserved, and the
stats equal sums over blocks. The machine additionally checks that live blocks never overlap across segments
and that every free returns the block's bytes to the pool.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from uvmlab.errors import OutOfMemoryError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.nocache import NoCacheAllocatorSim

MiB = 1 << 20
SIZES = st.one_of(
    st.integers(1, MiB),  # small pool
    st.integers(MiB + 1, 10 * MiB),  # 20 MiB segments
    st.integers(10 * MiB, 80 * MiB),  # rounded-to-2-MiB segments, over-size with max_split
)
RUN = settings(max_examples=25, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_machine(conf: str, capacity: int | None, nocache: bool = False, **extra):
    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            dev = DeviceSim(capacity)
            if nocache:
                self.a = NoCacheAllocatorSim(dev)
            else:
                self.a = CachingAllocatorSim(AllocatorSettings.parse(conf, **extra), dev)
            self.live: list = []

        @rule(size=SIZES, stream=st.sampled_from([0, 0, 0, 7]))
        def malloc(self, size: int, stream: int) -> None:
            before = self.a.allocated_bytes
            try:
                b = self.a.malloc(size, stream)
            except OutOfMemoryError:
                assert capacity is not None  # only a bounded device can run out
                return
            assert b.size >= size and b.allocated and b.stream == stream
            assert self.a.allocated_bytes == before + b.size
            self.live.append(b)

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 10**6))
        def free(self, i: int) -> None:
            b = self.live.pop(i % len(self.live))
            before, size = self.a.allocated_bytes, b.size
            self.a.free(b)
            assert self.a.allocated_bytes == before - size  # the block's bytes went back

        @rule()
        def empty_cache(self) -> None:
            self.a.empty_cache()
            if not nocache and not self.live:
                assert self.a.reserved_bytes == 0  # nothing allocated: every segment (page) is released

        @invariant()
        def invariants(self) -> None:
            self.a.check_invariants()
            assert self.a.reserved_bytes >= self.a.allocated_bytes
            spans = sorted((b.ptr, b.ptr + b.size) for b in self.live)
            assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans)), "live blocks overlap"

    return AllocatorMachine


TestDefault = make_machine("", None).TestCase
TestDefault.settings = RUN
TestBoundedDevice = make_machine("", 200 * MiB).TestCase
TestBoundedDevice.settings = RUN
TestMaxSplitDivisions = make_machine("max_split_size_mb:40,roundup_power2_divisions:[2:4,>:8]", 300 * MiB).TestCase
TestMaxSplitDivisions.settings = RUN
TestGcFraction = make_machine("garbage_collection_threshold:0.6", 400 * MiB, memory_fraction=0.5).TestCase
TestGcFraction.settings = RUN
TestExpandable = make_machine("expandable_segments:True", 250 * MiB).TestCase
TestExpandable.settings = RUN
TestBlockCounter = make_machine("", None, tie_break="block_counter").TestCase
TestBlockCounter.settings = RUN
TestNoCache = make_machine("", 150 * MiB, nocache=True).TestCase
TestNoCache.settings = RUN
