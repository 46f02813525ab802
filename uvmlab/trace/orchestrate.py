"""The memory orchestrator: turn a capture-device trace into the allocation sequence CUDA would see.

The trace captured on ``meta`` (uvmlab/trace/capture.py) already runs the same Python program a GPU would, with
CUDA's choices emulated at capture time (foreach Adam/AdamW, efficient/flash SDPA: see ``trace.header["notes"]``),
so this module does NOT touch those. What a capture device cannot show, and what this module adds or enforces,
follows xMem's "Memory Orchestrator" (seed ../shared/seeds/000_c806bc4d9cb08112.txt, section 3.3) and
reference/allocator.md sections 2.18 and 6:

- ``persist_parameters``: parameters live for the whole run (xMem rule 1, ``model.to(device)``).
- ``gradients_until_zero_grad``: parameter gradients live until the next ``optimizer.zero_grad()`` (xMem rule 4).
- ``optimizer_state_persists``: optimizer state allocated at the first step lives to the end (xMem rule 5).
- ``cublas_workspace``: one cuBLAS workspace per stream, allocated THROUGH the caching allocator at the first
  cuBLAS call on that stream and kept for the life of the process (PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp
  ``setWorkspaceForHandle`` / ``getChosenWorkspaceSize``; size from ``CUBLAS_WORKSPACE_CONFIG`` or the default
  ``:4096:2:16:8`` = 8 MiB + 128 KiB, 32 MiB on sm90 / Hopper).
- ``cublaslt_workspace``: one cuBLASLt workspace per stream (``getCUDABlasLtWorkspace``), default
  ``CUBLASLT_WORKSPACE_SIZE`` = 1024 KiB capped at the cuBLAS workspace, allocated at the first addmm-like op
  (``addmm``/``_addmm_activation``/``_scaled_mm``: the ops that take the Lt path; APPROXIMATION: the real choice
  depends on shapes, dtypes and bias layout).
- ``cudnn_workspace``: a temporary workspace per cuDNN call (forward; backward-data and backward-filter), allocated
  through the caching allocator by PyTorch's ``run_conv_plan`` and freed when the call returns
  (aten/src/ATen/native/cudnn/Conv_v8.cpp); with ``cudnn_benchmark`` a trial workspace before the first call of
  each distinct convolution (``generate_and_filter_plans``). APPROXIMATION: the size depends on the engine cuDNN
  picks; we take the largest tensor the call touches, capped at ``cudnn_workspace_cap_bytes`` (an upper envelope
  of the real per-call sizes seen, not a per-layer prediction: docs/estimate.md "Real cuDNN workspaces per
  call"), and the benchmark trial as everything available (an upper bound); see ``rule_cudnn_workspace``.
- ``kernel_temporaries``: what a CUDA kernel allocates inside itself and frees before it returns, which the meta
  kernel the capture ran does not (a contiguous copy of a strided input, a reduction's staging buffer and
  semaphores, embedding backward's sort buffers, attention backward's workspace...): the capture lists them in
  the kernels' ``temporaries`` column (``uvmlab.trace.internal_rules``, each rule with its PyTorch source), this
  rule sizes the GPU-dependent ones for the GPU's SMs (``uvmlab.trace.internal_allocs.resolve``) and inserts each
  as a ``temporary`` allocation inside the op; see ``rule_kernel_temporaries``.
- CUDA context: NOT an allocator allocation; it is recorded as ``header["orchestration"]["context_bytes"]``
  (``gpu.context_bytes``) so that device-level accounting (estimate, UVM sim) subtracts it from the capacity.

The "extend only" rules (params, grads, optimizer state) never shorten a lifetime the capture recorded; on
uvmlab's own meta captures they are expected to change nothing (the counts are in ``header["orchestration"]
["changes"]``), and they matter for traces whose lifetimes come from elsewhere (CPU profiles, user files).
This module never imports torch.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.config import compute_dtype
from uvmlab.errors import InputError
from uvmlab.gpus import GpuSpec, sm_info
from uvmlab.trace.cudnn_conv import (
    CUDNN_WORKSPACE_CAP_BYTES,
    ELEMENT_BYTES,
    WORKSPACE_MODELS,
    ConvGeometry,
    candidate_workspaces,
    conv_geometry,
    workspace_sizes,
)
from uvmlab.trace.internal_allocs import COLUMN as TEMPORARIES_COLUMN
from uvmlab.trace.internal_allocs import decode, resolve
from uvmlab.trace.schema import KERNEL_OPTIONAL, NEVER_FREED, Trace
from uvmlab.units import KiB

CUBLAS_DEFAULT_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""``:4096:2:16:8`` = 8,519,680 B: PyTorch ``parseChosenWorkspaceSize`` default for non-sm90 GPUs."""
CUBLAS_SM90_WORKSPACE_BYTES = 4096 * 8 * 1024
"""32 MiB: the same function's default on sm90 (H100/H200/GH200)."""
CUBLASLT_DEFAULT_WORKSPACE_BYTES = 1024 * KiB
"""``parseCUDABlasLtWorkspaceSize`` default (1024 KiB, PyTorch issue #73328), capped at the cuBLAS workspace."""
SM90_PREFIXES = ("H100", "H200", "GH200")
"""GpuSpec names of compute capability 9.0 GPUs (uvmlab/gpus.py)."""
CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr", "_addmm_activation",
     "_scaled_mm", "matmul", "linear", "_int_mm"}
)  # fmt: skip
"""Leaf aten ops that call cuBLAS/cuBLASLt on CUDA (aten/src/ATen/native/cuda/Blas.cpp)."""
CUBLASLT_OPS = frozenset({"addmm", "_addmm_activation", "_scaled_mm"})
"""Ops that go through ``gemm_and_bias``/cuBLASLt (approximation, see the module docstring)."""
CONV_OPS = frozenset(
    {"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose", "convolution_backward",
     "conv1d", "conv2d", "conv3d", "cudnn_convolution_relu", "cudnn_convolution_add_relu"}
)  # fmt: skip
"""Leaf aten ops that run cuDNN convolutions on CUDA."""
_OP_RE = re.compile(r"^(?:aten(?:::|\.))?([A-Za-z0-9_]+)")


