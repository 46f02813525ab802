"""The recorder: a TorchDispatchMode that turns the aten ops of a training run into Trace tables.

Storage lifetimes: every tensor output of an op whose storage (``untyped_storage()``) has not been seen is a new
allocation of ``storage.nbytes()`` bytes, made by that op. PyTorch preserves a storage's Python object for as
long as its C++ StorageImpl lives (PyObject preservation), so a ``weakref.ref`` callback on it fires exactly when
the StorageImpl dies: that is the free (verified by tests/test_trace_recorder.py; torch.distributed._tools.
mem_tracker uses the same mechanism). Only storages on the capture device are recorded (the CPU ``step`` scalars
of Adam are not GPU memory). Zero-byte storages are not allocations (the CUDA caching allocator returns nullptr).
A storage that PyTorch creates without a dispatched op (``torch.tensor(0, device=...)`` literals such as
BatchNorm's ``num_batches_tracked``) is recorded when an op first touches it, attributed to that op (or
``<external>`` when it is only read).

Kernels: one per leaf aten op the mode sees that touches a storage on the capture device, except view and
metadata ops (``NO_KERNEL`` and every op whose schema is a view), which launch nothing on CUDA. This
approximates CUDA kernels: a CUDA op may launch several kernels (e.g. a reduction's two passes) or none (a
no-op copy); foreach ops are one "kernel" per call. Accesses: for each kernel, the byte range of each storage
it reads (tensor arguments) and writes (outputs and arguments the schema marks as mutated; in-place ops also
read their ``self`` unless they only overwrite it, like ``copy_``/``fill_``/``zero_``/``out=``). A view's range
starts at ``storage_offset * itemsize`` and spans its strided extent. What the CUDA kernel would allocate inside
itself (a contiguous copy, a reduction's staging buffer, an attention workspace) goes into the kernel's
``temporaries`` column (``uvmlab.trace.internal_rules``); the orchestrator turns it into allocations.

One global sequence counter orders allocations, frees and kernels.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from uvmlab.errors import InvariantError
from uvmlab.trace import meta_memo
from uvmlab.trace.flops import estimate_flops
from uvmlab.trace.internal_allocs import mark_prefetched
from uvmlab.trace.internal_rules import temporaries
from uvmlab.trace.schema import KERNEL_OPTIONAL, NEVER_FREED, SCHEMAS, kernel_schema
from uvmlab.trace.strides import extent_elements, gemm_operand_layout, strided_columns

aten = torch.ops.aten
NO_KERNEL = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "detach",
        "alias",
        "lift_fresh",
        "set_",
        "resize_",
        "_local_scalar_dense",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_contiguous",
        "sym_is_contiguous",
        "record_stream",
        "_version",
        "_conj",
        "_neg_view",
        "resolve_conj",
        "resolve_neg",
        "_unsafe_view",
    }
)
"""Ops that launch no kernel (allocation, aliasing and metadata only)."""
WRITE_ONLY = frozenset(
    {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_", "_foreach_zero_"}
)
"""In-place ops that overwrite their ``self`` without reading it."""


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
"""torch dtype name -> the kernel ``dtype`` column (uvmlab.trace.schema.KERNEL_OPTIONAL)."""


def _dtype_name(dtype: torch.dtype | None, outs: list[Any]) -> str:
    """The kernel ``dtype`` column: the first floating-point input's dtype (under autocast the inputs are already
    cast), else the first floating-point output's; "" when the op has none."""
    if dtype is None:
        dtype = next((t.dtype for t in outs if t.is_floating_point()), None)
    return "" if dtype is None else DTYPE_NAMES.get(str(dtype).removeprefix("torch."), "")


GEMM_LAYOUT_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_"})
"""aten ops whose two matrix operands (the last two positional arguments) get the kernel column ``layout``."""


def _gemm_layout(func: Any, args: tuple[Any, ...]) -> str:
    """The ``layout`` column of a GEMM: the BLAS layouts of its two matrices or batches of matrices
    (``strides.gemm_operand_layout``, e.g. ``"nt"`` for ``x @ w.t()``); "" for other ops or when either is neither
    layout."""
    if func._opname not in GEMM_LAYOUT_OPS or len(args) < 2:
        return ""
    mats = args[-2:]
    if not all(isinstance(t, torch.Tensor) for t in mats):
        return ""
    out = "".join(gemm_operand_layout(tuple(t.shape), tuple(t.stride())) for t in mats)
    return out if len(out) == 2 else ""


