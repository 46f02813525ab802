"""A block's CPU chunks are allocated once, at its first CPU population (uvmlab.sim.uvm.driver.UvmSim._cpu_alloc_ns):
an eviction, a CPU fault or a CPU first touch. Each new chunk is DMA-mapped for the GPU when the block has GPU state
(``cpu_chunk_map_ns``: 512 page chunks before R530, one block chunk from R530) and allocated zeroed when a page of
its region is resident nowhere (a fresh page before R530, the whole 2 MiB chunk from R530); chunks live until the
block is destroyed, so later evictions and faults pay neither."""

from __future__ import annotations

import pytest

from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.timing import CostParams

GPU = GPUS["A100-80GB"]
GPU_525 = GPU.with_driver("525.105.17")
MAP = 500.0
CHUNKS = {"R525": PAGES_PER_BLOCK, "R575": 1}
DRIVERS = pytest.mark.parametrize(("gpu", "name"), [(GPU_525, "R525"), (GPU, "R575")], ids=["R525", "R575"])


def _costs(map_ns: float = MAP, host_zero: float = 10e9) -> CostParams:
    return CostParams(cpu_chunk_map_ns=map_ns, cpu_unmap_chunk_ns=0.0, host_zero_bytes_per_s=host_zero)


def _ping_pong_stalls(gpu: GpuSpec, costs: CostParams, pages: int = PAGES_PER_BLOCK) -> list[float]:
    """Two one-block ranges on a GPU that holds one block: the GPU writes ``pages`` pages of each in turn, five
    times, so every write after the first evicts the other range's block."""
    sim = UvmSim(VA_BLOCK_BYTES, UvmKnobs(), costs, gpu)
    sim.map_range(0, VA_BLOCK_BYTES)
    sim.map_range(1, VA_BLOCK_BYTES)
    stalls = [float(sim.access([(i % 2, 0, pages * PAGE_BYTES, True)]).stall_ns) for i in range(5)]
    sim.check_invariants()  # every CPU-resident page holds a CPU chunk
    return stalls


@DRIVERS
def test_a_blocks_first_eviction_maps_its_new_cpu_chunks_for_the_gpu_and_later_ones_do_not(
    gpu: GpuSpec, name: str
) -> None:
    with_map = _ping_pong_stalls(gpu, _costs())
    without = _ping_pong_stalls(gpu, _costs(map_ns=0.0))
    extra = [a - b for a, b in zip(with_map, without, strict=True)]
    assert extra[0] == pytest.approx(0.0)  # nothing evicted
    assert extra[1] == pytest.approx(CHUNKS[name] * MAP)  # range 0's first eviction
    assert extra[2] == pytest.approx(CHUNKS[name] * MAP)  # range 1's first eviction
    assert extra[3:] == pytest.approx([0.0, 0.0])  # their chunks live on


@DRIVERS
def test_a_whole_block_evicted_is_not_zeroed(gpu: GpuSpec, name: str) -> None:
    """Every page of the block resident on the GPU: the chunk is allocated without ``__GFP_ZERO``."""
    assert _ping_pong_stalls(gpu, _costs(host_zero=1e9)) == pytest.approx(_ping_pong_stalls(gpu, _costs()))


def test_from_r530_a_part_resident_block_evicted_zeroes_its_whole_2mib_chunk() -> None:
    """Four pages on the GPU, the rest resident nowhere: ``block_populate_pages_cpu`` allocates the block's 2 MiB
    chunk zeroed, once; before R530 the four page chunks are not zeroed (each page is resident on the GPU)."""
    slow = _ping_pong_stalls(GPU, _costs(host_zero=1e9), pages=4)
    fast = _ping_pong_stalls(GPU, _costs(), pages=4)
    zero_ns = VA_BLOCK_BYTES / 1e9 * 1e9 - VA_BLOCK_BYTES / 10e9 * 1e9
    assert [a - b for a, b in zip(slow, fast, strict=True)] == pytest.approx([0.0, zero_ns, zero_ns, 0.0, 0.0])
    old = [a - b for a, b in zip(_ping_pong_stalls(GPU_525, _costs(host_zero=1e9), pages=4),
                                 _ping_pong_stalls(GPU_525, _costs(), pages=4), strict=True)]  # fmt: skip
    assert old == pytest.approx([0.0] * 5)


