"""Workload programs: what a workload file can say besides a training loop (docs/workloads.md, "Programs").

A workload file that defines ``program(uvm, cfg, options)`` instead of ``build`` is a *program*: plain Python and
torch on ``uvm.device``, plus the calls of :class:`Program` for what torch cannot say:

* ``uvm.host_write(t)`` / ``uvm.host_read(t)``: the CPU writes or reads a tensor's bytes between kernels;
* ``uvm.prefetch(t, "gpu" | "cpu")``: ``cudaMemPrefetchAsync``;
* ``uvm.advise(t, advice, location)``: ``cudaMemAdvise`` (read-mostly, preferred location, accessed-by, and their
  unset forms);
* ``uvm.kernel(name, reads=..., writes=..., pattern=..., threads=...)``: a custom kernel declared by its access
  pattern (sequential, strided, random, lcg, gather, scatter, tiled), its launch shape and its reads and writes;
* ``uvm.iterations(n)``: the loop of the program (inference, a serving loop, a solver...), any number of times;
* ``uvm.prefetch_new_allocations(True)``: the program's allocator prefetches every new allocation to the GPU.

On the capture device (meta) each call is a row of the trace (``uvmlab.trace.schema.KERNEL_OPTIONAL``: ``api``,
``api_arg``, ``order`` and the launch shape) that the UVM replay simulates; torch ops are recorded as in a
training trace. On a GPU the same calls go to a :class:`ProgramBackend` that issues them for real
(``uvmlab.measure.gpu.program_backend``). The recording needs no GPU and no uvmlab import in the user's file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from uvmlab.errors import InputError

if TYPE_CHECKING:
    import torch

    from uvmlab.config import WorkloadConfig
    from uvmlab.trace.recorder import Recorder

PATTERNS = ("sequential", "strided", "random", "lcg", "gather", "scatter", "tiled", "address")
"""Access patterns a custom kernel may declare (``uvmlab.trace.schema.ACCESS_ORDERS`` less "")."""
ADVICES = (
    "set_read_mostly",
    "unset_read_mostly",
    "set_preferred_location",
    "unset_preferred_location",
    "set_accessed_by",
    "unset_accessed_by",
)
"""``cudaMemAdvise`` advices (CUDA runtime API ``cudaMemoryAdvise``: cudaMemAdviseSetReadMostly ... UnsetAccessedBy)."""
LOCATED = ("set_preferred_location", "set_accessed_by", "unset_accessed_by")
"""Advices that name a processor (the ``device`` / ``cudaMemLocation`` argument); the others ignore it."""
LOCATIONS = ("gpu", "cpu")
PROGRAM_PHASE = "compute"
"""Phase of every kernel inside ``uvm.iterations()`` (a program has no forward/backward/optimizer)."""
DEFAULT_WARP = 32
"""Threads per warp on every NVIDIA GPU so far (CUDA C++ Programming Guide, "SIMT Architecture")."""
DEFAULT_STRIDE = 4096
"""Default bytes between one thread's consecutive accesses: one access per 4 KiB page."""


class ProgramBackend(Protocol):
    """What must really happen on a GPU for a program's calls (a capture on meta needs none of it)."""

    def host_access(self, t: torch.Tensor, offset: int, nbytes: int, write: bool) -> None: ...

    def prefetch(self, t: torch.Tensor, offset: int, nbytes: int, to: str) -> None: ...

    def advise(self, t: torch.Tensor, offset: int, nbytes: int, advice: str) -> None: ...

    def kernel(
        self, name: str, reads: list[torch.Tensor], writes: list[torch.Tensor], gpu: Callable[[], None] | None
    ) -> None: ...

    def prefetch_new_allocations(self, on: bool) -> None: ...


class NullBackend:
    """The backend of a capture: nothing happens beyond the recorded rows."""

    def host_access(self, t: Any, offset: int, nbytes: int, write: bool) -> None:
        return None

    def prefetch(self, t: Any, offset: int, nbytes: int, to: str) -> None:
        return None

    def advise(self, t: Any, offset: int, nbytes: int, advice: str) -> None:
        return None

    def kernel(self, name: str, reads: list[Any], writes: list[Any], gpu: Callable[[], None] | None) -> None:
        return None

    def prefetch_new_allocations(self, on: bool) -> None:
        return None