@functools.lru_cache(maxsize=8192)
def op_base(name: str) -> str:
    """``"aten::mm"`` / ``"aten.mm.default"`` / ``"mm"`` -> ``"mm"`` (cached: a trace has few distinct names, and the
    orchestrator and the replays map every kernel's name)."""
    m = _OP_RE.match(name)
    return m.group(1) if m else name


def parse_cublas_workspace_config(config: str) -> int:
    """Bytes of a ``CUBLAS_WORKSPACE_CONFIG`` value (``":SIZE_KIB:COUNT"`` repeated), as PyTorch parses it."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        raise InputError(
            f"CUBLAS_WORKSPACE_CONFIG {config!r} has no ':SIZE:COUNT' pair; use e.g. ':4096:8' (KiB x count)"
        )
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublas_workspace_bytes(gpu: GpuSpec, config: str | None = None) -> int:
    """The cuBLAS workspace size PyTorch picks on ``gpu`` (``getChosenWorkspaceSize``)."""
    if config:
        return parse_cublas_workspace_config(config)
    is_sm90 = gpu.name.startswith(SM90_PREFIXES)
    return CUBLAS_SM90_WORKSPACE_BYTES if is_sm90 else CUBLAS_DEFAULT_WORKSPACE_BYTES


@dataclass(frozen=True)
class OrchestrationRules:
    """Which orchestration rules run (each documented in the module docstring) and their knobs."""

    persist_parameters: bool = True
    gradients_until_zero_grad: bool = True
    optimizer_state_persists: bool = True
    cublas_workspace: bool = True
    cublaslt_workspace: bool = True
    cudnn_workspace: bool = True
    cublas_workspace_config: str | None = None
    """A ``CUBLAS_WORKSPACE_CONFIG`` value (e.g. ``":4096:8"``); None: PyTorch's default for the GPU."""
    cublaslt_workspace_bytes: int = CUBLASLT_DEFAULT_WORKSPACE_BYTES
    cudnn_workspace_cap_bytes: int = CUDNN_WORKSPACE_CAP_BYTES
    cudnn_benchmark: bool = False
    """``torch.backends.cudnn.benchmark=True``: a trial workspace before each distinct convolution (see
    ``rule_cudnn_workspace``)."""
    cudnn_workspace_model: str = "envelope"
    """Per-call cuDNN workspace size model, one of ``uvmlab.trace.cudnn_conv.WORKSPACE_MODELS`` (its docstring)."""
    kernel_temporaries: bool = True
    """Allocations CUDA kernels make inside themselves (``rule_kernel_temporaries``)."""

    @classmethod
    def none(cls) -> OrchestrationRules:
        """All rules off: ``to_cuda`` then only renumbers and records the context size."""
        return cls(False, False, False, False, False, False, kernel_temporaries=False)


