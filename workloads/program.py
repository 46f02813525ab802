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
* ``uvm.prefetch_new_allocations(True)``: the program's allocator prefetches every new allocation to the GPU;
* ``uvm.stream()`` (a context manager: what runs inside goes on that CUDA stream), ``uvm.event()`` with
  ``e.record()`` / ``uvm.wait(e)``, ``uvm.synchronize()``: streams and events, so a prefetch on a second stream
  overlaps compute (uvmlab.sim.uvm.cuda_streams);
* ``uvm.device_empty(shape, dtype)``: plain device memory (``cudaMalloc``), never managed; ``uvm.memcpy_htod(t)`` /
  ``uvm.memcpy_dtoh(t)``: ``cudaMemcpy`` from or to the host, into managed or device memory.

A declared kernel may also say its native time (``native_ms=``) or its share of peak (``efficiency=``), its dtype,
and, for a gather or scatter, its index (``index=``: a distribution or the rows themselves,
uvmlab.sim.uvm.index_order).

On the capture device (meta) each call is a row of the trace (``uvmlab.trace.schema.KERNEL_OPTIONAL``: ``api``,
``api_arg``, ``order`` and the launch shape) that the UVM replay simulates; torch ops are recorded as in a
training trace. On a GPU the same calls go to a :class:`ProgramBackend` that issues them for real
(``uvmlab.measure.gpu.program_backend``). The recording needs no GPU and no uvmlab import in the user's file.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from uvmlab.errors import InputError, UnavailableError

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
KERNEL_DTYPES = ("fp32", "bf16", "fp16", "fp64", "tf32")
"""``uvm.kernel(dtype=...)``: the math a declared GEMM-like kernel runs in (uvmlab.sim.uvm.kernel_class)."""
INDEX_DISTRIBUTIONS = ("uniform", "zipf", "sorted")
"""``uvm.kernel(index=...)`` distributions (uvmlab.sim.uvm.index_order); or the rows themselves."""
MAX_INDEX_FILE_BYTES = 256 * 1024 * 1024
"""Largest ``.npy`` index file read (256 MiB: 32 M int64 rows, twice the rows a trace keeps)."""


class Stream:
    """A CUDA stream of a program (``uvm.stream()``): ``with s:`` runs what is inside on it (non-blocking, as
    PyTorch's side streams are)."""

    def __init__(self, uvm: Program, number: int) -> None:
        self._uvm, self.number = uvm, number

    def __enter__(self) -> Stream:
        self._prev = self._uvm.current_stream
        self._uvm._set_stream(self.number)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvm._set_stream(self._prev)

    def wait(self, event: Event) -> None:
        """``cudaStreamWaitEvent(this stream, event)``: later work on this stream waits for the event."""
        with self:
            self._uvm.wait(event)

    def __repr__(self) -> str:
        return f"Stream({self.number})"


