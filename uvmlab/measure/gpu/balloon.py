"""Balloon arithmetic: how much device memory to reserve so that UVM gets ``footprint / factor``.

Procedure (reference/uvm.md section 3.2)::

    usable     = total - context                 (CUDA context + what the driver keeps back; GpuSpec.context_bytes)
    C          = footprint / factor              (capacity UVM may use), rounded down to 2 MiB
    leave      = C + reserve                     (what the balloon leaves free; the shim measures free at run time)
    balloon    = usable - leave                  (planned from the spec; the real one is free_measured - leave)

``reserve`` (R) is headroom for device memory the process takes *outside* UVM after the balloon (lazily loaded
kernels, library handles, UVM's own page tables): 128 MiB "state space" as in NVIDIA's oversubscription sample
(uvm.md 3.1) [I]. On the GPU the shim computes the balloon from the free memory it measures
(``UVMLAB_BALLOON_LEAVE_BYTES``), so the context size that matters is the real one; the planned number uses the
spec's estimate and is what the dry run shows.

**What UVM can use** (NVIDIA/open-gpu-kernel-modules 595.45.04, ``kernel-open/nvidia-uvm``): to back a VA block,
``block_alloc_gpu_chunk`` (uvm_va_block.c) first calls ``uvm_pmm_gpu_alloc_user(..., UVM_PMM_ALLOC_FLAGS_NONE)``
and evicts (``UVM_PMM_ALLOC_FLAGS_EVICT``) only when that fails with ``NV_ERR_NO_MEMORY``; ``alloc_root_chunk``
(uvm_pmm_gpu.c) takes root chunks from PMA in batches of ``1 << uvm_perf_pma_batch_nonpinned_order`` (64 x 2 MiB),
but with ``UVM_PMA_ALLOCATE_ALLOW_PARTIAL`` ("best-effort ... if the whole batch cannot be allocated") and keeps
``options.numPagesAllocated`` of them. So UVM fills *every* free 2 MiB root chunk before it evicts one of its own
pages: the reserve is not kept free from UVM. UVM's capacity during the run is what the balloon left (C + R)
minus what non-UVM allocations take after it; it is C only when they take all of R, and C + R when they take
nothing (then the run's factor is M / (C + R), e.g. 3.745 instead of 4 for a 14.7 GiB job with R = 256 MiB).
The run measures it (``uvmlab.measure.gpu.collect.effective_factor``). An earlier reserve also counted one 128 MiB PMA
batch as unusable; the best-effort batch above is why it is not.

Refusals (InputError, one sentence each):
* footprint <= 0;
* C < ``MIN_AVAILABLE_BYTES`` (512 MiB = four PMA batches [I]): UVM would spend the run in eviction of its own batches;
* C + R > usable when factor > 1, or the footprint itself does not fit when factor <= 1: the card cannot give the
  requested capacity (the sentence names the smallest factor that works);
* footprint - C > host memory - host reserve: evicted managed pages live in non-swappable host memory (uvm.md 3.2
  step 7), so the host must hold what does not fit on the card.

Factor <= 1 means "no oversubscription": if the card cannot provide footprint / factor (e.g. factor 0.5 of a big
job), the balloon is 0 and the achieved factor is reported with a note.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from uvmlab.config import check_oversub
from uvmlab.errors import InputError
from uvmlab.units import GiB, MiB, format_bytes

ROOT_CHUNK_BYTES = 2 * MiB
"""UVM's VA block and root-chunk size (uvm.md 1.2): capacity is counted in these."""
PMA_BATCH_BYTES = 128 * MiB
"""UVM asks PMA for 128 MiB batches (uvm_perf_pma_batch_nonpinned_order=6, uvm.md 3.3), best-effort: a partial
batch is accepted (uvm_pmm_gpu.c ``alloc_root_chunk``, UVM_PMA_ALLOCATE_ALLOW_PARTIAL), so no batch-sized hole
needs to be left free."""
STATE_SPACE_BYTES = 128 * MiB
"""NVIDIA's oversubscription sample keeps 128 MiB back (uvm_oversubs.cu ``setup_memory_allocation``, uvm.md 3.1)."""
DEFAULT_RESERVE_BYTES = STATE_SPACE_BYTES
"""R: headroom for non-UVM allocations after the balloon; UVM uses whatever of it they leave (module docstring)."""
MIN_AVAILABLE_BYTES = 4 * PMA_BATCH_BYTES
"""Smallest capacity we give UVM (512 MiB) [I]: below it the PMA batches and page tables dominate."""
HOST_RESERVE_BYTES = 4 * GiB
"""Host memory kept for the OS, Python and PyTorch's host allocations [I]."""