class _Builder:
    """Collects lifetime changes and inserted allocations, then renumbers every event densely."""

    def __init__(self, trace: Trace) -> None:
        self.a = trace.allocations.reset_index(drop=True)  # new frames: build() sets their seq columns
        self.k = trace.kernels.reset_index(drop=True)
        self.acc = trace.accesses
        self.alloc_key = self.a["alloc_seq"].to_numpy().astype("float64")
        free = self.a["free_seq"].to_numpy()
        self.free_key = np.where(free == NEVER_FREED, np.nan, free.astype("float64"))
        self.free_tie = np.zeros(len(self.a), dtype=np.int64)
        self.new_rows: list[dict[str, Any]] = []
        self.new_alloc_key: list[float] = []
        self.new_free_key: list[float] = []
        self.new_access: list[dict[str, Any]] = []
        self.new_kernels: list[dict[str, Any]] = []
        self.new_kernel_key: list[float] = []
        self.next_id = int(self.a["alloc_id"].max()) + 1 if len(self.a) else 0
        self.next_kernel_id = int(self.k["kernel_id"].max()) + 1 if len(self.k) else 0
        self.depthwise_convolutions = 0
        """Convolution calls ``rule_cudnn_workspace`` left without a workspace as depthwise."""

    def insert(
        self,
        row: dict[str, Any],
        before_seq: int,
        free_after_seq: int | None,
        order: float,
        free_order: float | None = None,
    ) -> int:
        """Add an allocation just before event ``before_seq`` (freed just after ``free_after_seq`` or never).

        ``free_order``: instead, free it just before event ``before_seq`` too, after the insertions of lower order
        and before those of higher order (a temporary that dies before the event)."""
        if free_order is not None:
            free_key = before_seq - 0.5 + (free_order + 0.5) * 1e-3
        else:
            free_key = np.nan if free_after_seq is None else free_after_seq + 0.25
        return self.insert_keyed(row, self.key_before(before_seq, order), free_key)

    @staticmethod
    def key_before(seq: int, order: float) -> float:
        """The ordering key of an insertion just before event ``seq``, after those of lower ``order``."""
        return seq - 0.5 + order * 1e-3

    def insert_keyed(self, row: dict[str, Any], alloc_key: float, free_key: float) -> int:
        """Add an allocation at ordering key ``alloc_key``, freed at ``free_key`` (NaN: never); keys order the new
        events among the trace's (an event's key is its seq)."""
        alloc_id = self.next_id
        self.next_id += 1
        self.new_rows.append({"alloc_id": alloc_id, "alloc_seq": 0, "free_seq": NEVER_FREED, **row})
        self.new_alloc_key.append(alloc_key)
        self.new_free_key.append(free_key)
        return alloc_id

    def insert_kernel(self, row: dict[str, Any], key: float, accesses: list[tuple[int, int, int, bool]]) -> int:
        """Add a kernel (or API call) row at ordering key ``key`` touching ``accesses`` (alloc_id, offset, bytes,
        is_write); a kernel column the row does not give takes its schema default."""
        kernel_id = self.next_kernel_id
        self.next_kernel_id += 1
        self.new_kernels.append({"kernel_id": kernel_id, "seq": 0, "flops": 0.0, **row})
        self.new_kernel_key.append(key)
        for alloc_id, offset, size, is_write in accesses:
            self.new_access.append({"kernel_id": kernel_id, "alloc_id": alloc_id, "offset_bytes": offset,
                                    "size_bytes": size, "is_write": is_write})  # fmt: skip
        return kernel_id

    def build(self, header: dict[str, Any]) -> Trace:
        allocs = self.a
        if self.new_rows:
            allocs = pd.concat([self.a, self._inserted()], ignore_index=True)
        akey = np.concatenate([self.alloc_key, np.asarray(self.new_alloc_key, dtype="float64")])
        fkey = np.concatenate([self.free_key, np.asarray(self.new_free_key, dtype="float64")])
        ftie = np.concatenate([self.free_tie, np.zeros(len(self.new_rows), dtype=np.int64)])
        kernels = self.k
        if self.new_kernels:
            kernels = pd.concat([self.k, self._inserted_kernels()], ignore_index=True)
        kkey = np.concatenate([self.k["seq"].to_numpy().astype("float64"), np.asarray(self.new_kernel_key)])
        n_a, n_k = len(allocs), len(kkey)
        freed = ~np.isnan(fkey)
        keys = np.concatenate([akey, fkey[freed], kkey])
        ties = np.concatenate([np.zeros(n_a, np.int64), ftie[freed], np.zeros(n_k, np.int64)])
        kind = np.concatenate([np.zeros(n_a, np.int64), np.ones(int(freed.sum()), np.int64), np.full(n_k, 2)])
        ref = np.concatenate([np.arange(n_a), np.flatnonzero(freed), np.arange(n_k)])
        order = np.lexsort((ref, kind, ties, keys))
        new_seq = np.empty(len(order), dtype=np.int64)
        new_seq[order] = np.arange(len(order), dtype=np.int64)
        allocs["alloc_seq"] = new_seq[:n_a]
        free_seq = np.full(n_a, NEVER_FREED, dtype=np.int64)
        free_seq[np.flatnonzero(freed)] = new_seq[n_a : n_a + int(freed.sum())]
        allocs["free_seq"] = free_seq
        kernels["seq"] = new_seq[n_a + int(freed.sum()) :]
        accesses = self.acc
        if self.new_access:
            accesses = pd.concat([self.acc, pd.DataFrame(self.new_access)], ignore_index=True)
        # back to the given dtypes; a column the inserted rows leave missing (a trace's own column beyond the
        # schema) keeps the dtype that holds their missing values
        for df, src in ((allocs, self.a), (kernels, self.k), (accesses, self.acc)):
            have = dict(zip(df.columns, df.dtypes, strict=True))
            for col, dtype in zip(src.columns, src.dtypes, strict=True):
                if col in have and have[col] != dtype and not df[col].hasnans:
                    df[col] = df[col].astype(dtype)
        return Trace(allocations=allocs, kernels=kernels, accesses=accesses, header=header)

    def _inserted_kernels(self) -> pd.DataFrame:
        """The inserted kernel rows (an optional column's schema default where a row does not give it)."""
        defaults = {col: default for col, (_type, default) in KERNEL_OPTIONAL.items()}
        return _rows_frame(self.new_kernels, self.k, defaults)

    def _inserted(self) -> pd.DataFrame:
        """The inserted allocations (a column beyond the schema, which no inserted row gives, is left missing)."""
        return _rows_frame(self.new_rows, self.a, {})