class Event:
    """A CUDA event of a program (``uvm.event()``)."""

    def __init__(self, uvm: Program, number: int) -> None:
        self._uvm, self.number = uvm, number

    def record(self, stream: Stream | None = None) -> None:
        """``cudaEventRecord(event, stream)`` (default: the current stream)."""
        self._uvm.record(self, stream)

    def __repr__(self) -> str:
        return f"Event({self.number})"


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
        self.current_stream = 0
        self._streams = 0
        self._events = 0
        self._index_keys: dict[str, str] = {}  # sha256 of index rows -> their key in the trace header

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

    def prefetch(
        self,
        t: torch.Tensor,
        to: str = "gpu",
        offset: int = 0,
        nbytes: int | None = None,
        stream: Stream | None = None,
    ) -> None:
        """``cudaMemPrefetchAsync`` of ``t``'s bytes to the GPU or the CPU, on ``stream`` (default: the current
        stream)."""
        if to not in LOCATIONS:
            raise InputError(f"uvm.prefetch(to=...) must be 'gpu' or 'cpu', not {to!r}")
        off, size = self._span(t, offset, nbytes, "prefetch")
        with stream if stream is not None else contextlib.nullcontext():
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

    # ---- streams and events -------------------------------------------------------------------------------------
    def stream(self) -> Stream:
        """A new CUDA stream (``cudaStreamCreateWithFlags(cudaStreamNonBlocking)``): use it as ``with s:``."""
        self._streams += 1
        self._require("create_stream", "uvm.stream()")
        return Stream(self, self._streams)

    def event(self) -> Event:
        """A new CUDA event (``cudaEventCreate``)."""
        self._events += 1
        return Event(self, self._events)

    def record(self, event: Event, stream: Stream | None = None) -> None:
        """``cudaEventRecord(event, stream)`` (default: the current stream)."""
        self._check_event(event)
        with stream if stream is not None else contextlib.nullcontext():
            self._api_row("cudaEventRecord", "event_record", str(event.number))
            self._optional_backend("record_event", event.number)

    def wait(self, event: Event, stream: Stream | None = None) -> None:
        """``cudaStreamWaitEvent(stream, event)``: later work on ``stream`` (default: the current one) waits for
        ``event`` (waiting for an event never recorded returns at once, as in CUDA)."""
        self._check_event(event)
        with stream if stream is not None else contextlib.nullcontext():
            self._api_row("cudaStreamWaitEvent", "event_wait", str(event.number))
            self._optional_backend("wait_event", event.number)

    def synchronize(self) -> None:
        """``cudaDeviceSynchronize``: the host waits for every stream."""
        self._api_row("cudaDeviceSynchronize", "synchronize", "")
        self._optional_backend("synchronize")

    def _set_stream(self, number: int) -> None:
        self.current_stream = number
        if self._recorder is not None:
            self._recorder.stream = number
        self._optional_backend("set_stream", number)

    def _check_event(self, event: Any) -> None:
        if not isinstance(event, Event) or event._uvm is not self:
            raise InputError(f"uvm.record / uvm.wait take an event of this program's uvm.event(), not {event!r}")

    def _api_row(self, name: str, api: str, arg: str) -> None:
        if self._recorder is not None:
            self._recorder.record_api(name, api=api, api_arg=arg)

    def _require(self, method: str, what: str) -> None:
        """Refuse ``what`` on a backend that cannot issue it for real (a GPU run without stream support)."""
        if not isinstance(self._backend, NullBackend) and not hasattr(self._backend, method):
            raise UnavailableError(
                f"{what} is not issued on this GPU path yet ({type(self._backend).__name__} has no {method}); "
                "simulate the program instead (uvmlab run --mode sim)"
            )

    def _optional_backend(self, method: str, *args: Any) -> None:
        fn = getattr(self._backend, method, None)
        if fn is not None:
            fn(*args)

    # ---- device memory and explicit copies ----------------------------------------------------------------------
    def device_empty(self, shape: int | Sequence[int], dtype: Any = None) -> torch.Tensor:
        """Plain device memory (``cudaMalloc``), never managed: it is always on the GPU, never faults and is never
        evicted, and it takes its bytes from the GPU memory UVM may use (uvmlab.uvm.simulate)."""
        import torch

        self._require("device_empty", "uvm.device_empty()")
        maker = getattr(self._backend, "device_empty", None)
        if maker is not None:
            return maker(shape, dtype or torch.float32)
        t = torch.empty(shape, dtype=dtype or torch.float32, device=self.device)
        if self._recorder is not None:
            self._recorder.mark_device(t)
        return t

    def memcpy_htod(self, t: torch.Tensor, offset: int = 0, nbytes: int | None = None) -> None:
        """``cudaMemcpy(..., cudaMemcpyHostToDevice)`` into ``t`` (managed or device memory) from a host buffer, on
        the current stream: managed pages become GPU-resident without faults; the copy takes the link's time."""
        off, size = self._span(t, offset, nbytes, "memcpy_htod")
        self._require("memcpy", "uvm.memcpy_htod()")
        self._record("cudaMemcpyHtoD", [(t, off, size, True)], api="memcpy_htod")
        self._optional_backend("memcpy", t, off, size, "htod")

    def memcpy_dtoh(self, t: torch.Tensor, offset: int = 0, nbytes: int | None = None) -> None:
        """``cudaMemcpy(..., cudaMemcpyDeviceToHost)`` of ``t``'s bytes to a host buffer: non-resident managed pages
        fault in first (the copy engine reads them on the GPU; an approximation, docs/uvm-sim.md)."""
        off, size = self._span(t, offset, nbytes, "memcpy_dtoh")
        self._require("memcpy", "uvm.memcpy_dtoh()")
        self._record("cudaMemcpyDtoH", [(t, off, size, False)], api="memcpy_dtoh")
        self._optional_backend("memcpy", t, off, size, "dtoh")

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
        native_ms: float | None = None,
        efficiency: float | None = None,
        dtype: str | None = None,
        index: Any = None,
        lookups: int | None = None,
    ) -> None:
        """A custom kernel: each of ``threads`` threads walks its own chunk of every tensor (reads, then writes, in
        the order given) in ``pattern`` order, one access every ``stride_bytes``, warps of ``warp_size`` lanes in
        lockstep (uvmlab.trace.schema.ACCESS_ORDERS). ``touched_bytes``: DRAM bytes it moves (default: one 32 B
        sector per access when strided, else the tensors' bytes; the replay's rule). ``gpu``: what runs on a GPU.

        Its native (all-resident) time comes from the class rules (uvmlab.sim.uvm.kernel_class) unless the program
        knows better: ``native_ms`` is its measured time (used as is), ``efficiency`` its share of the peak of its
        bound (0-1]; ``dtype`` the math it runs in (KERNEL_DTYPES). A ``gather`` / ``scatter`` may give its
        ``index``: ``"uniform"``, ``"zipf:A"``, ``"sorted"``, or the rows themselves (a tensor, an array, a list or
        a ``.npy`` file path); ``lookups`` is how many rows it visits (default: the rows of the index, else the first
        dimension of its first write for a gather, of its first read for a scatter)."""
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
        extra: dict[str, Any] = {}
        if native_ms is not None:
            extra["native_ns"] = _positive_number(name, "native_ms", native_ms) * 1e6
        if efficiency is not None:
            eff = _positive_number(name, "efficiency", efficiency)
            if eff > 1:
                raise InputError(f"uvm.kernel {name!r}: efficiency is a share of peak in (0, 1], not {efficiency!r}")
            extra["efficiency"] = eff
        if dtype is not None:
            if dtype not in KERNEL_DTYPES:
                raise InputError(f"uvm.kernel {name!r}: dtype must be one of {', '.join(KERNEL_DTYPES)}, not {dtype!r}")
            extra["dtype"] = dtype
        if index is not None:
            extra["index"] = self._index_spec(name, pattern, index, lookups, reads, writes)
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
            **extra,
        )
        self._backend.kernel(name, list(reads), list(writes), gpu)

    def _index_spec(
        self, name: str, pattern: str, index: Any, lookups: int | None, reads: Sequence[Any], writes: Sequence[Any]
    ) -> str:
        """The ``index`` column of a gather / scatter (uvmlab.sim.uvm.index_order)."""
        import numpy as np

        from uvmlab.sim.uvm.index_order import MAX_INDEX_ROWS, encode_rows, parse_spec

        if pattern not in ("gather", "scatter"):
            raise InputError(f"uvm.kernel {name!r}: index= applies to pattern 'gather' or 'scatter', not {pattern!r}")
        table = (reads if pattern == "gather" else writes)[:1]
        other = (writes if pattern == "gather" else reads)[:1]
        if not table:
            raise InputError(f"uvm.kernel {name!r}: a {pattern} with index= needs its indexed tensor first among its "
                             f"{'reads' if pattern == 'gather' else 'writes'}")  # fmt: skip
        n_rows = int(table[0].shape[0]) if table[0].dim() else 1
        rows = None
        if isinstance(index, str) and index.endswith(".npy"):
            rows = _read_index_file(Path(index))
        elif isinstance(index, str):
            head = index.split(":")[0]
            if head not in INDEX_DISTRIBUTIONS:
                raise InputError(
                    f"uvm.kernel {name!r}: index must be one of {', '.join(INDEX_DISTRIBUTIONS)} (zipf:A), a .npy "
                    f"file or the rows themselves, not {index!r}"
                )
        else:
            rows = _index_rows(name, index)
        if rows is not None:
            if rows.size > MAX_INDEX_ROWS:
                raise InputError(f"uvm.kernel {name!r}: an index of {rows.size:,} rows is more than the "
                                 f"{MAX_INDEX_ROWS:,} a trace keeps; describe it by a distribution")  # fmt: skip
            if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= n_rows):
                raise InputError(
                    f"uvm.kernel {name!r}: index rows must lie in [0, {n_rows}) (the indexed tensor's rows)"
                )
            digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
            key = self._index_keys.get(digest)
            if key is None:  # the same rows in every iteration are kept once
                key = self._index_keys[digest] = str(len(self._index_keys) + 1)
                if self._recorder is not None:
                    self._recorder.index_arrays[key] = encode_rows(np.asarray(rows))
            head, count = f"rows:{key}", int(rows.size)
        else:
            head = index
            count = int(other[0].shape[0]) if other and other[0].dim() else n_rows
        if lookups is not None:
            count = _positive_int("lookups", lookups, allow_zero=True)
        text = f"{head};rows={n_rows};lookups={count}"
        parse_spec(text)  # one sentence now rather than at replay
        return text

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


