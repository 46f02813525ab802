"""``cudaMemAdvise`` as the driver implements it: per-page policies and the GPU fault path under them. Torch-free.

Mixed into :class:`uvmlab.sim.uvm.driver.UvmSim`. Citations are NVIDIA/open-gpu-kernel-modules 595.45.04
(``kernel-open/nvidia-uvm/``, "[OGKM]", commit df1c9a3de); docs/uvm-sim.md "cudaMemAdvise" shows each rule with its
source line and where the rq4 measurement disagrees.

**State.** The driver keeps a policy per VA range, split at the advised byte range (``split_span_as_needed``,
uvm_policy.c); the model keeps it per 4 KiB page (rounded out to whole host pages), as bitmaps next to the residency
bitmaps: read-mostly (``_rm``), preferred location GPU / CPU (``_plg`` / ``_plc``), accessed-by GPU / CPU
(``_abg`` / ``_abc``), plus two mapping bitmaps: ``_gmap`` (the GPU maps the page's CPU copy: a *remote mapping*)
and ``_cmap`` (the CPU maps its copy). They are created on the first advice or host access; until then nothing
changes for any run.

**What each advice does when issued** (``uvm_policy.c``):

* ``set_read_mostly`` (``read_duplication_set`` -> ``va_block_set_read_duplication_locked``): resident pages are
  made read-duplicates where they are, which "will break all SetAccessedBy and remote mappings": ``_gmap`` is
  cleared on the range.
* ``unset_read_mostly`` (``va_block_unset_read_duplication_locked``): each duplicated page keeps one copy, at the
  preferred location if it holds one, else at the first resident processor in id order, the CPU (``UVM_ID_CPU``
  is id 0): the GPU copy is dropped with no transfer; then the accessed-by mappings are re-established.
* ``set_preferred_location`` (``preferred_location_set`` -> ``uvm_va_range_set_preferred_location``): no
  migration; the new preferred processor's remote mappings are removed (``preferred_location_unmap_remote_pages``:
  for the GPU, ``_gmap`` is cleared), unless read duplication is on. ``unset_preferred_location``: only the policy.
* ``set_accessed_by`` (``accessed_by_set`` -> ``uvm_va_block_set_accessed_by``): the processor maps every resident
  page it can access (the GPU maps CPU-resident pages: ``_gmap``; the CPU maps GPU pages only over a coherent link),
  unless read duplication is on. ``unset_accessed_by`` (``uvm_va_range_unset_accessed_by``): only the policy bit;
  existing mappings stay until the pages move.

Each call costs :data:`ADVISE_CALL_NS` plus one ``block_service_ns`` per VA block whose mappings it changes.

**GPU faults under a policy** (:meth:`AdviceService._policy_stage_block`): a page faults when the GPU has no
mapping that allows the access: not GPU-resident and not remote-mapped, or a write to a read duplicate (the GPU's
mapping of a duplicate is read-only: ``compute_new_permission`` does not upgrade a read to read-write where
``block_region_might_read_duplicate``). Where the page goes is ``block_select_processor_residency``
(uvm_va_block.c:11212), in its order:

1. read duplication on: a read makes a duplicate on the GPU (the CPU keeps its copy); a write makes the GPU the
   only holder (a duplicate collapses: the other copy is dropped, ``break_read_duplication_in_region``; a CPU-only
   page migrates);
2. the GPU is the preferred location: migrate to the GPU;
3. resident nowhere: the preferred location if set (CPU: populated on the CPU and mapped remotely), else the GPU;
4. accessed-by GPU and CPU-resident: stay, map remotely;
5. preferred location CPU and CPU-resident: stay, map remotely;
6. else migrate to the GPU.

Prefetch (``uvm_perf_prefetch_prenotify_fault_migrations``, uvm_perf_prefetch.c): only when every faulted page of
the block goes to one processor (``uvm_va_block_get_prefetch_hint``); on a first touch of a block resident nowhere
whose destination is the preferred location, the whole block is populated; otherwise the tree prefetcher runs,
from driver R590 on only if no preferred location is set or the destination is it (``should_apply_prefetch_logic``,
new in 590.44.01: :data:`PREFERRED_PREFETCH_MAJOR`); prefetched pages of a read-mostly range become duplicates too.
A remote-mapped page never faults again: each access moves its bytes over the link (``remote_read_bytes`` /
``remote_write_bytes``; the kernel lasts max(native, link time), :func:`remote_ns`). After an eviction, accessed-by
processors are mapped to the evicted pages (``block_add_eviction_mappings``), so an accessed-by GPU reads evicted
data remotely instead of faulting it back.
Collapsing a duplicate costs ``CostParams.collapse_page_ns`` per page besides its write fault.

**Read-only sole copies** (``_gro``): in a read-mostly range the GPU can map a page read-only though it holds the
only copy, and then every write to it faults (no transfer; ``collapse_page_ns`` per page, as a collapse). Three
rules put a page there: (1) the prefetch region of a fault includes pages already resident on the destination
(only the faulted pages are taken out, ``uvm_perf_prefetch_prenotify_fault_migrations``, uvm_perf_prefetch.c) and
in a read-mostly range those pages go to ``uvm_va_block_make_resident_read_duplicate``
(``uvm_va_block_service_copy``), which revokes the write permission of every resident copy not yet duplicated
(``block_prep_read_duplicate_mapping``): each write fault takes the write of the block's pages written before it,
so a kernel writing read-mostly memory faults on every written page at every launch (rq4: 3 us per written page
per launch on an RTX 5090); (2) a page made resident as a read duplicate with no other copy (a read or prefetch
of a page resident nowhere) is mapped read-only (``compute_new_permission`` does not upgrade where
``block_region_might_read_duplicate``); (3) ``set_read_mostly`` on GPU-resident pages
(``va_block_set_read_duplication_locked``, uvm_policy.c), and a ``cudaMemPrefetchAsync`` to the GPU of a read-mostly
range (``uvm_va_block_migrate_locked``, uvm_migrate.c; uvmlab.sim.uvm.migrate). A write fault maps the page
read-write again.

Approximations: the policy of a page is its own (the driver's range split rounds to pages too, but a faulted
block's prefetch decision uses the policy of the faulted region: here a block's prefetch is off when any faulted
page has a preferred location that is not the destination); the whole-block first-touch population covers the
pages of the block that share the preferred location; ``unset_read_mostly`` gives a read-only sole copy its write
back at once (the driver at its next write fault: one fault per page not charged).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.sim.uvm.faults import UvmCounters
from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK
from uvmlab.sim.uvm.order import SECTOR_BYTES
from uvmlab.sim.uvm.prefetch import prefetch_pages
from uvmlab.sim.uvm.runs import htod_record_count
from uvmlab.sim.uvm.timing import CostParams

ADVICE = (
    "set_read_mostly",
    "unset_read_mostly",
    "set_preferred_location:gpu",
    "set_preferred_location:cpu",
    "unset_preferred_location",
    "set_accessed_by:gpu",
    "set_accessed_by:cpu",
    "unset_accessed_by:gpu",
    "unset_accessed_by:cpu",
)
"""The ``api_arg`` values of an ``api = "advise"`` trace row (IFACE24.md), one per ``cudaMemAdvise`` advice."""
ADVISE_CALL_NS = 10_000.0
"""One ``cudaMemAdvise`` call: one UVM ioctl (``UVM_SET_PREFERRED_LOCATION``, ``UVM_SET_ACCESSED_BY``,
``UVM_ENABLE_READ_DUPLICATION`` and their inverses, uvm_ioctl.h) taking the VA space lock for write [U: the same
order as ``CostParams.managed_alloc_ns``, not measured]."""
PREFERRED_PREFETCH_MAJOR = 590
"""From driver R590 (590.44.01) on, the prefetcher does not prefetch out of a preferred location
(``should_apply_prefetch_logic``, uvm_perf_prefetch.c:324); every earlier open release (515.43.04 to 580.142)
prefetches whatever the preferred location (checked in each tag of NVIDIA/open-gpu-kernel-modules); the closed
drivers are taken to behave as 515 [I]."""
HINT_ARRAYS = ("_rm", "_plg", "_plc", "_abg", "_abc", "_gmap", "_cmap", "_gro")
"""The per-page policy and mapping bitmaps (module docstring), slot x 512 bool like ``_gpu``."""
NO_PAGES = np.zeros(PAGES_PER_BLOCK, dtype=bool)
NO_PAGES.flags.writeable = False


def remote_ns(c: UvmCounters, costs: CostParams, scale: float = 1.0, lone_sectors: bool = False) -> float:
    """Link time (ns) of a kernel's remote accesses: reads and writes each in their own direction of the link (PCIe
    and NVLink are full duplex), at ``CostParams.remote_read_bytes_per_s`` / ``remote_write_bytes_per_s``.
    ``scale``: the bytes that cross per byte accessed (``touched_bytes`` / accessed: a strided kernel moves lone
    sectors); ``lone_sectors``: each written sector is its own partial-line write, at least
    ``CostParams.remote_partial_write_ns`` each."""
    if not c.remote_bytes:
        return 0.0
    r = c.remote_read_bytes * scale / float(costs.remote_read_bytes_per_s or costs.link_bytes_per_s or 1.0)
    w = c.remote_write_bytes * scale / float(costs.remote_write_bytes_per_s or costs.link_bytes_per_s or 1.0)
    if lone_sectors and costs.remote_partial_write_ns:
        w = max(w, c.remote_write_bytes * scale / SECTOR_BYTES * costs.remote_partial_write_ns * 1e-9)
    return max(r, w) * 1e9


class AdviceService:
    """The ``cudaMemAdvise`` half of UvmSim (module docstring); uses its bitmaps, per-slot lists and counters."""

    # -- state ---------------------------------------------------------------------------------
    def _ensure_hint_state(self) -> None:
        """Create the policy and mapping bitmaps (all False) and turn on the hinted eviction rule."""
        if self._hint_arrays:
            return
        n = self._gpu.shape[0]
        for name in HINT_ARRAYS:
            setattr(self, name, np.zeros((n, PAGES_PER_BLOCK), dtype=bool))
        self._hint_arrays = HINT_ARRAYS
        self._pol_any = [False] * len(self._npages)
        self._hinted = self._dups_possible = True

    def _update_pol_any(self, s: int) -> None:
        """Slot ``s`` takes the policy fault path while it has a policy bit, or a remote GPU mapping left by an
        unset accessed-by (``uvm_va_range_unset_accessed_by`` keeps mappings until the pages move): the plain path
        would fault those mapped pages over."""
        self._pol_any[s] = bool(
            self._rm[s].any()
            or self._plg[s].any()
            or self._plc[s].any()
            or self._abg[s].any()
            or self._abc[s].any()
            or self._gmap[s].any()
        )

    def advised(self, accesses: list[tuple[int, int, int, bool]]) -> bool:
        """True when a ``cudaMemAdvise`` policy (read-mostly, a preferred location or accessed-by) covers a VA block
        the accesses touch: the replay then takes the per-block path that models the policies (uvmlab.sim.uvm.replay
        ``_Replayer._access``)."""
        pol = self._pol_any
        if pol is None:
            return False
        return any(pol[s] for r, o, n, _ in accesses for s, _, _ in self._segments(int(r), int(o), int(n)))

    def in_place(self, accesses: list[tuple[int, int, int, bool]]) -> bool:
        """True when the GPU maps every page of ``accesses`` where it is: GPU-resident, or (under a policy) CPU-resident
        and mapped remotely. A kernel over them migrates nothing, so the physical pages, and the L2 lines a previous
        launch left (uvmlab.sim.uvm.l2_reuse), are the same; a write to a read-only copy still faults."""
        if not self._hint_arrays:
            return self.resident(accesses)
        gpu, gmap = self._gpu, self._gmap
        for r, o, n, _ in accesses:
            for s, lo, hi in self._segments(int(r), int(o), int(n)):
                if not (gpu[s, lo:hi] | gmap[s, lo:hi]).all():
                    return False
        return True

    # -- cudaMemAdvise -------------------------------------------------------------------------
    def advise(self, range_id: int, offset: int, size: int, advice: str) -> UvmCounters:
        """``cudaMemAdvise(ptr, size, advice, device)`` on a byte range (``advice``: one of :data:`ADVICE`)."""
        if advice not in ADVICE:
            raise InputError(f"unknown cudaMemAdvise advice {advice!r}; known: {', '.join(ADVICE)}")
        self._ensure_hint_state()
        k = self._k
        k.stall_ns += ADVISE_CALL_NS
        changed = 0
        for s, lo, hi in self._segments(int(range_id), int(offset), int(size)):
            sl = slice(lo, hi)
            if advice == "set_read_mostly":
                self._rm[s, sl] = True
                self._gro[s, sl] |= self._gpu[s, sl] & ~self._dup[s, sl]  # write revoked where it is resident
                changed += self._unmap_gpu(s, sl)
            elif advice == "unset_read_mostly":
                self._rm[s, sl] = False
                self._gro[s, sl] = False  # APPROXIMATION: the driver upgrades them at their next write fault
                changed += self._collapse_duplicates(s, sl)
                changed += self._map_accessed_by(s, sl)
            elif advice.startswith("set_preferred_location"):
                gpu = advice.endswith(":gpu")
                self._plg[s, sl], self._plc[s, sl] = gpu, not gpu
                if gpu:
                    changed += self._unmap_gpu(s, sl, keep_read_mostly=True)
            elif advice == "unset_preferred_location":
                self._plg[s, sl] = self._plc[s, sl] = False
            elif advice.startswith("set_accessed_by"):
                (self._abg if advice.endswith(":gpu") else self._abc)[s, sl] = True
                changed += self._map_accessed_by(s, sl)
            else:  # unset_accessed_by: the bit only (uvm_va_range_unset_accessed_by)
                (self._abg if advice.endswith(":gpu") else self._abc)[s, sl] = False
            self._update_pol_any(s)
        k.stall_ns += changed * self.costs.block_service_ns
        return self._flush_kernel_counters()

    def _unmap_gpu(self, s: int, sl: slice, keep_read_mostly: bool = False) -> int:
        """Remove the GPU's remote mappings of pages ``sl`` of slot ``s``; return 1 if any was removed.
        ``keep_read_mostly``: pages under read duplication keep theirs (it takes precedence over PreferredLocation:
        ``preferred_location_unmap_remote_pages``)."""
        drop = self._gmap[s, sl] & ~self._rm[s, sl] if keep_read_mostly else self._gmap[s, sl].copy()
        if not drop.any():
            return 0
        self._gmap[s, sl] &= ~drop
        return 1

    def _map_accessed_by(self, s: int, sl: slice) -> int:
        """Accessed-by processors map the resident pages they can access (not under read duplication)."""
        free = ~self._rm[s, sl]
        add_g = self._abg[s, sl] & self._cpu[s, sl] & free & ~self._gmap[s, sl]
        add_c = self._abc[s, sl] & free & ~self._cmap[s, sl] & (self._cpu[s, sl] | (self._gpu[s, sl] & self.coherent))
        self._gmap[s, sl] |= add_g
        self._cmap[s, sl] |= add_c
        return int(add_g.any() or add_c.any())

    def _collapse_duplicates(self, s: int, sl: slice) -> int:
        """``unset_read_mostly``: each duplicate keeps one copy (GPU if preferred there, else the CPU's)."""
        d = self._dup[s, sl]
        if not d.any():
            return 0
        to_cpu = np.zeros(PAGES_PER_BLOCK, dtype=bool)
        to_cpu[sl] = d & ~self._plg[s, sl]
        d[:] = False
        if to_cpu.any():  # the GPU copy is dropped, the CPU's stays: no transfer
            self._release_gpu_pages(s, to_cpu)
            self._cpu[s] |= to_cpu
            self._cpu_count[s] += int(to_cpu.sum())
        return 1

    # -- GPU faults under a policy -------------------------------------------------------------
    def _policy_stage_block(self, s: int, span: Any, is_write: bool, budget: int) -> int:
        """One block's share of a kernel stage under a policy (module docstring); returns the batch budget left."""
        if type(span) is tuple:
            want = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            want[span[0] : span[1]] = True
        else:
            want = span
        gpu, dup, gro = self._gpu[s], self._dup[s], self._gro[s]
        while True:
            remote = self._gmap[s] & self._cpu[s]
            local = gpu & ~dup & ~gro if is_write else gpu
            idx = np.flatnonzero(want & ~local & ~remote)
            if idx.size == 0:
                break
            take = idx[:budget]
            want[take] = False  # single touch
            faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            faulted[take] = True
            self._service_policy(s, faulted, is_write)
            budget -= take.size
            if budget > 0:
                break
            self._close_batch()
            budget = self._per_batch
        return budget

    def _service_policy(self, s: int, faulted: np.ndarray, is_write: bool) -> None:
        """Service one block's faults of a batch under its policy (``block_select_processor_residency``)."""
        k, knobs = self._k, self.knobs
        n_f = int(faulted.sum())
        self._fault_migrations[s] += n_f
        gpu, cpu, dup, rm, gro = self._gpu[s], self._cpu[s], self._dup[s], self._rm[s], self._gro[s]
        collapse = faulted & gpu & dup  # a write to a duplicate: the CPU copy is revoked
        upgrade = faulted & gpu & gro if is_write else NO_PAGES  # a write to a read-only sole copy: no transfer
        rest = faulted & ~collapse
        to_gpu = rest & rm
        make_dup = to_gpu & cpu if not is_write else np.zeros_like(faulted)
        other = rest & ~rm
        to_gpu |= other & self._plg[s]
        other &= ~self._plg[s]
        nowhere = other & ~cpu
        to_cpu_new = nowhere & self._plc[s]  # first touch at the preferred location, the CPU
        to_gpu |= nowhere & ~self._plc[s]
        other &= cpu
        stay = other & (self._abg[s] | self._plc[s])
        to_gpu |= other & ~stay
        extra = revoke = NO_PAGES
        out_of_pref = self.prefetch_honours_preferred and (to_gpu & self._plc[s]).any()
        if to_gpu.any() and not (to_cpu_new.any() or stay.any()) and not out_of_pref:
            if self._res_count[s] == 0 and self._cpu_count[s] == 0 and not (to_gpu & ~self._plg[s]).any():
                valid = np.arange(PAGES_PER_BLOCK) < self._npages[s]
                extra = valid & self._plg[s] & ~to_gpu  # first touch at the preferred location: the whole block
            elif knobs.prefetch_enable and self._fault_migrations[s] >= knobs.prefetch_min_faults:
                region = prefetch_pages(gpu, to_gpu, self._npages[s], knobs.prefetch_threshold, exclude=NO_PAGES)
                region = region & ~(self._gmap[s] & cpu)  # pages the GPU maps remotely stay where they are
                if self.prefetch_honours_preferred:
                    region &= ~self._plc[s]  # not out of a CPU preference (R590+)
                extra = region & ~gpu
                revoke = region & gpu & rm & ~dup & ~faulted
            make_dup = make_dup | (extra & rm & cpu)
        mig = (to_gpu | extra) & ~gpu
        read_only = mig & rm & ~cpu  # made resident as read duplicates with no other copy: mapped read-only
        if is_write:
            read_only &= ~faulted  # ... but a written page is mapped read-write
        dup_after = make_dup & mig
        h = mig & cpu
        fault_h = int((h & faulted).sum())
        n_h = int(h.sum())
        zero = 0
        keep_cmap = self._cmap[s] & dup_after  # read duplication does not unmap the source: the CPU keeps reading
        if mig.any():
            if n_h:
                self._k.htod_records += htod_record_count(h, faulted)
            zero, runs = self._populate(s, mig)
            if runs.size:
                self._add_htod_runs(runs)
        if dup_after.any():
            dup |= dup_after  # the CPU keeps its copy (implicit: a duplicate is GPU-resident with a valid CPU copy)
            self._cmap[s] |= keep_cmap
        gro &= ~mig
        if is_write:
            gro &= ~faulted  # the written pages are mapped read-write (compute_new_permission)
        gro |= read_only | revoke
        n_col = int(collapse.sum())
        if n_col:
            dup &= ~collapse
            self._cmap[s] &= ~collapse
            k.collapse_count += -(-n_col // self._g)
        n_ro = n_col + int(upgrade.sum())
        if n_ro:
            k.stall_ns += n_ro / self._g * self.costs.collapse_page_ns
            k.read_only_write_faults += -(-n_ro // self._g)  # one fault per host page
        if to_cpu_new.any():
            n_new = int(to_cpu_new.sum())
            k.stall_ns += self._cpu_alloc_ns(s, fresh=to_cpu_new)  # zeroed CPU chunks, mapped for the GPU
            cpu |= to_cpu_new
            self._cpu_count[s] += n_new
        self._gmap[s] |= to_cpu_new | stay
        self._account_service(s, n_f, int(mig.sum()), fault_h, n_h - fault_h, zero)

    def _after_gpu_populate(self, s: int, mask: np.ndarray) -> None:
        """Pages made GPU-resident: the GPU maps them locally; the CPU loses its mapping (unless it can map GPU
        memory: a coherent link and accessed-by CPU)."""
        self._gmap[s] &= ~mask
        keep = self._abc[s] & mask if self.coherent else None
        self.unmap_cpu(s, mask if keep is None else mask & ~keep)

    def unmap_cpu(self, rows: Any, mask: Any) -> None:
        """The CPU loses its mapping of the ``mask`` pages of slot(s) ``rows``, made GPU-resident: each CPU chunk
        holding pages it mapped costs ``CostParams.cpu_unmap_chunk_ns`` (the driver unmaps the CPU's PTEs and copies
        chunk by chunk: ``block_unmap_cpu`` -> ``unmap_mapping_range``, ``block_copy_resident_pages``,
        uvm_va_block.c; a chunk is a host page before R530, a block from R530: uvmlab.sim.uvm.cpu_chunks). A read
        duplicate pays it too (the CPU's read-write mapping is revoked; it maps the page read-only again on its next
        access)."""
        mapped = self._cmap[rows] & mask
        n = int(np.count_nonzero(mapped))
        if n:
            self._cmap[rows] &= ~mapped
            blocks = int(np.count_nonzero(mapped.any(axis=-1))) if mapped.ndim > 1 else 1
            self._k.stall_ns += self.cpu_chunks(n, blocks) * self.costs.cpu_unmap_chunk_ns

    def _after_eviction(self, v: int, now_cpu: np.ndarray) -> None:
        """Accessed-by processors map the evicted pages (``block_add_eviction_mappings``, uvm_va_block.c)."""
        self._gro[v] = False  # the whole chunk leaves the GPU
        free = ~self._rm[v]
        self._gmap[v] |= now_cpu & self._abg[v] & free
        self._cmap[v] |= now_cpu & self._abc[v] & free

    # -- remote accesses -----------------------------------------------------------------------
    def _count_remote(self, accesses: list[tuple[int, int, int, bool]]) -> None:
        """Add each access's share of remote-mapped pages (CPU-resident, GPU-mapped) to the remote byte counters."""
        k = self._k
        rb = wb = 0.0
        for range_id, offset, size, is_write in accesses:
            segs = self._segments(int(range_id), int(offset), int(size))
            n_all = sum(hi - lo for _, lo, hi in segs)
            if not n_all:
                continue
            n_rem = sum(int(np.count_nonzero(self._gmap[s, lo:hi] & self._cpu[s, lo:hi])) for s, lo, hi in segs)
            if n_rem:
                b = int(size) * n_rem / n_all
                if is_write:
                    wb += b
                else:
                    rb += b
        k.remote_read_bytes += int(rb)
        k.remote_write_bytes += int(wb)
        k.remote_bytes += int(rb) + int(wb)

    def check_advice_invariants(self) -> str | None:
        """A broken advice invariant, or None: remote mappings point at CPU copies of pages not on the GPU."""
        if not self._hint_arrays:
            return None
        n = self._n_slots
        if (self._gmap[:n] & self._gpu[:n]).any():
            return "the GPU maps a page remotely that is resident on the GPU"
        if (self._plg[:n] & self._plc[:n]).any():
            return "a page has two preferred locations"
        if (self._gro[:n] & ~(self._gpu[:n] & ~self._dup[:n] & self._rm[:n])).any():
            return "a page whose write the GPU lost is not a sole GPU copy under read-mostly"
        return None


__all__ = ["ADVICE", "ADVISE_CALL_NS", "HINT_ARRAYS", "AdviceService", "remote_ns"]