def _rows_frame(rows: list[dict[str, Any]], like: pd.DataFrame, defaults: dict[str, Any]) -> pd.DataFrame:
    """``rows`` as a frame with ``like``'s columns, each in ``like``'s dtype where every row gives it (else left as
    objects with the missing values); a row without a column takes ``defaults[column]`` (None: missing)."""
    columns = {}
    for col, dtype in zip(like.columns, like.dtypes, strict=True):
        values = [row.get(col, defaults.get(col)) for row in rows]
        columns[col] = values if any(v is None for v in values) else pd.array(values, dtype=dtype)
    return pd.DataFrame(columns)


def _iteration_bounds(trace: Trace) -> tuple[dict[tuple[int, str], int], dict[tuple[int, str], int]]:
    """Per (iteration, phase) of any allocation or kernel: (first seq, last seq), as two plain dicts.

    On the columns' arrays: 0.3 ms on a GPUMemNet MLP row's trace, where the frame groupbys took 5.4 ms."""
    a, k = trace.allocations, trace.kernels
    its = np.concatenate([a["iteration"].to_numpy(), k["iteration"].to_numpy()])
    codes, phases = pd.factorize(np.concatenate([a["phase"].to_numpy(), k["phase"].to_numpy()]))
    seqs = np.concatenate([a["alloc_seq"].to_numpy(), k["seq"].to_numpy()])
    keep = codes >= 0  # a missing phase is in no group (as in a groupby)
    its, codes, seqs = its[keep], codes[keep], seqs[keep]
    if not len(seqs):
        return {}, {}
    order = np.lexsort((seqs, codes, its))
    its, codes, seqs = its[order], codes[order], seqs[order]
    starts = np.flatnonzero(np.r_[True, (its[1:] != its[:-1]) | (codes[1:] != codes[:-1])])
    ends = np.r_[starts[1:], len(seqs)] - 1
    keys = list(zip(its[starts].tolist(), phases[codes[starts]].tolist(), strict=True))
    return dict(zip(keys, seqs[starts].tolist(), strict=True)), dict(zip(keys, seqs[ends].tolist(), strict=True))


def rule_persist_category(b: _Builder, category: str) -> int:
    """Allocations of ``category`` are never freed; returns the number of frees removed.

    xMem rule 1 with ``"parameter"`` (``model.to(device)``: parameters persist through the whole run) and rule 5
    with ``"optimizer_state"`` (Adam's exp_avg/exp_avg_sq, momentum live from the first step to the end).
    Parameters are the ones made at setup: a data-parallel layout's gathered parameters (FSDP2's unsharded
    storages, uvmlab.trace.shard), made and freed inside an iteration, keep their lifetimes.
    """
    mask = (b.a["category"] == category).to_numpy() & ~np.isnan(b.free_key)
    if category == "parameter":
        mask &= (b.a["phase"] == "setup").to_numpy()
    b.free_key[mask] = np.nan
    return int(mask.sum())


