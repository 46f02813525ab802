"""How the UVM driver holds a block's CPU memory, and so how many CPU chunks its per-chunk work touches. Torch-free.

The driver allocates a VA block's CPU pages in *CPU chunks* and does per-chunk work on three paths the simulator
times (``CostParams.cpu_chunk_map_ns``, ``CostParams.cpu_unmap_chunk_ns``, ``CostParams.host_zero_bytes_per_s``):

* when the GPU first touches a block, ``uvm_va_block_gpu_state_get_alloc`` DMA-maps every CPU chunk the block holds
  for that GPU (``block_gpu_map_phys_all_cpu_pages`` -> ``uvm_cpu_chunk_map_gpu``: ``dma_map_page``, the IOMMU
  entry, the reverse map; uvm_va_block.c);
* a migration of CPU pages to the GPU unmaps and copies them chunk by chunk (``block_unmap_cpu``, the copy loop of
  ``block_copy_resident_pages``, uvm_va_block.c);
* a block's first CPU population (its first eviction, a CPU fault or first touch, a prefetch to the CPU) allocates
  its chunks (``block_populate_pages_cpu``), zeroed where a page of the chunk's region is resident nowhere, and maps
  each new one for the GPU when the block has GPU state (``uvm_va_block_map_cpu_chunk_on_gpus``). Chunks live until
  the block is destroyed (``block_kill`` frees them; no migration does), so each is paid for once
  (``UvmSim._cpu_alloc_ns``).

The chunk size depends on the driver branch (``UVM_CPU_CHUNK_SIZES`` in ``uvm_pmm_sysmem.h`` of
NVIDIA/open-gpu-kernel-modules):

* **R515-R529** (515.43.04, 525.53): ``PAGE_SIZE`` only. A block the CPU populated holds one chunk per host page;
  the closed drivers before them (``uvm8``) kept CPU memory page by page as well.
* **R530 and later** (530.30.02 ... 595.45.04): ``2M | 64K | PAGE_SIZE``. ``block_populate_pages_cpu`` takes the
  largest size aligned inside the block that overlaps no allocated chunk (``block_calculate_largest_alloc_size``),
  so the first CPU population of a full 2 MiB block allocates one 2 MiB chunk (``__GFP_ZERO``, the whole chunk,
  when a page of the block is resident nowhere), and later populations of that block find it allocated. Before
  R530 each page is allocated on its own, zeroed when it is resident nowhere (``uvm_cpu_chunk_alloc``, 525.105.17).

APPROXIMATION (R530+): every block is counted as one chunk. A block shorter than 2 MiB (a range's tail) holds 64 KiB
chunks where they fit and host pages elsewhere; a 2 MiB allocation can fail under fragmentation and fall back to
smaller chunks (``block_alloc_cpu_chunk``). Both would add chunks; neither is visible to the simulator. A tail
block's first CPU population is charged the zeroing of the whole tail, where the driver zeroes only the 64 KiB
chunks it allocates then (an over-estimate for a sparse first touch of a range's tail).
NOT TIMED: the page allocation itself (``alloc_pages``); no export separates it from the mapping
(docs/uvm-sim.md "CPU chunks").

Evidence (real exports, scorecard ``nsys-serial-refaults`` and ``nsys-batch-blocks``): on the A100 host of the
csc746 export (driver 525.105.17) the latency before a fault's copy grows by 0.69 us per page migrated and a
block's first fault costs 245.6 us more than a later one (512 chunks: 480 ns each); on the RTX 4060 laptop of the
easycuda export (550.163.01) a block serviced second in a batch costs 2.5-4.6 us whatever its size (16-256 pages),
first touch included.
"""

from __future__ import annotations

from uvmlab.gpus import driver_major

MULTI_SIZE_CPU_CHUNKS_MAJOR = 530
"""First driver branch whose CPU chunks may be 2 MiB or 64 KiB (530.30.02; 525.53 still has ``PAGE_SIZE`` only)."""


def page_sized_cpu_chunks(driver: str) -> bool:
    """True when ``driver`` holds a block's CPU memory in host-page chunks (R529 and earlier), False when one chunk
    covers a block (R530+, module docstring)."""
    return driver_major(driver) < MULTI_SIZE_CPU_CHUNKS_MAJOR


__all__ = ["MULTI_SIZE_CPU_CHUNKS_MAJOR", "page_sized_cpu_chunks"]
