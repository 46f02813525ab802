"""CUDA streams and events on the replay's clock (issue 41 section 4). Torch-free.

A workload program puts work on a stream (``uvm.stream()``, the trace's ``stream`` column) and orders streams with
events (``api`` rows ``event_record`` / ``event_wait``, ``api_arg`` the event's number) and device synchronisation
(``synchronize``). :class:`StreamClocks` gives each row its start time:

* a row on stream ``s`` starts when ``s``'s previous row ended and not before the host issued it: the host is
  blocked only by a *barrier* (below), so every row issued after a barrier starts no earlier than its end;
* ``event_record`` stores its stream's time under the event; ``event_wait`` moves its stream's clock to the
  recorded time (``cudaStreamWaitEvent``; waiting for an event never recorded returns at once, as CUDA's does);
* a barrier waits for every stream and blocks the host until it ends: ``synchronize`` (``cudaDeviceSynchronize``),
  the host's own work and its reads and writes of managed memory (``host``, ``host_read``, ``host_write``: a
  program synchronises before it touches managed memory on the CPU), and ``cudaMallocManaged`` / ``cudaFree``
  (``cudaFree`` synchronises the device, pytorch#106200).

Every stream a program creates is non-blocking, as PyTorch's are (``c10/cuda/CUDAStream.cpp`` creates its pool with
``cudaStreamNonBlocking``): it does not wait for the default stream's work nor the default stream for it.

* a *transfer* (``TRANSFER_API``: a prefetch, an explicit copy) starts no earlier than the previous transfer's end on
  any stream: the host-device link and the driver's migration path serve one at a time, so two streams' prefetches
  run one after the other, each beside the other streams' kernels.

The UVM state is still changed in trace (issue) order: a prefetch on stream 1 issued before a kernel on stream 0
has migrated its pages when that kernel runs, whatever their times. Approximations (docs/uvm-sim.md "Streams and
events"): a transfer and a faulting kernel on two streams do not share the link's bandwidth (each is charged as if
it had the link), kernels on two streams do not share the SMs (each runs at its native time), and
a tensor allocated inside ``uvm.stream()`` is placed as on the default stream (the caching allocator's per-stream
pools are not modelled).
"""

from __future__ import annotations

STREAM_API = ("event_record", "event_wait", "synchronize")
"""``api`` values of the stream calls (rows that touch no memory)."""
BARRIER_API = ("synchronize", "host", "host_read", "host_write")
"""``api`` values that wait for every stream and block the host (module docstring)."""
TRANSFER_API = ("prefetch", "memcpy_htod", "memcpy_dtoh")
"""``api`` values of the transfers, which run one at a time over all streams (module docstring)."""


class StreamClocks:
    """Per-stream clocks, recorded events and the host's issue time (module docstring)."""

    def __init__(self) -> None:
        self.clock: dict[int, float] = {0: 0.0}
        self.events: dict[str, float] = {}
        self.host = 0.0  # the host is blocked until here (the last barrier's end)
        self.link = 0.0  # the last transfer's end, on any stream

    def now(self) -> float:
        """The time every stream has finished by."""
        return max(self.clock.values())

    def start(self, stream: int, barrier: bool = False) -> float:
        """When a row on ``stream`` starts (a barrier: when every stream has finished)."""
        if barrier:
            return max(self.now(), self.host)
        return max(self.clock.get(stream, 0.0), self.host)

    def finish(self, stream: int, end: float, barrier: bool = False) -> None:
        """A row on ``stream`` ended at ``end`` (a barrier: every stream and the host are at ``end``)."""
        if barrier:
            for s in self.clock:
                self.clock[s] = end
            self.clock[stream] = end
            self.host = end
        else:
            self.clock[stream] = max(self.clock.get(stream, 0.0), end)

    def transfer_start(self, t: float) -> float:
        """When a transfer whose stream is ready at ``t`` starts: after the previous transfer on any stream."""
        return max(t, self.link)

    def transfer_end(self, end: float) -> None:
        """A transfer ended at ``end``."""
        self.link = max(self.link, end)

    def record(self, event: str, t: float) -> None:
        """``cudaEventRecord``: the event completes at ``t`` (its stream's time)."""
        self.events[event] = t

    def wait(self, event: str, t: float) -> float:
        """``cudaStreamWaitEvent``: the waiting stream's time after the wait (``t`` if never recorded)."""
        return max(t, self.events.get(event, t))


__all__ = ["BARRIER_API", "STREAM_API", "TRANSFER_API", "StreamClocks"]