def rule_gradients_until_zero_grad(b: _Builder, trace: Trace, zero_grad: str) -> int:
    """xMem rule 4: a parameter gradient lives until the next ``optimizer.zero_grad()``.

    Parameter gradients are the ``gradient`` allocations still alive at the first event after their iteration's
    backward phase (the optimizer step, or the next iteration); gradients of activations die inside backward
    and are left alone. The zero_grad point of iteration i+1 is after the last event of iteration i
    (``zero_grad="iteration_start"``) or after the last data/forward event of iteration i+1
    (``"before_backward"``). A gradient freed before that point is moved to it; one freed later (or never) is
    left as captured. Events here are allocations and kernels (frees carry no phase).
    """
    first, last = _iteration_bounds(trace)
    if not first:
        return 0
    it_first: dict[int, int] = {}
    it_last: dict[int, int] = {}
    for (it, _phase), seq in first.items():
        it_first[it] = min(seq, it_first.get(it, seq))
    for (it, _phase), seq in last.items():
        it_last[it] = max(seq, it_last.get(it, seq))
    a = b.a
    iterations, alloc_ids = a["iteration"].to_numpy(), a["alloc_id"].to_numpy()
    changed = 0
    for idx in np.flatnonzero((a["category"] == "gradient").to_numpy() & ~np.isnan(b.free_key)):
        it = int(iterations[idx])
        if (it, "backward") not in first or it + 1 not in it_first:
            continue  # no backward phase to anchor on, or no next iteration: the capture's free stands
        after = first.get((it, "optimizer"), it_first[it + 1])
        if b.free_key[idx] < after:
            continue  # died inside backward: an activation gradient
        if zero_grad == "before_backward":
            pre = [last[(it + 1, p)] for p in ("data", "forward") if (it + 1, p) in last]
            point = max(pre) if pre else it_last[it]
        else:
            point = it_last[it]
        if b.free_key[idx] <= point:
            b.free_key[idx] = point + 0.5
            b.free_tie[idx] = int(alloc_ids[idx])
            changed += 1
    return changed


def _op_positions(kernels: pd.DataFrame, ops: frozenset[str]) -> np.ndarray:
    """Row positions of the kernels whose op (``op_base`` of the name) is in ``ops``."""
    names = kernels["name"].tolist()
    return np.flatnonzero(np.fromiter((op_base(n) in ops for n in names), dtype=bool, count=len(names)))


def _first_kernels(kernels: pd.DataFrame, ops: frozenset[str]) -> np.ndarray:
    """Row positions of the first kernel (lowest seq, then row) of each stream whose op is in ``ops``, in seq order."""
    pos = _op_positions(kernels, ops)
    if not len(pos):
        return pos
    seq, stream = kernels["seq"].to_numpy(), kernels["stream"].to_numpy()
    by_stream = pos[np.lexsort((pos, seq[pos], stream[pos]))]
    s = stream[by_stream]
    firsts = by_stream[np.r_[True, s[1:] != s[:-1]]]
    return firsts[np.lexsort((firsts, seq[firsts]))]


def rule_cublas_workspace(b: _Builder, trace: Trace, size: int, ops: frozenset[str], op_label: str) -> int:
    """One persistent workspace per stream, allocated right before the first kernel that needs it."""
    k = trace.kernels
    first = _first_kernels(k, ops)
    phase, iteration = k["phase"].to_numpy(), k["iteration"].to_numpy()
    stream, seq = k["stream"].to_numpy(), k["seq"].to_numpy()
    for i in first:
        row = {
            "size_bytes": size,
            "category": "workspace",
            "phase": phase[i],
            "iteration": int(iteration[i]),
            "op": op_label,
            "stream": int(stream[i]),
        }
        b.insert(row, int(seq[i]), None, order=0 if op_label == "cublas_workspace" else 1)
    return len(first)


def _live_bytes_before(trace: Trace, seqs: np.ndarray) -> np.ndarray:
    """Requested bytes alive just before each event ``seqs`` of ``trace`` (from ``Trace.live_bytes``)."""
    live = trace.live_bytes()
    after = np.concatenate([[0], live.to_numpy()]).astype(np.int64)
    return after[np.searchsorted(live.index.to_numpy(), seqs, side="left")]