def _positive_number(name: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(f"uvm.kernel {name!r}: {what} must be a number > 0, not {value!r}")
    return float(value)


def _index_rows(name: str, index: Any) -> Any:
    """An index given as a tensor, an array or a list: its rows as an int64 numpy array."""
    import numpy as np
    import torch

    if isinstance(index, torch.Tensor):
        if index.device.type == "meta":
            raise InputError(f"uvm.kernel {name!r}: an index tensor on the meta device has no values; give the rows "
                             "on the CPU (or a distribution)")  # fmt: skip
        index = index.detach().cpu().numpy()
    try:
        rows = np.asarray(index)
    except (TypeError, ValueError):
        rows = np.asarray([])
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise InputError(f"uvm.kernel {name!r}: index rows must be a 1-D sequence of whole numbers")
    return rows.astype(np.int64)


def _read_index_file(path: Path) -> Any:
    """The rows of a ``.npy`` index file (no pickles: ``allow_pickle=False``)."""
    import io

    import numpy as np

    from uvmlab.files.inputs import read_input_bytes

    data = read_input_bytes(path, MAX_INDEX_FILE_BYTES, "an index file (.npy)")
    try:
        rows = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"index file {path} is not a .npy array ({exc})") from None
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise InputError(f"index file {path} must hold a 1-D array of whole numbers")
    return rows.astype(np.int64)


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
