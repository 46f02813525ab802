"""The CPU side of managed memory: host reads and writes between kernels, and prefetch to the CPU. Torch-free.

Mixed into :class:`uvmlab.sim.uvm.driver.UvmSim` (uses the bitmaps of :mod:`uvmlab.sim.uvm.advice`). Citations are
NVIDIA/open-gpu-kernel-modules 595.45.04 ``kernel-open/nvidia-uvm/`` ("[OGKM]").

**CPU faults** (:meth:`HostService.cpu_access`). The CPU touches a page through its own mapping (``_cmap``); a page
it has no usable mapping for faults into UVM (``uvm_va_space_cpu_fault_managed`` -> ``uvm_va_block_cpu_fault``),
which picks the residency with the same ``block_select_processor_residency`` as a GPU fault, the CPU being the
faulting processor:

* read duplication on: a read makes a CPU duplicate of a GPU page (a DtoH copy; the GPU keeps its copy), a write
  collapses a duplicate onto the CPU (the GPU copy is dropped, no transfer) or migrates the page;
* a GPU-resident page stays where it is and the CPU maps it remotely only if the CPU can access GPU memory (a
  coherent link: :attr:`uvmlab.gpus.GpuSpec.coherent`) and the CPU is accessed-by or the GPU is the preferred
  location; on PCIe it migrates to the CPU (DtoH);
* a page resident nowhere is populated on the CPU (first touch: zeroed by the host);
* a CPU-resident page the CPU does not map (after an eviction: ``block_add_eviction_mappings`` maps accessed-by
  processors only) is mapped (a fault with no transfer).

A CPU fault migrates its host page plus what the tree prefetcher adds for the CPU destination (the same
``uvm_perf_prefetch_get_hint_va_block``; pages the CPU already maps are excluded), so a sequential host write of a
fresh 2 MiB block faults six times (64K, 64K, 128K, 256K, 512K, 1M: UVMSmart ``getHWPrefetcherP1.cu``'s nvprof trace
shows exactly these CPU faults on a GTX 1080); from driver R590 on, with a preferred location other than the CPU
there is no prefetch (``should_apply_prefetch_logic``) and every host page faults on its own. Each fault costs
``CostParams.cpu_fault_ns`` plus its transfer, ``migrate_page_ns`` per migrated page and the CPU chunks the block
allocates (``UvmSim._cpu_alloc_ns``: mapped for the GPU, zeroed where a page is resident nowhere, at
``host_zero_bytes_per_s``). After the fault the CPU maps the pages, and accessed-by GPUs
map the pages now on the CPU (``block_service_finish_map_accessed_by``).

**Prefetch to the CPU** (:meth:`HostService.prefetch_to_cpu`, ``cudaMemPrefetchAsync(ptr, n, cudaCpuDeviceId)``,
``uvm_migrate.c`` ``uvm_va_block_migrate_locked`` with ``UVM_MIGRATE_MODE_MAKE_RESIDENT_AND_MAP``): GPU pages move
DtoH (read-mostly ranges: duplicated, the GPU keeps its copy), pages resident nowhere are populated on the CPU, the
CPU maps them; one ``block_service_ns`` per block moved, no fault.

Approximations: a host access's own time (the CPU loop writing the data) is the workload's, not modelled here;
a CPU access to GPU memory over a coherent link costs its mapping fault only.
"""

from __future__ import annotations

import numpy as np

from uvmlab.sim.uvm.faults import UvmCounters
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK
from uvmlab.sim.uvm.prefetch import prefetch_pages
from uvmlab.sim.uvm.runs import run_lengths
from uvmlab.sim.uvm.thrashing import CPU
from uvmlab.sim.uvm.timing import transfer_time_ns