def rule_cudnn_workspace(
    b: _Builder,
    trace: Trace,
    cap: int,
    benchmark: bool = False,
    available_bytes: int | None = None,
    model: str = "envelope",
) -> tuple[int, int, int]:
    """cuDNN convolution workspaces as PyTorch's v8 path allocates them (aten/src/ATen/native/cudnn/Conv_v8.cpp).

    Each cuDNN call (forward; backward-data and backward-filter are two calls inside ``convolution_backward``)
    allocates its plan's workspace through the caching allocator in ``run_conv_plan`` and frees it when the call
    returns: a temporary workspace made just before the kernel and freed just after it. The two backward calls are
    modelled as one workspace: they run one after the other with the same size rule, so the second reuses the
    block the first freed (same reserved and allocated peaks). Its size is
    the engine's ``getWorkspaceSize()``, which only cuDNN knows: APPROXIMATION, ``model``
    (``uvmlab.trace.cudnn_conv.WORKSPACE_MODELS``): by default (``envelope``) the largest operand the call touches,
    capped at ``cap``; the other models size each call by the buffers of a cuDNN algorithm family, and a backward
    kernel then gets two workspaces in a row (backward-data, freed before backward-filter's is allocated).

    ``benchmark`` (``torch.backends.cudnn.benchmark=True``): the first call of each distinct convolution
    (PyTorch's ``benchmark_cache`` key: op and operand shapes; here the op and operand sizes) first runs
    ``get_plans_from_find`` -> ``generate_and_filter_plans``: the candidates are filtered by
    ``get_available_workspace()`` (the larger of free device memory and the largest cached block), the largest
    remaining workspace is allocated (halved on OOM), every candidate is timed with it, and it is freed; the
    caching allocator keeps the freed segment. We do not know cuDNN's candidate list, so the trial takes
    everything ``available_bytes`` minus what is live at that point: an UPPER BOUND (issues #124326 and #15872
    report trials of this order: 30 GB to tune a 5 GB model; 7.5 GB vs 4.5 GB). Later calls of the same key use
    the cached plan (no trial).

    Depthwise calls (``uvmlab.trace.cudnn_conv.is_depthwise``) get no workspace: PyTorch runs fp32/bf16 NCHW
    depthwise convolutions with its own kernels, not cuDNN (``ConvParams::use_cudnn_depthwise``, Convolution.cpp);
    their count is ``b.depthwise_convolutions``.

    Returns (workspaces added, largest per-call workspace, largest trial workspace).
    """
    k = trace.kernels
    positions = _op_positions(k, CONV_OPS)
    if not len(positions):
        return 0, 0, 0
    convs = k.iloc[positions].sort_values("seq", kind="stable")
    acc = trace.accesses[trace.accesses["kernel_id"].isin(convs["kernel_id"])]
    largest = acc.groupby("kernel_id")["size_bytes"].max()
    sig = acc.groupby("kernel_id")["size_bytes"].agg(lambda s: tuple(sorted(int(x) for x in s)))
    live = _live_bytes_before(trace, convs["seq"].to_numpy()) if benchmark else None
    cfg = trace.header.get("config") or {}
    batch = trace.header.get("batch_size") or (cfg.get("batch_size") if isinstance(cfg, dict) else None) or 0
    batch = int(batch)  # the batch the capture used (the workload's default when the config has none)
    dtype = compute_dtype(str(cfg.get("dtype", "fp32")) if isinstance(cfg, dict) else "fp32", trace.header)
    elem = ELEMENT_BYTES[dtype]  # --dtype auto: what the capture built the model in
    with_category = acc.merge(trace.allocations[["alloc_id", "category"]], on="alloc_id", how="left")  # once
    rows_of = with_category.groupby("kernel_id").indices
    sizes_a = with_category["size_bytes"].to_numpy()
    writes_a = with_category["is_write"].to_numpy()
    cats_a = with_category["category"].astype(str).to_numpy()
    geometries: dict[tuple[Any, ...], ConvGeometry] = {}  # one per distinct call: iterations repeat the same convs
    seen: set[tuple[Any, ...]] = set()
    added, top, trial_top, skipped_depthwise = 0, 0, 0, 0
    depthwise_operands: set[tuple[int, int, int]] = set()  # (input, output, filter) bytes of depthwise forwards
    for i, (_, kern) in enumerate(convs.iterrows()):
        kid = kern["kernel_id"]
        idx = rows_of.get(kid, np.empty(0, dtype=np.int64))
        gkey = (kern["name"], float(kern["flops"]), tuple(zip(sizes_a[idx], writes_a[idx], cats_a[idx], strict=True)))
        if gkey not in geometries:  # the geometry follows from the name, FLOPs and accesses alone
            geometries[gkey] = conv_geometry(trace, kern, with_category.iloc[idx], batch, elem)
        geom = replace(geometries[gkey], kernel_id=int(kid))
        operands = (geom.x_bytes, geom.y_bytes, geom.w_bytes)
        if geom.depthwise:
            depthwise_operands.add(operands)
        if geom.depthwise or (geom.backward and operands in depthwise_operands):
            skipped_depthwise += 1  # PyTorch's own depthwise kernels, not cuDNN (cudnn_conv.is_depthwise)
            continue
        if model == "envelope":
            sizes: tuple[int, ...] = (min(int(largest.get(kid, 0)), cap),)
        else:
            sizes = workspace_sizes(geom, model, cap)
        size = max(sizes, default=0)
        if size <= 0:
            continue
        base = {"category": "workspace", "phase": kern["phase"], "iteration": int(kern["iteration"]),
                "stream": int(kern["stream"])}  # fmt: skip
        key = (op_base(kern["name"]), sig.get(kid, ()))
        if benchmark and key not in seen and available_bytes is not None and live is not None:
            seen.add(key)
            left = int(available_bytes) - int(live[i])
            fits = [v for v in candidate_workspaces(geom).values() if v <= left]
            for call in range(2 if geom.backward and geom.grad_input else 1):  # one find per cuDNN call
                trial = max(fits, default=0)
                if trial <= 0:
                    continue
                b.insert({**base, "size_bytes": trial, "op": "cudnn_benchmark_workspace"}, int(kern["seq"]), None,
                         order=2 + 0.3 * call, free_order=1.6 + 0.3 * call)  # fmt: skip
                trial_top = max(trial_top, trial)
                added += 1
        for j, part in enumerate(sizes[:-1]):  # backward-data: its workspace is freed before backward-filter's
            if part > 0:
                b.insert({**base, "size_bytes": part, "op": "cudnn_workspace"}, int(kern["seq"]), None,
                         order=3, free_order=3 + j)  # fmt: skip
                added += 1
        last = sizes[-1]
        if last > 0:
            alloc_id = b.insert({**base, "size_bytes": last, "op": "cudnn_workspace"}, int(kern["seq"]),
                                int(kern["seq"]), order=4)  # fmt: skip
            b.new_access.append(
                {"kernel_id": kid, "alloc_id": alloc_id, "offset_bytes": 0, "size_bytes": last, "is_write": True}
            )
            added += 1
        top = max(top, size)
    b.depthwise_convolutions = skipped_depthwise
    return added, top, trial_top