@dataclass(frozen=True)
class BalloonPlan:
    """The numbers of one balloon decision (all bytes)."""

    total_bytes: int
    context_bytes: int
    reserve_bytes: int
    footprint_bytes: int
    oversub: float
    """Requested factor: footprint / available."""
    available_bytes: int
    """Capacity UVM gets (C), a multiple of 2 MiB."""
    leave_bytes: int
    """What the balloon leaves free (C + R): the shim's UVMLAB_BALLOON_LEAVE_BYTES."""
    balloon_bytes: int
    """Planned balloon from the spec (total - context - leave), >= 0, a multiple of 2 MiB."""
    achieved_oversub: float
    """footprint / available_bytes after rounding and clamping."""
    oversub_total: float
    """footprint / total memory: the factor most papers and NVIDIA's sample report (uvm.md 3.1 F_total)."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "notes": list(self.notes)}


def _whole(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} must be a whole number of bytes >= {minimum}, not {value!r}")
    return value


def plan_balloon(
    footprint_bytes: int,
    oversub: float,
    total_bytes: int,
    context_bytes: int,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    host_memory_bytes: int | None = None,
    min_available_bytes: int = MIN_AVAILABLE_BYTES,
) -> BalloonPlan:
    """Compute the balloon for ``footprint_bytes`` at factor ``oversub`` on a card of ``total_bytes``.

    ``host_memory_bytes`` is the host RAM available to the job (None: not checked, and a note says so).
    """
    footprint = _whole("footprint", footprint_bytes, 1)
    total = _whole("GPU memory", total_bytes, 1)
    context = _whole("context size", context_bytes)
    reserve = _whole("reserve", reserve_bytes)
    f = check_oversub(oversub)
    usable = total - context
    if usable - reserve < min_available_bytes:
        raise InputError(
            f"the GPU's {format_bytes(total)} minus the context ({format_bytes(context)}) and reserve "
            f"({format_bytes(reserve)}) leaves less than {format_bytes(min_available_bytes)} for UVM; "
            "use a larger GPU or a smaller --reserve"
        )
    notes: list[str] = []
    room = (usable - reserve) // ROOT_CHUNK_BYTES * ROOT_CHUNK_BYTES  # the most UVM can get
    wanted = math.floor(footprint / f / ROOT_CHUNK_BYTES) * ROOT_CHUNK_BYTES
    if wanted < min_available_bytes:
        raise InputError(
            f"footprint {format_bytes(footprint)} at factor {f:g} leaves UVM only {format_bytes(footprint / f)}, "
            f"below the safe minimum of {format_bytes(min_available_bytes)}; use a factor of at most "
            f"{footprint / min_available_bytes:.2f} or a larger workload"
        )
    if wanted > room:
        if f <= 1 and footprint <= room:
            notes.append(
                f"factor {f:g} asks for {format_bytes(footprint / f)} but the card has {format_bytes(room)} for UVM: "
                f"no balloon; the achieved factor is {footprint / room:.3f}"
            )
            wanted = room
        else:
            raise InputError(
                f"footprint {format_bytes(footprint)} at factor {f:g} needs {format_bytes(footprint / f)} of GPU "
                f"memory but the card has {format_bytes(room)} after the context and reserve; use a factor of at "
                f"least {footprint / room:.2f}"
            )
    available = wanted
    leave = available + reserve
    balloon = max(0, (usable - leave) // ROOT_CHUNK_BYTES * ROOT_CHUNK_BYTES)
    if host_memory_bytes is None:
        notes.append("host memory not checked (unknown)")
    else:
        host = _whole("host memory", host_memory_bytes)
        spill = max(0, footprint - available)
        if spill > host - HOST_RESERVE_BYTES:
            raise InputError(
                f"{format_bytes(spill)} of managed memory would live on the host (footprint minus GPU capacity) but "
                f"the host has {format_bytes(host)} ({format_bytes(HOST_RESERVE_BYTES)} kept for the system); use a "
                "smaller factor or a machine with more RAM"
            )
    return BalloonPlan(
        total_bytes=total,
        context_bytes=context,
        reserve_bytes=reserve,
        footprint_bytes=footprint,
        oversub=f,
        available_bytes=available,
        leave_bytes=leave,
        balloon_bytes=balloon,
        achieved_oversub=footprint / available,
        oversub_total=footprint / total,
        notes=tuple(notes),
    )