def _positive_int(name: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise InputError(f"uvm.kernel {name} must be a whole number >= {0 if allow_zero else 1}, not {value!r}")
    return value


class Program:
    """The ``uvm`` object a program receives (module docstring). ``recorder``: the capture's recorder (None on a
    GPU run); ``backend``: what issues the calls for real (``NullBackend`` in a capture)."""

    def __init__(
        self,
        device: Any,
        cfg: WorkloadConfig,
        recorder: Recorder | None = None,
        backend: ProgramBackend | None = None,
        phase_hook: Callable[[str, int], None] | None = None,
    ) -> None:
        import torch

        self.device = torch.device(device)
        self.cfg = cfg
        self._recorder = recorder
        self._backend: ProgramBackend = backend or NullBackend()
        self._hook = phase_hook
        self.iteration = -1

    # ---- the loop ----------------------------------------------------------------------------------------------
    def iterations(self, n: int | None = None) -> Iterator[int]:
        """Yield 0..n-1 (default ``cfg.iterations``); what runs inside iteration ``i`` is labelled with it."""
        count = self.cfg.iterations if n is None else n
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InputError(f"uvm.iterations(n) needs a whole number n >= 0, not {count!r}")
        mark = getattr(self._backend, "mark_iteration", None)  # a GPU backend times iterations
        first = self.iteration + 1
        try:
            for _ in range(count):
                self.iteration += 1
                if self._recorder is not None:
                    self._recorder.set_phase(PROGRAM_PHASE, self.iteration)
                if self._hook is not None:
                    self._hook(PROGRAM_PHASE, self.iteration)
                if mark is not None:
                    mark(self.iteration)
                yield self.iteration
        finally:  # also when the loop is left by break: its last iteration ends here, not at the program's return
            if self._recorder is not None and self.iteration >= first:
                self._recorder.end_loop(self.iteration)
            if mark is not None:  # the GPU backend's last iteration ends here too
                mark(-1)

    # ---- host accesses and CUDA calls --------------------------------------------------------------------------
    def host_write(self, t: torch.Tensor, offset: int = 0, nbytes: int | None = None) -> None:
        """The CPU writes ``nbytes`` of ``t`` from byte ``offset`` (default: all of it)."""
        off, size = self._span(t, offset, nbytes, "host_write")
        self._record("host_write", [(t, off, size, True)], api="host_write")
        self._backend.host_access(t, off, size, True)

    def host_read(self, t: torch.Tensor, offset: int = 0, nbytes: int | None = None) -> None:
        """The CPU reads ``nbytes`` of ``t`` from byte ``offset`` (default: all of it)."""
        off, size = self._span(t, offset, nbytes, "host_read")
        self._record("host_read", [(t, off, size, False)], api="host_read")
        self._backend.host_access(t, off, size, False)

    def prefetch(self, t: torch.Tensor, to: str = "gpu", offset: int = 0, nbytes: int | None = None) -> None:
        """``cudaMemPrefetchAsync`` of ``t``'s bytes to the GPU or the CPU, on the current stream."""
        if to not in LOCATIONS:
            raise InputError(f"uvm.prefetch(to=...) must be 'gpu' or 'cpu', not {to!r}")
        off, size = self._span(t, offset, nbytes, "prefetch")
        self._record("cudaMemPrefetchAsync", [(t, off, size, False)], api="prefetch", api_arg=to)
        self._backend.prefetch(t, off, size, to)

    def advise(
        self, t: torch.Tensor, advice: str, location: str | None = None, offset: int = 0, nbytes: int | None = None
    ) -> None:
        """``cudaMemAdvise(ptr, size, advice, location)``: ``advice`` one of ADVICES; ``location`` "gpu" or "cpu"
        for the advices that name a processor (LOCATED), else omitted."""
        if advice not in ADVICES:
            raise InputError(f"uvm.advise: unknown advice {advice!r}; known: {', '.join(ADVICES)}")
        if advice in LOCATED:
            if location not in LOCATIONS:
                raise InputError(f"uvm.advise({advice!r}) needs location 'gpu' or 'cpu', not {location!r}")
            arg = f"{advice}:{location}"
        else:
            if location is not None:
                raise InputError(f"uvm.advise({advice!r}) takes no location (got {location!r})")
            arg = advice
        off, size = self._span(t, offset, nbytes, "advise")
        self._record("cudaMemAdvise", [(t, off, size, False)], api="advise", api_arg=arg)
        self._backend.advise(t, off, size, arg)

    def prefetch_new_allocations(self, on: bool = True) -> None:
        """From now on every new allocation is prefetched to the GPU right after it is made (an allocator that calls
        ``cudaMemPrefetchAsync`` after each ``cudaMallocManaged``), until called with False."""
        if self._recorder is not None:
            self._recorder.prefetch_new_allocations = bool(on)
        self._backend.prefetch_new_allocations(bool(on))

    # ---- custom kernels ----------------------------------------------------------------------------------------
    def kernel(
        self,
        name: str,
        reads: Sequence[torch.Tensor] = (),
        writes: Sequence[torch.Tensor] = (),
        *,
        pattern: str = "sequential",
        threads: int | None = None,
        warp_size: int = DEFAULT_WARP,
        stride_bytes: int = DEFAULT_STRIDE,
        seed: int = 0,
        flops: float = 0.0,
        touched_bytes: float | None = None,
        gpu: Callable[[], None] | None = None,
    ) -> None:
        """A custom kernel: each of ``threads`` threads walks its own chunk of every tensor (reads, then writes, in
        the order given) in ``pattern`` order, one access every ``stride_bytes``, warps of ``warp_size`` lanes in
        lockstep (uvmlab.trace.schema.ACCESS_ORDERS). ``touched_bytes``: DRAM bytes it moves (default: one 32 B
        sector per access when strided, else the tensors' bytes; the replay's rule). ``gpu``: what runs on a GPU."""
        if not isinstance(name, str) or not name:
            raise InputError("uvm.kernel needs a name (a non-empty string)")
        if pattern not in PATTERNS:
            raise InputError(f"uvm.kernel pattern must be one of {', '.join(PATTERNS)}, not {pattern!r}")
        n_threads = 0 if threads is None else _positive_int("threads", threads)
        _positive_int("warp_size", warp_size)
        _positive_int("stride_bytes", stride_bytes)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InputError(f"uvm.kernel seed must be a whole number >= 0, not {seed!r}")
        if not reads and not writes:
            raise InputError(f"uvm.kernel {name!r} reads and writes nothing")
        spans = [(t, *self._span(t, 0, None, name), False) for t in reads]
        spans += [(t, *self._span(t, 0, None, name), True) for t in writes]
        self._record(
            name,
            spans,
            order=pattern,
            threads=n_threads,
            warp_size=warp_size,
            stride_bytes=stride_bytes,
            seed=seed,
            flops=float(flops),
            touched_bytes=float("nan") if touched_bytes is None else float(touched_bytes),
        )
        self._backend.kernel(name, list(reads), list(writes), gpu)

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _span(self, t: Any, offset: int, nbytes: int | None, what: str) -> tuple[int, int]:
        """(offset, size) in bytes within ``t``'s own span (a view's elements, as the recorder sees them)."""
        import torch

        if not isinstance(t, torch.Tensor):
            raise InputError(f"uvm.{what} takes a torch tensor, not {type(t).__name__}")
        if t.device.type != self.device.type:
            raise InputError(f"uvm.{what}: the tensor is on {t.device}, not on uvm.device ({self.device})")
        span = t.numel() * t.element_size() if t.is_contiguous() else _view_span(t)
        size = span - offset if nbytes is None else nbytes
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or size < 0 or offset + size > span:
            raise InputError(f"uvm.{what}: bytes {offset}..{offset + size} lie outside the tensor's {span} bytes")
        return offset, size

    def _record(self, name: str, spans: list[tuple[Any, int, int, bool]], **columns: Any) -> None:
        if self._recorder is not None:
            self._recorder.record_call(name, spans, **columns)


def _view_span(t: Any) -> int:
    """Bytes from a strided view's first element to the end of its last one."""
    if t.numel() == 0:
        return 0
    elems = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True) if s > 0)
    return elems * t.element_size()


def run_program(spec: Any, cfg: WorkloadConfig, device: Any, backend: ProgramBackend | None = None) -> Program:
    """Run a program workload's ``program(uvm, cfg, options)`` (``spec``: its workloads.base.WorkloadSpec) on
    ``device`` with ``backend`` (a GPU run: uvmlab.measure.gpu.worker); return its :class:`Program`."""
    uvm = Program(device, cfg, backend=backend)
    spec.run_program(uvm, cfg)
    return uvm