TEMPORARY_ORDER = 2.5
"""Insertion order of kernel temporaries before their kernel: after a cuDNN benchmark trial (orders 2 to 2.4) and
before the cuDNN workspace (3, 4), which ``run_conv_plan`` allocates after the call's contiguous copies."""


def _first_output_seqs(trace: Trace, kernel_seqs: np.ndarray, names: list[str]) -> np.ndarray:
    """Per kernel, the seq of the first of its outputs the capture recorded right before it (allocations of the
    kernel's own op, or first-touched inputs, in the unbroken run of allocation seqs just before the kernel); the
    kernel's seq when there are none."""
    a = trace.allocations
    by_seq = dict(zip(a["alloc_seq"].tolist(), a["op"].tolist(), strict=True))
    out = kernel_seqs.copy()
    for i, (seq, name) in enumerate(zip(kernel_seqs.tolist(), names, strict=True)):
        j = seq - 1
        while by_seq.get(j) in (name, "<external>"):
            if by_seq[j] == name:
                out[i] = j
            j -= 1
    return out


def rule_kernel_temporaries(b: _Builder, trace: Trace, gpu: GpuSpec) -> tuple[int, int]:
    """Insert what each CUDA kernel allocates inside itself (the kernels' ``temporaries`` column,
    ``uvmlab.trace.internal_allocs``), sized for ``gpu``'s SM count (``uvmlab.gpus.sm_info``; an unknown GPU is
    taken as an A100).

    Each temporary is a caching-allocator block of category ``temporary`` and op ``<kernel>:<label>``, on the
    kernel's stream, allocated inside the op in the order the kernel allocates it: before the op's outputs
    (``pre``, e.g. ``layer_norm``'s input copy) or after them, just before the kernel; and freed when the op
    returns (just after the kernel), or earlier where the source frees it earlier (``until``). The kernel writes it
    (an access over what it really writes, for the UVM simulator: the whole block except a reduction's staging
    buffer, ``Temporary.touched_bytes``). Returns (temporaries added, largest one)."""
    k = trace.kernels
    if TEMPORARIES_COLUMN not in k.columns:
        return 0, 0
    values = k[TEMPORARIES_COLUMN].fillna("").astype(str).to_numpy()
    pos = np.flatnonzero(values != "")
    if not len(pos):
        return 0, 0
    sms, threads, _known = sm_info(gpu.name)
    seqs = k["seq"].to_numpy()[pos].astype(np.int64)
    names = [str(n) for n in k["name"].to_numpy()[pos]]
    first_out = _first_output_seqs(trace, seqs, names)
    kid, phase = k["kernel_id"].to_numpy()[pos], k["phase"].to_numpy()[pos]
    iteration, stream = k["iteration"].to_numpy()[pos], k["stream"].to_numpy()[pos]
    cache: dict[str, list[Any]] = {}
    added, top = 0, 0
    for i, text in enumerate(values[pos].tolist()):
        temps = cache.get(text)
        if temps is None:
            try:
                temps = cache[text] = resolve(decode(text), sms, threads)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a cell not in uvmlab's format
                raise InputError(
                    f"kernel {names[i]}'s temporaries cell is not uvmlab's format ({type(exc).__name__}: "
                    f"{str(exc)[:120]}); was the trace written by another tool?"
                ) from None
        seq, start = int(seqs[i]), int(first_out[i])
        keys: list[float] = []
        for j, t in enumerate(temps):
            keys.append(b.key_before(start if t.before_outputs else seq, TEMPORARY_ORDER + 0.01 * j))
        for j, t in enumerate(temps):
            if t.free_before_outputs:
                free_key = b.key_before(start, TEMPORARY_ORDER + 0.01 * j + 0.005)
            elif t.until is not None:
                free_key = keys[t.until] + 0.005e-3
            else:
                free_key = seq + 0.25
            row = {"size_bytes": t.size_bytes, "category": "temporary", "phase": phase[i],
                   "iteration": int(iteration[i]), "op": f"{names[i]}:{t.label}", "stream": int(stream[i])}  # fmt: skip
            alloc_id = b.insert_keyed(row, keys[j], free_key)
            written = t.size_bytes if t.touched_bytes is None else t.touched_bytes
            b.new_access.append({"kernel_id": int(kid[i]), "alloc_id": alloc_id, "offset_bytes": 0,
                                 "size_bytes": written, "is_write": True})  # fmt: skip
            if t.prefetched:  # the prefetching allocator's cudaMemPrefetchAsync right after the allocation
                b.insert_kernel({"name": "cudaMemPrefetchAsync", "phase": phase[i], "iteration": int(iteration[i]),
                                 "stream": int(stream[i]), "api": "prefetch", "api_arg": "gpu"},
                                keys[j] + 0.001e-3, [(alloc_id, 0, t.size_bytes, False)])  # fmt: skip
            added += 1
            top = max(top, t.size_bytes)
    return added, top