@DRIVERS
def test_host_first_touches_are_zeroed_per_cpu_chunk(gpu: GpuSpec, name: str) -> None:
    """A host write of one page of a fresh block populates the 64 KiB around it (the CPU fault's prefetch, module
    uvmlab.sim.uvm.host): before R530 its 16 page chunks are zeroed, and so are the next write's 16 elsewhere in
    the block; from R530 the block's 2 MiB chunk is, once, and the next write finds it allocated and zeroed."""
    stalls = {}
    for rate in (1e9, 10e9):
        sim = UvmSim(8 * VA_BLOCK_BYTES, UvmKnobs(), _costs(host_zero=rate), gpu)
        sim.map_range(0, VA_BLOCK_BYTES)
        stalls[rate] = [float(sim.host_write(0, p * PAGE_BYTES, PAGE_BYTES).stall_ns) for p in (0, 100)]
    zeroed = 16 * PAGE_BYTES if name == "R525" else VA_BLOCK_BYTES
    second = 16 * PAGE_BYTES if name == "R525" else 0
    per_byte = 1 / 1e9 * 1e9 - 1 / 10e9 * 1e9
    got = [a - b for a, b in zip(stalls[1e9], stalls[10e9], strict=True)]
    assert got == pytest.approx([zeroed * per_byte, second * per_byte])


@DRIVERS
def test_a_cpu_read_of_gpu_written_data_allocates_its_chunks_once(gpu: GpuSpec, name: str) -> None:
    """Issue 41's re-fault loop (the GPU writes, the CPU reads, again): the first CPU fault migration allocates the
    block's chunks and maps them for the GPU; the next round's CPU read finds them."""
    reads = {}
    for map_ns in (MAP, 0.0):
        sim = UvmSim(8 * VA_BLOCK_BYTES, UvmKnobs(), _costs(map_ns=map_ns), gpu)
        sim.map_range(0, VA_BLOCK_BYTES)
        out = []
        for _ in range(2):
            sim.access([(0, 0, VA_BLOCK_BYTES, True)])
            out.append(float(sim.host_read(0, 0, VA_BLOCK_BYTES).stall_ns))
        reads[map_ns] = out
    got = [a - b for a, b in zip(reads[MAP], reads[0.0], strict=True)]
    assert got == pytest.approx([CHUNKS[name] * MAP, 0.0])


def test_a_coherent_gpus_page_the_cpu_maps_remotely_allocates_no_cpu_chunk() -> None:
    """GH200 with accessed-by CPU: a host read of GPU-written data leaves the pages on the GPU and maps them for the
    CPU over the coherent link (uvmlab.sim.uvm.host); nothing lands on the CPU, so no chunk is allocated or mapped."""
    reads = []
    for map_ns in (MAP, 0.0):
        sim = UvmSim(8 * VA_BLOCK_BYTES, UvmKnobs(), _costs(map_ns=map_ns), GPUS["GH200"])
        sim.map_range(0, VA_BLOCK_BYTES)
        sim.advise(0, 0, VA_BLOCK_BYTES, "set_accessed_by:cpu")
        sim.access([(0, 0, VA_BLOCK_BYTES, True)])
        reads.append(float(sim.host_read(0, 0, VA_BLOCK_BYTES).stall_ns))
        assert sim.host_read(0, 0, VA_BLOCK_BYTES).dtoh_bytes == 0  # stayed on the GPU
        sim.check_invariants()
    assert reads[0] == pytest.approx(reads[1])
