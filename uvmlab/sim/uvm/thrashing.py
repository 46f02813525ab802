"""Thrashing detection, throttling and pinning where the driver applies them (mixed into UvmSim). Torch-free.

Source: NVIDIA/open-gpu-kernel-modules 595.45.04 ``kernel-open/nvidia-uvm/uvm_perf_thrashing.c`` (module parameters
``uvm_perf_thrashing_*``, reference/uvm.md 1.7; ``UvmKnobs.thrashing_*``).

**When it applies.** ``thrashing_event_cb`` listens to migrations and returns at once for eviction-caused ones
("Skip the thrashing detection logic on eviction"); user migrations (``cudaMemPrefetchAsync``, advice) reset the
pages' tracking (``thrashing_reset_pages_in_region``). A VA block gets per-page tracking only when its previous
tracked migration went to a *different processor* within the lapse (``uvm_perf_thrashing_lapse_usec``, 500 us). So
with one GPU the detector never fires on GPU faults and evictions alone (the cascades of
uvmlab.sim.uvm.concurrent run unmitigated); it fires on CPU-GPU ping-pong: the host touching managed data that
kernels use within half a millisecond (CPU faults migrate with the same ``REPLAYABLE_FAULT`` cause, uvm.md 1.7).

**Detection** (per page of a tracked block): each migration within the lapse of the page's previous one counts an
event; at ``thrashing_threshold`` (3) events the page is thrashing; a migration more than a lapse after the previous
one ends it (unless pinned; the page's throttle count survives, ``thrashing_reset_page``). ``thrashing_epoch`` (2000
lapses) after the block's last thrashing event its tracking is dropped, at most ``thrashing_max_resets`` (4) times
per block.

**Mitigation** (``uvm_perf_thrashing_get_hint`` -> ``get_hint_for_migration_thrashing``, for a processor faulting
on a thrashing page):

* throttling periods of ``thrashing_nap`` lapses (``thrashing_throttle_update``): the first processor to fault in a
  period is the one not throttled (consecutive periods alternate); the other processor is *throttled* until the
  period ends (a GPU's fault is not serviced, its warps replay; the CPU sleeps): the model adds the wait to the
  faulting call's time, and the migration happens at the end of the period;
* after ``thrashing_pin_threshold`` (10) throttles of the page, the not-throttled processor's fault *pins* it: on a
  host whose CPU cannot map GPU memory (PCIe) the pin ends on the CPU (the one location both processors can access:
  a GPU pin is re-pinned to the CPU at the CPU's next fault, ``uvm_processor_mask_test(accessible_from...)`` fails
  there), and the GPU maps the page remotely (``_gmap``: its accesses cross the link, no fault, no migration) for
  ``thrashing_pin`` lapses (150 ms; 0 forever);
* when every thrashing processor has fast access to the page's current residency (an NVLink host,
  ``GpuSpec.coherent``: ``thrashing_processors_have_fast_access_to``) the page is pinned where it is at once, with
  no throttling.

Approximations: time stamps are the replay's clock at the call plus the fault time the call has accumulated
(``UvmSim.now_ns``); the adaptive lapse (``uvm_perf_lapse_vote_threshold``, 590+) is not modelled; a pin on a
coherent host leaves the page where it is and lets the other processor map it (the CPU through the coherent link,
the GPU remotely).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK

CPU, GPU = 0, 1
"""Processor ids of the detector (``uvm_processor_id_t``: the CPU and the one GPU)."""


@dataclass
class _PageTrack:
    """Per-page tracking of one VA block (``page_thrashing_info_t``)."""

    time: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK))  # last event, ns (0: none)
    events: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=np.int64))
    throttles: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=np.int64))
    period_end: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK))
    not_throttled: np.ndarray = field(default_factory=lambda: np.full(PAGES_PER_BLOCK, -1, dtype=np.int64))
    pinned_until: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK))  # inf: forever
    last_thrashing: float = 0.0


class ThrashingService:
    """The thrashing half of UvmSim (module docstring)."""

    now_ns: float = 0.0
    """The replay's clock at the call being simulated (ns; uvmlab.sim.uvm.replay sets it before each row)."""

    def _thr_setup(self) -> None:
        knobs = self.knobs  # type: ignore[attr-defined]
        self._thr_on = bool(knobs.thrashing_enable)
        lapse = float(knobs.thrashing_lapse_usec) * 1e3
        self._thr_lapse = lapse
        self._thr_nap = lapse * int(knobs.thrashing_nap)
        self._thr_epoch = lapse * int(knobs.thrashing_epoch)
        self._thr_pin = lapse * int(knobs.thrashing_pin) if int(knobs.thrashing_pin) else np.inf
        self._thr_last: dict[int, tuple[float, int]] = {}
        """slot -> (time, processor) of its last tracked migration; only blocks the CPU has migrated to."""
        self._thr: dict[int, _PageTrack] = {}
        """slot -> per-page tracking (created by the different-processor rule)."""
        self._thr_resets: dict[int, int] = {}
        """slot -> epoch resets of its tracking (``thrashing_reset_count``)."""
        self.thrashing_pages_detected = 0
        self.throttled_faults = 0
        self.pinned_pages = 0

    def _thr_now(self) -> float:
        return self.now_ns + self._k.stall_ns  # type: ignore[attr-defined]

    def thr_forget(self, slots: list[int]) -> None:
        """Freed slots (``cudaFree``) lose their tracking."""
        if self._thr_last:
            for s in slots:
                self._thr_last.pop(s, None)
                self._thr.pop(s, None)
                self._thr_resets.pop(s, None)

    def thr_note_gpu(self, s: int, mask: np.ndarray) -> None:
        """A migration of pages ``mask`` of slot ``s`` to the GPU: noted only for blocks the CPU has migrated to
        (a GPU-only block is never tracked, uvm_perf_thrashing.c ``thrashing_event_cb``)."""
        if self._thr_last and s in self._thr_last:
            self.thr_note(s, mask, GPU)

    def thr_note(self, s: int, mask: np.ndarray, dst: int) -> None:
        """A fault or prefetch migration of pages ``mask`` of slot ``s`` to ``dst`` (``thrashing_event_cb``). GPU
        migrations matter only for blocks the CPU has migrated to (the caller checks ``_thr_last``)."""
        if not self._thr_on or not mask.any():
            return
        t = self._thr_now()
        tr = self._thr.get(s)
        if tr is None:
            last = self._thr_last.get(s)
            self._thr_last[s] = (t, dst)
            if last is None or last[1] == dst or t - last[0] > self._thr_lapse or last[0] <= 0:
                return
            tr = self._thr[s] = _PageTrack()
        self._thr_last[s] = (t, dst)
        knobs = self.knobs  # type: ignore[attr-defined]
        seen = mask & (tr.time > 0)
        close = seen & (t - tr.time <= self._thr_lapse)
        tr.events[close] += 1
        newly = close & (tr.events == int(knobs.thrashing_threshold))
        self.thrashing_pages_detected += int(np.count_nonzero(newly))
        if (close & (tr.events >= int(knobs.thrashing_threshold))).any():
            tr.last_thrashing = t
        over = seen & ~close & (tr.events >= int(knobs.thrashing_threshold)) & ~(tr.pinned_until > t)
        tr.time[mask] = t
        if over.any():  # the lapse passed: no longer thrashing (thrashing_reset_page: the throttling count stays)
            tr.events[over] = 0
            tr.time[over] = 0.0
            tr.not_throttled[over] = -1

    def thr_reset(self, s: int, mask: np.ndarray) -> None:
        """A user migration (prefetch, advice) resets the pages' tracking (``thrashing_reset_pages_in_region``)."""
        tr = self._thr.get(s)
        if tr is not None:
            tr.events[mask] = 0
            tr.time[mask] = 0.0
            tr.not_throttled[mask] = -1
            self._unpin(s, mask & (tr.pinned_until > 0))

    def thr_hint(self, s: int, faulted: np.ndarray, requester: int) -> np.ndarray:
        """Apply throttling and pinning to a fault of ``requester`` on pages ``faulted`` of a tracked slot: a wait
        is added to the call's time; pages the hint pins are mapped remotely (GPU) or migrated to the CPU and stay
        there. Return the pages that migrate as usual."""
        tr = self._thr[s]
        knobs = self.knobs  # type: ignore[attr-defined]
        t = self._thr_now()
        if (
            tr.last_thrashing
            and t - tr.last_thrashing > self._thr_epoch
            and not (tr.pinned_until > 0).any()
            and self._thr_resets.get(s, 0) < int(knobs.thrashing_max_resets)
        ):  # the epoch passed: the per-page tracking is dropped (uvm_perf_thrashing_get_hint)
            self._thr_resets[s] = self._thr_resets.get(s, 0) + 1
            del self._thr[s]
            self._thr_last[s] = (0.0, -1)
            return faulted
        expired = (tr.pinned_until > 0) & (tr.pinned_until <= t)
        if expired.any():
            self._unpin(s, expired)
        pinned = faulted & (tr.pinned_until > t)
        hot = faulted & ~pinned & (tr.events >= int(knobs.thrashing_threshold)) & (t - tr.time <= self._thr_lapse)
        pin = pinned.copy()
        if hot.any():
            if bool(self.coherent):  # type: ignore[attr-defined]  # fast access to the residency: pinned at once
                pin |= hot
            else:  # throttling periods (thrashing_throttle_update), then the pin
                new_period = hot & (t > tr.period_end)
                if new_period.any():
                    same = new_period & (tr.not_throttled == requester)
                    tr.period_end[new_period] = t + self._thr_nap
                    tr.not_throttled[new_period] = requester
                    tr.not_throttled[same] = -1
                unset = hot & ~new_period & (tr.not_throttled < 0)
                tr.not_throttled[unset] = requester
                throttle = hot & (tr.not_throttled != requester)
                pin |= hot & ~throttle & (tr.throttles >= int(knobs.thrashing_pin_threshold))
                if throttle.any():
                    wait = float((tr.period_end[throttle] - t).max())
                    self._k.stall_ns += max(0.0, wait)  # type: ignore[attr-defined]
                    tr.throttles[throttle] += 1
                    self.throttled_faults += int(np.count_nonzero(throttle))
        if not pin.any():
            return faulted
        self._pin_here(s, pin, requester, t)
        if requester != GPU:
            return faulted  # the CPU migrates a CPU-pinned page as usual
        return faulted & ~(pin & self._cpu[s])  # type: ignore[attr-defined]  # mapped remotely, not migrated

    def _pin_here(self, s: int, m: np.ndarray, requester: int, t: float) -> None:
        """Pin pages ``m`` (module docstring): a GPU fault maps their CPU copy remotely (``_gmap``), a CPU fault
        migrates them to the CPU as usual; they stay pinned for ``thrashing_pin`` lapses."""
        tr = self._thr[s]
        fresh = m & ~(tr.pinned_until > t)
        tr.pinned_until[fresh] = t + self._thr_pin
        tr.throttles[fresh] = 0
        self.pinned_pages += int(np.count_nonzero(fresh))
        if requester == GPU:
            self._ensure_hint_state()  # type: ignore[attr-defined]
            self._gmap[s] |= m & self._cpu[s]  # type: ignore[attr-defined]
            self._update_pol_any(s)  # type: ignore[attr-defined]

    def _unpin(self, s: int, m: np.ndarray) -> None:
        tr = self._thr[s]
        tr.pinned_until[m] = 0.0
        if self._hint_arrays:  # type: ignore[attr-defined]
            self._gmap[s] &= ~(m & ~self._abg[s])  # type: ignore[attr-defined]
            self._update_pol_any(s)  # type: ignore[attr-defined]