def to_cuda(trace: Trace, gpu: GpuSpec, rules: OrchestrationRules | None = None) -> Trace:
    """The CUDA allocation sequence of ``trace`` on ``gpu`` (a new Trace; the input is not modified).

    Applies the enabled :class:`OrchestrationRules`, renumbers all events densely (seq 0..n-1, same relative
    order for the original events), adds workspaces as category ``workspace``, and records what it did in
    ``header["orchestration"]`` (rules, change counts, workspace sizes, ``context_bytes``).
    """
    rules = rules or OrchestrationRules()
    if rules.cudnn_workspace_model not in WORKSPACE_MODELS:
        raise InputError(
            f"cuDNN workspace model must be one of {', '.join(WORKSPACE_MODELS)}, not {rules.cudnn_workspace_model!r}"
        )
    trace.validate("trace given to the orchestrator")
    cfg = trace.header.get("config") or {}
    zero_grad = cfg.get("zero_grad", "iteration_start") if isinstance(cfg, dict) else "iteration_start"
    b = _Builder(trace)
    changes: dict[str, int] = {}
    if rules.persist_parameters:
        changes["persist_parameters"] = rule_persist_category(b, "parameter")
    if rules.optimizer_state_persists:
        changes["optimizer_state_persists"] = rule_persist_category(b, "optimizer_state")
    if rules.gradients_until_zero_grad:
        changes["gradients_until_zero_grad"] = rule_gradients_until_zero_grad(b, trace, zero_grad)
    ws = cublas_workspace_bytes(gpu, rules.cublas_workspace_config)
    lt = min(rules.cublaslt_workspace_bytes, ws)
    if rules.cublas_workspace:
        changes["cublas_workspace"] = rule_cublas_workspace(b, trace, ws, CUBLAS_OPS, "cublas_workspace")
    if rules.cublaslt_workspace:
        changes["cublaslt_workspace"] = rule_cublas_workspace(b, trace, lt, CUBLASLT_OPS, "cublaslt_workspace")
    temporaries_top = 0
    if rules.kernel_temporaries:
        changes["kernel_temporaries"], temporaries_top = rule_kernel_temporaries(b, trace, gpu)
    cudnn_top = trial_top = 0
    if rules.cudnn_workspace:
        available = gpu.memory_bytes - gpu.context_bytes
        changes["cudnn_workspace"], cudnn_top, trial_top = rule_cudnn_workspace(
            b, trace, rules.cudnn_workspace_cap_bytes, rules.cudnn_benchmark, available, rules.cudnn_workspace_model
        )
    header = dict(trace.header)
    header["orchestration"] = {
        "gpu": gpu.name,
        "rules": asdict(rules),
        "changes": changes,
        "cublas_workspace_bytes": ws if rules.cublas_workspace else None,
        "cublaslt_workspace_bytes": lt if rules.cublaslt_workspace else None,
        "cudnn_workspace_peak_bytes": cudnn_top if rules.cudnn_workspace else None,
        "cudnn_depthwise_calls_without_workspace": b.depthwise_convolutions if rules.cudnn_workspace else None,
        "cudnn_benchmark_trial_peak_bytes": trial_top if rules.cudnn_benchmark else None,
        "kernel_temporary_peak_bytes": temporaries_top if rules.kernel_temporaries else None,
        "context_bytes": gpu.context_bytes,
        "zero_grad": zero_grad,
    }
    out = b.build(header)
    out.validate("orchestrated trace")
    return out