def _arg_info(func: torch._ops.OpOverload) -> tuple[tuple[str, bool], ...]:
    """(name, is_mutated) of each schema argument."""
    return tuple((a.name, a.alias_info is not None and a.alias_info.is_write) for a in func._schema.arguments)


class Recorder(TorchDispatchMode):
    """Records allocations, frees, kernels and accesses of everything run under it (see the module docstring)."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.seq = 0
        self.phase = "setup"
        self.iteration = -1
        self.closed = False
        self.boundaries: list[tuple[int, str, int]] = []
        self.loop_ends: list[tuple[int, int]] = []  # (seq, last iteration) of each workload program loop's end
        # allocation columns, indexed by alloc_id
        self.a_size: list[int] = []
        self.a_alloc_seq: list[int] = []
        self.a_free_seq: list[int] = []
        self.a_phase: list[str] = []
        self.a_iter: list[int] = []
        self.a_op: list[str] = []
        self._live: dict[int, int] = {}  # StorageImpl address -> alloc_id
        self._refs: dict[int, weakref.ref] = {}  # StorageImpl address -> weakref with the free callback
        # kernel and access columns
        self.k_seq: list[int] = []
        self.k_name: list[str] = []
        self.k_phase: list[str] = []
        self.k_iter: list[int] = []
        self.k_flops: list[float] = []
        self.k_stream: list[int] = []
        self.stream = 0  # the CUDA stream new rows run on (workloads.program: uvm.stream())
        self.x_kernel: list[int] = []
        self.x_alloc: list[int] = []
        self.x_offset: list[int] = []
        self.x_size: list[int] = []
        self.x_write: list[bool] = []
        self.k_extra: dict[str, dict[int, Any]] = {}  # optional kernel columns (KERNEL_OPTIONAL), by kernel_id
        self.prefetch_new_allocations = False  # workloads.program: every new allocation is prefetched to the GPU
        self.device_allocs: list[int] = []  # workloads.program: allocations that are plain device memory (not managed)
        self.index_arrays: dict[str, Any] = {}  # workloads.program: gather/scatter index rows by key (trace header)
        self._arg_cache: dict[Any, tuple[tuple[str, bool], ...]] = {}
        self._skip_cache: dict[Any, bool] = {}
        self._label: str | None = None
        self.temporaries_failed: Counter[str] = Counter()
        """Ops whose kernel-temporary rule raised (``uvmlab.trace.internal_rules``): the capture goes on without
        their temporaries and says so in the header's notes."""

    @contextlib.contextmanager
    def attributing(self, op: str) -> Iterator[None]:
        """Attribute the allocations (and kernels) of the ops run inside to ``op``: an emulated op, e.g. the
        ``aten::nonzero`` that ``uvmlab.trace.emulate.DataDependentEmulation`` builds from ``empty`` (which
        launches no kernel, so the emulated op has none either; its outputs' first users are recorded)."""
        prev, self._label = self._label, op
        try:
            yield
        finally:
            self._label = prev

    # ---- phases --------------------------------------------------------------------------------------------
    def set_phase(self, phase: str, iteration: int) -> None:
        """Label what follows with ``phase`` and ``iteration`` (records the boundary's sequence number)."""
        self.phase, self.iteration = phase, iteration
        self.boundaries.append((self.seq, phase, iteration))

    def end_loop(self, iteration: int) -> None:
        """A workload program's loop (``uvm.iterations()``, workloads.program) ended after ``iteration``: that
        iteration ends here, not where the program returns (the categories of its tensors: uvmlab.trace.capture)."""
        self.loop_ends.append((self.seq, iteration))

    def _next(self) -> int:
        s = self.seq
        self.seq += 1
        return s

    # ---- storages ------------------------------------------------------------------------------------------
    def alloc_id(self, t: torch.Tensor) -> int | None:
        """The allocation holding tensor ``t``'s storage (None if not recorded)."""
        return self._live.get(t.untyped_storage()._cdata)

    def _on_free(self, key: int, _ref: weakref.ref) -> None:
        if self.closed:
            return
        aid = self._live.pop(key, None)
        self._refs.pop(key, None)
        if aid is not None:
            self.a_free_seq[aid] = self._next()

    def _track(self, t: torch.Tensor, op: str) -> int | None:
        if t.device.type != self.device_type:
            return None
        st = t.untyped_storage()
        key = st._cdata
        aid = self._live.get(key)
        nbytes = st.nbytes()
        if aid is not None:
            if nbytes == self.a_size[aid]:
                return aid
            # the storage was resized in place: on CUDA that is a new allocation and a free of the old one
            self.a_free_seq[aid] = self._next()
            del self._live[key]
        if nbytes == 0:
            return None
        aid = len(self.a_size)
        self.a_size.append(nbytes)
        self.a_alloc_seq.append(self._next())
        self.a_free_seq.append(NEVER_FREED)
        self.a_phase.append(self.phase)
        self.a_iter.append(self.iteration)
        self.a_op.append(op)
        self._live[key] = aid
        if key not in self._refs:
            self._refs[key] = weakref.ref(st, lambda r, k=key: self._on_free(k, r))
        if self.prefetch_new_allocations:
            self._add_kernel("cudaMemPrefetchAsync", [(aid, 0, nbytes, False)], api="prefetch", api_arg="gpu")
        return aid

    # ---- dispatch ------------------------------------------------------------------------------------------
    def _is_skip(self, func: torch._ops.OpOverload) -> bool:
        skip = self._skip_cache.get(func)
        if skip is None:
            skip = func._opname in NO_KERNEL or func.is_view
            self._skip_cache[func] = skip
        return skip

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.device_type == "meta" and isinstance(func, torch._ops.OpOverload):
            out = meta_memo.call(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if self.closed or not isinstance(func, torch._ops.OpOverload):
            return out
        opname = self._label or f"{func.namespace}::{func._opname}"
        out_tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        for t in out_tensors:
            self._track(t, opname)
        if self._is_skip(func):
            return out
        self._record_kernel(func, opname, args, kwargs, out, out_tensors)
        return out

    def _range(self, t: torch.Tensor, aid: int) -> tuple[int, int] | None:
        span = extent_elements(t.shape, t.stride())
        if span == 0:
            return None
        item = t.element_size()
        off = t.storage_offset() * item
        return off, max(0, min(span * item, self.a_size[aid] - off))

    def _record_kernel(
        self, func: Any, opname: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, outs: list[Any]
    ) -> None:
        info = self._arg_cache.get(func)
        if info is None:
            info = self._arg_cache[func] = _arg_info(func)
        rows: dict[tuple[int, int, int, bool], None] = {}
        operands: list[tuple[tuple[int, ...], tuple[int, ...], int, int]] = []
        dtype: torch.dtype | None = None  # the first floating-point input's: what a GEMM computes in
        inplace_reads = func._opname not in WRITE_ONLY
        for i, (name, mutated) in enumerate(info):
            if i < len(args):
                value = args[i]
            elif name in kwargs:
                value = kwargs[name]
            else:
                continue
            for t in tree_leaves(value):
                if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                    continue
                if dtype is None and t.is_floating_point():
                    dtype = t.dtype
                aid = self._track(t, "<external>")
                if aid is None:
                    continue
                r = self._range(t, aid)
                if r is None:
                    continue
                operands.append((tuple(t.shape), tuple(t.stride()), t.element_size(), r[1]))
                if mutated:
                    rows[(aid, r[0], r[1], True)] = None
                    if inplace_reads and name != "out":
                        rows[(aid, r[0], r[1], False)] = None
                        operands.append(operands[-1])  # read and written: moved twice
                else:
                    rows[(aid, r[0], r[1], False)] = None
        for t in outs:
            aid = self._track(t, opname)
            if aid is None:
                continue
            r = self._range(t, aid)
            if r is not None:
                rows[(aid, r[0], r[1], True)] = None
                operands.append((tuple(t.shape), tuple(t.stride()), t.element_size(), r[1]))
        if not rows:
            return  # touches nothing on the capture device (e.g. Adam's CPU step counters)
        stride_b, touched_b = strided_columns(operands)
        try:
            temps = temporaries(func, args, kwargs, outs)
        except (TypeError, ValueError, IndexError, RuntimeError):  # an argument form no rule foresaw
            self.temporaries_failed[opname] += 1
            temps = ""
        if temps and self.prefetch_new_allocations:
            temps = mark_prefetched(temps)  # the orchestrator prefetches them as it does the op's outputs
        layout = _gemm_layout(func, args)
        self._add_kernel(
            opname,
            list(rows),
            flops=estimate_flops(func, args, kwargs, out),
            stride_bytes=stride_b,
            touched_bytes=touched_b,
            dtype=_dtype_name(dtype, outs),
            **({"temporaries": temps} if temps else {}),
            **({"layout": layout} if layout else {}),
        )

    def record_call(self, name: str, spans: list[tuple[torch.Tensor, int, int, bool]], **columns: Any) -> None:
        """One row that is not an aten op: a workload program's API call, host access or declared kernel
        (workloads.program). ``spans``: (tensor, byte offset within the tensor's span, bytes, is_write);
        ``columns``: ``flops`` and optional kernel columns (uvmlab.trace.schema.KERNEL_OPTIONAL)."""
        rows = []
        for t, off, size, w in spans:
            aid = self._track(t, "<external>")
            if aid is None or size <= 0:
                continue
            base = t.storage_offset() * t.element_size()
            rows.append((aid, base + off, max(0, min(size, self.a_size[aid] - base - off)), w))
        if rows:
            self._add_kernel(name, rows, **columns)

    def record_api(self, name: str, **columns: Any) -> None:
        """A row that touches no memory (a stream or event call of a workload program, workloads.program)."""
        self._add_kernel(name, [], **columns)

    def mark_device(self, t: torch.Tensor) -> None:
        """``t``'s allocation is plain device memory (``cudaMalloc``), not managed (workloads.program)."""
        aid = self._track(t, "<external>")
        if aid is not None and aid not in self.device_allocs:
            self.device_allocs.append(aid)

    def program_header(self) -> dict[str, Any]:
        """What a workload program adds to the trace header: ``device_allocations`` (alloc ids of plain device
        memory) and ``kernel_indices`` (gather/scatter index rows, uvmlab.sim.uvm.index_order.encode_rows)."""
        out: dict[str, Any] = {}
        if self.device_allocs:
            out["device_allocations"] = sorted(self.device_allocs)
        if self.index_arrays:
            out["kernel_indices"] = dict(self.index_arrays)
        return out

    def _add_kernel(
        self, name: str, rows: list[tuple[int, int, int, bool]], flops: float = 0.0, **columns: Any
    ) -> None:
        kid = len(self.k_seq)
        self.k_seq.append(self._next())
        self.k_name.append(name)
        self.k_phase.append(self.phase)
        self.k_iter.append(self.iteration)
        self.k_flops.append(float(flops))
        self.k_stream.append(self.stream)
        for col, value in columns.items():
            if col not in KERNEL_OPTIONAL:
                raise InvariantError(f"recorder: unknown kernel column {col!r}")
            self.k_extra.setdefault(col, {})[kid] = value
        for aid, off, size, w in rows:
            self.x_kernel.append(kid)
            self.x_alloc.append(aid)
            self.x_offset.append(off)
            self.x_size.append(size)
            self.x_write.append(w)

    # ---- results -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop recording: later frees (tearing down the model) are not part of the trace."""
        self.closed = True

    def tables(self, categories: list[str]) -> dict[str, pd.DataFrame]:
        """The three trace tables (``categories`` gives each allocation's category, by alloc_id).

        Each column goes straight from its list into Arrow with the table's schema, then to pandas: a fresh capture
        has exactly the dtypes ``read_trace`` gives (2.3 ms on a GPUMemNet MLP row's capture, where building frames
        first and sending them through Arrow took 10.0 ms)."""
        n, n_k = len(self.a_size), len(self.k_seq)
        columns: dict[str, dict[str, Any]] = {
            "allocations": {
                "alloc_id": range(n),
                "size_bytes": self.a_size,
                "alloc_seq": self.a_alloc_seq,
                "free_seq": self.a_free_seq,
                "category": categories,
                "phase": self.a_phase,
                "iteration": self.a_iter,
                "op": self.a_op,
                "stream": [0] * n,
            },
            "kernels": {
                "kernel_id": range(n_k),
                "seq": self.k_seq,
                "name": self.k_name,
                "phase": self.k_phase,
                "iteration": self.k_iter,
                "flops": self.k_flops,
                "stream": self.k_stream,
            },
            "accesses": {
                "kernel_id": self.x_kernel,
                "alloc_id": self.x_alloc,
                "offset_bytes": self.x_offset,
                "size_bytes": self.x_size,
                "is_write": self.x_write,
            },
        }
        for col, (_, default) in KERNEL_OPTIONAL.items():
            given = self.k_extra.get(col, {})
            columns["kernels"][col] = [given.get(k, default) for k in range(n_k)]
        out = {}
        for name, values in columns.items():
            schema = kernel_schema() if name == "kernels" else SCHEMAS[name]
            arrays = [pa.array(values[f.name], type=f.type, from_pandas=True) for f in schema]
            out[name] = pa.Table.from_arrays(arrays, schema=schema).to_pandas()
        return out