class HostService:
    """The CPU half of UvmSim (module docstring)."""

    def host_write(self, range_id: int, offset: int, size: int) -> UvmCounters:
        """The CPU writes a byte range (e.g. initialises an array); returns the counters of its CPU faults."""
        return self.cpu_access(range_id, offset, size, True)

    def host_read(self, range_id: int, offset: int, size: int) -> UvmCounters:
        """The CPU reads a byte range (e.g. a result after a kernel); returns the counters of its CPU faults."""
        return self.cpu_access(range_id, offset, size, False)

    def _cpu_ok(self, s: int, is_write: bool) -> np.ndarray:
        """Pages the CPU can access in slot ``s`` without a fault."""
        usable = self._cpu[s] | (self._dup[s] & (not is_write))
        if self.coherent:
            usable = usable | (self._gpu[s] & ~self._dup[s] & ~self._rm[s])
        return self._cmap[s] & usable

    def _stays_on_gpu(self, s: int) -> np.ndarray:
        """GPU pages a CPU access leaves in place (coherent link, accessed-by CPU or preferred location GPU)."""
        if not self.coherent:
            return np.zeros(PAGES_PER_BLOCK, dtype=bool)
        return self._gpu[s] & ~self._dup[s] & ~self._rm[s] & (self._abc[s] | self._plg[s])

    def cpu_access(self, range_id: int, offset: int, size: int, is_write: bool) -> UvmCounters:
        """The CPU reads or writes a byte range (module docstring); returns the counters (``stall_ns``: the time
        its faults keep the host busy)."""
        self._ensure_hint_state()
        k, knobs, g = self._k, self.knobs, self._g
        for s, lo, hi in self._segments(int(range_id), int(offset), int(size)):
            want = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            want[lo:hi] = True
            valid = np.arange(PAGES_PER_BLOCK) < self._npages[s]
            while True:
                need = want & ~self._cpu_ok(s, is_write)
                idx = np.flatnonzero(need)
                if idx.size == 0:
                    break
                p = int(idx[0])
                stay = self._stays_on_gpu(s)
                no_prefetch = stay.copy()
                if self.prefetch_honours_preferred:  # R590+: no prefetch out of a preferred location (the GPU)
                    no_prefetch |= self._plg[s]
                if knobs.prefetch_enable and not no_prefetch[p]:
                    faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                    faulted[p // g * g : p // g * g + g] = True
                    faulted &= valid
                    if not (self._gpu[s].any() or self._cpu[s].any()) and self._plc[s, p]:
                        region = valid & self._plc[s]  # first touch at the preferred location: the whole block
                    else:
                        resident = self._cpu[s] | self._dup[s]
                        mapped = resident & self._cmap[s]
                        thr = knobs.prefetch_threshold
                        region = faulted | prefetch_pages(resident, faulted, self._npages[s], thr, mapped)
                    n_faults = 1
                else:
                    faulted = need & (no_prefetch if knobs.prefetch_enable else need)
                    region = faulted
                    n_faults = -(-int(faulted.sum()) // g)
                want &= ~faulted
                k.cpu_fault_count += n_faults
                k.stall_ns += n_faults * self.costs.cpu_fault_ns
                if self._thr and s in self._thr:  # throttling of thrashing pages (uvmlab.sim.uvm.thrashing)
                    self.thr_hint(s, region & valid, CPU)
                self._cpu_service(s, region & valid, stay, is_write)
        return self._flush_kernel_counters()

    def _cpu_service(self, s: int, region: np.ndarray, stay: np.ndarray, is_write: bool, fault: bool = True) -> None:
        """Make the pages ``region`` of slot ``s`` accessible to the CPU (module docstring); ``fault``: a CPU fault
        (a migration the thrashing detector counts), else a user migration (a prefetch to the CPU)."""
        k = self._k
        gpu, cpu, dup, rm = self._gpu[s], self._cpu[s], self._dup[s], self._rm[s]
        remote = region & stay
        on_gpu = region & gpu & ~dup & ~remote
        new = region & ~gpu & ~cpu & ~dup  # first touches
        n_new = int(np.count_nonzero(new))
        if n_new or not self._cpu_chunked[s]:  # the CPU chunks this allocates (zeroed ones for first touches)
            k.stall_ns += self._cpu_alloc_ns(s, on_gpu, new)
        collapse = region & dup & is_write
        if collapse.any():  # the duplicate collapses onto the CPU: the GPU copy is dropped
            n = int(collapse.sum())
            dup &= ~collapse
            self._release_gpu_pages(s, collapse)
            cpu |= collapse
            self._cpu_count[s] += n
            k.collapse_count += -(-n // self._g)
            k.stall_ns += n / self._g * self.costs.collapse_page_ns
        dup_cpu = on_gpu & rm & (not is_write)  # read duplication: the CPU gets a copy, the GPU keeps its own
        mig = on_gpu & ~dup_cpu
        moved = dup_cpu | mig
        if moved.any():
            runs = run_lengths(moved)
            n = int(runs.sum())
            k.dtoh_bytes += n * PAGE_BYTES
            k.dtoh_count += len(runs)
            k.stall_ns += transfer_time_ns(runs * PAGE_BYTES, self.costs.link_bytes_per_s)
            k.stall_ns += n * self.costs.migrate_page_ns
        if dup_cpu.any():
            dup |= dup_cpu
        if mig.any():
            n = int(mig.sum())
            self._release_gpu_pages(s, mig)
            cpu |= mig
            self._cpu_count[s] += n
        if n_new:  # first touch: populated on the CPU (zeroed by the chunk allocation above)
            cpu |= new
            self._cpu_count[s] += n_new
        self._cmap[s] |= region
        self._gmap[s] |= (mig | new) & self._abg[s] & ~rm
        if fault and (mig.any() or new.any()):
            self.thr_note(s, mig | new, CPU)

    def _release_gpu_pages(self, s: int, m: np.ndarray) -> None:
        """Pages ``m`` of slot ``s`` stop being GPU-resident (their chunk is freed when the block empties)."""
        n = int(np.count_nonzero(m & self._gpu[s]))
        self._count_decrease((s,))
        self._gpu[s] &= ~m
        if self._hint_arrays:
            self._gro[s] &= ~m
        self._res_count[s] -= n
        if self._res_count[s] == 0 and self._has_chunk[s]:
            self._has_chunk[s] = False
            self.used_bytes -= self._chunk_bytes[s]
            del self._lrm[s]

    def prefetch_to_cpu(self, range_id: int, offset: int, size: int) -> UvmCounters:
        """``cudaMemPrefetchAsync`` of a byte range to the CPU (module docstring)."""
        self._ensure_hint_state()
        k = self._k
        for s, lo, hi in self._segments(int(range_id), int(offset), int(size)):
            m = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            m[lo:hi] = True
            if (m & self._cmap[s] & (self._cpu[s] | self._dup[s])).sum() == m.sum():
                continue  # already on the CPU and mapped
            self._cpu_service(s, m, np.zeros(PAGES_PER_BLOCK, dtype=bool), False, fault=False)
            self.thr_reset(s, m)  # a user migration resets the pages' thrashing tracking
            k.stall_ns += self.costs.block_service_ns
        return self._flush_kernel_counters()


__all__ = ["HostService"]
