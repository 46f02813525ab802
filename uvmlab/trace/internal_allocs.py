"""Allocations a CUDA kernel makes inside itself, which the meta kernel the capture runs never makes.

A CUDA op can allocate through the caching allocator while it runs: a contiguous copy of a strided input, a
partial-reduction buffer, sort buffers, an attention workspace. Those blocks are freed when the op returns, but
they are real caching-allocator blocks: they can set the peak and they split cached segments. The capture
(``uvmlab.trace.internal_rules``, torch side) writes what each kernel allocates into the kernel's ``temporaries``
column (``uvmlab.trace.schema.KERNEL_OPTIONAL``); the orchestrator (``uvmlab.trace.orchestrate``,
``rule_kernel_temporaries``) turns every entry into an allocation of category ``temporary``, allocated inside the op
and freed when it returns, as PyTorch does. The table of rules, each with its PyTorch source, is in
docs/estimate.md ("Temporaries inside CUDA kernels").

The column holds a JSON list (compact, ``encode``/``decode``), one object per allocation, in the order the kernel
allocates them:

- ``l``: the label (what the block is, e.g. ``contiguous_input``); the allocation's ``op`` is ``<kernel>:<label>``;
- ``b``: its size in bytes, when it does not depend on the GPU; otherwise one of the GPU-dependent forms below;
- ``pre``: 1 when the kernel allocates it before its outputs (e.g. ``layer_norm``'s ``expect_contiguous`` copies);
  otherwise it is allocated after them, just before the kernel;
- ``until``: the index of an entry of the same list, when this block is freed as soon as that entry is allocated
  (a temporary of a temporary, e.g. the product that attention backward reduces into ``delta``), or ``"outputs"``
  for a ``pre`` block freed before the outputs are allocated (``embedding_dense_backward``'s sort range);
  otherwise it is freed just after the kernel.

GPU-dependent forms (``resolve`` sizes them for the GPU's SM count and resident threads per SM):

- ``reduce``: ``[arg_bytes, num_outputs, inputs_per_output, ndim, on_fastest, fastest_is_element,
  one_reduce_dim, output_vec, input_vec, max_threads]``: a TensorIterator reduction (``gpu_reduce_kernel``,
  aten/src/ATen/native/cuda/Reduce.cuh). When ``setReduceConfig`` splits the input across thread blocks
  (``should_global_reduce``) the kernel allocates a staging buffer (``global_memory_size``) and the semaphores
  (``semaphore_size``) through the caching allocator; :func:`reduce_buffers` reproduces that arithmetic.
- ``gamma_beta``: ``[M, N, element_bytes, n_buffers]``: ``layer_norm`` backward's partial sums of dgamma/dbeta,
  allocated only when ``M > 64 * 1024`` and ``N / 32 < SMs / 2`` (LayerNormKernel.cu,
  ``LaunchGammaBetaBackwardCUDAKernel``).
- ``embedding``: ``[max_segments, max_partial_segments, stride, index_bytes, accumulate_bytes, num_weights,
  is_reduced_float]``: the last step of ``embedding_dense_backward`` (EmbeddingBackwardKernel.cu,
  ``embedding_backward_cuda_kernel``), which takes the fused atomic path or the two-pass path depending on the
  SM count.

This module never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from uvmlab.files.inputs import decode_json, short

COLUMN = "temporaries"
"""The kernels-table column holding each kernel's internal allocations (``""``: none)."""
WARP_SIZE = 32
"""``at::cuda::warp_size()`` on NVIDIA GPUs."""
REDUCE_MAX_VALUES_PER_THREAD = 256
"""Reduce.cuh ``setReduceConfig``: ``max_values_per_thread``."""
REDUCE_MIN_VALUES_PER_THREAD = 16
"""Reduce.cuh ``setReduceConfig``: ``min_values_per_thread`` (CUDA; 128 on ROCm)."""
LN_LARGE_M = 64 * 1024
"""LayerNormKernel.cu ``LaunchGammaBetaBackwardCUDAKernel``: ``M > 64 * 1024`` takes the two-pass path."""
LN_BLOCK_DIM_X = 32
"""Same function: ``block_dim_x``."""
LN_ROWS_PER_BLOCK_Y = 32
"""Same function, two-pass path: ``rows_per_block_y``."""
LN_MAX_GRID = 64 * 1024 // 2
"""Same function, two-pass path: ``max_grid_size``."""
EMB_MAX_BLOCK_SIZE = 1024
"""SortingCommon.cuh ``MAX_BLOCK_SIZE`` (CUDA; 256 on ROCm)."""
EMB_ATOMIC_BLOCKS_PER_SM = 4
"""EmbeddingBackwardKernel.cu ``MAX_ATOMIC_ACCUM_BLOCKS_PER_SM``."""


@dataclass(frozen=True)
class Temporary:
    """One internal allocation of a kernel, sized for a GPU."""

    label: str
    size_bytes: int
    before_outputs: bool = False
    until: int | None = None
    """Index (in the kernel's resolved list) of the allocation after which this one is freed; None: after the
    kernel (or before the outputs, with ``free_before_outputs``)."""
    free_before_outputs: bool = False
    touched_bytes: int | None = None
    """Bytes the kernel really writes, when less than the allocation (None: all of it): a reduction's staging
    buffer is allocated ``block.x x vec`` times larger than the slots its blocks write."""
    prefetched: bool = False
    """Made while the program prefetched every new allocation to the GPU (``uvm.prefetch_new_allocations``): a
    kernel's temporaries come from the same allocator as its outputs (Reduce.cuh takes its staging buffer from
    ``c10::cuda::CUDACachingAllocator::get()``), so the shim's prefetch after each managed allocation covers them."""


def encode(entries: list[dict[str, Any]]) -> str:
    """The column value of a kernel's entries (``""`` for none)."""
    return json.dumps(entries, separators=(",", ":")) if entries else ""


def mark_prefetched(text: str) -> str:
    """The column value ``text`` with every entry marked as made under the prefetching allocator (key ``p``)."""
    return encode([{**e, "p": 1} for e in decode(text)])


def decode(text: str) -> list[dict[str, Any]]:
    """The entries of a column value (``[]`` for ``""``), decoded by the one checked JSON decoder
    (:func:`uvmlab.files.inputs.decode_json`: a trace folder is an input, and a crafted cell is one sentence)."""
    return decode_json(text, f"kernel temporaries cell {short(text)}", "uvmlab's temporaries format") if text else []


def last_pow2(n: int) -> int:
    """The largest power of two not above ``n`` (c10 ``last_pow2``; ``n >= 1``)."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def reduce_buffers(spec: list[Any], sms: int, threads_per_sm: int) -> tuple[int, int, int]:
    """(staging buffer bytes, semaphore bytes, staging bytes written) ``gpu_reduce_kernel`` allocates for one
    reduction; zeros when it does not reduce across thread blocks. Written: ``ReduceOp::global_reduce`` stores one
    ``arg x vec`` slot per (block, CTA, thread.x) at ``staging_memory_offset``, ``grid.x x CTAs x block.x`` slots
    (``x block.x`` only without a block-x reduction), while ``global_memory_size`` allocates ``outputs x CTAs``
    slots of that size (``x block.x x vec`` likewise).

    ``spec``: the ``reduce`` form (module docstring), from TensorIterator's view of the reduction after it reorders
    and coalesces the dimensions (``uvmlab.trace.internal_rules.reduction_layout``). The arithmetic is
    Reduce.cuh's ``setReduceConfig``, ``ReduceConfig::set_block_dimension``, ``global_memory_size`` and
    ``semaphore_size`` at torch 2.14.1 (the installed header), line by line."""
    arg_bytes, n_out, n_in, ndim, on_fastest, fast_elem, one_dim, out_vec_max, in_vec, max_threads = spec
    if ndim > 0:
        dim0, dim1 = (n_in, n_out) if on_fastest else (n_out, n_in)
    else:
        on_fastest, fast_elem, dim0, dim1 = True, True, 1, 1
    out_vec = 1
    if fast_elem:
        if on_fastest and dim0 >= 128 and one_dim:
            dim0 //= in_vec  # vectorize_input
        elif not on_fastest:
            out_vec = out_vec_max
            dim0 //= out_vec
    mnt = max_threads // out_vec
    dim0_pow2 = last_pow2(dim0) if dim0 < mnt else mnt
    dim1_pow2 = last_pow2(dim1) if dim1 < mnt else mnt
    bw = min(dim0_pow2, WARP_SIZE)
    bh = min(dim1_pow2, mnt // bw)
    bw = min(dim0_pow2, mnt // bh)
    num_threads = bw * bh
    step_in = step_out = 1
    block_x_reduce = ndim == 0 or on_fastest
    if block_x_reduce:
        step_in *= bw
    else:
        step_out *= bw
    vpt = -(-n_in // step_in)
    split_warps = vpt >= min(bh * 16, REDUCE_MAX_VALUES_PER_THREAD)
    if split_warps:
        step_in *= bh
    else:
        step_out *= bh
    grid_x = -(-(n_out // out_vec) // step_out)
    target = sms * (threads_per_sm // num_threads)
    vpt = -(-n_in // step_in)
    if not (split_warps and vpt >= REDUCE_MAX_VALUES_PER_THREAD and grid_x <= target):
        return 0, 0, 0
    c1 = -(-target // grid_x)
    c2 = -(-vpt // REDUCE_MIN_VALUES_PER_THREAD)
    c3 = -(-vpt // REDUCE_MAX_VALUES_PER_THREAD)
    ctas = min(max(c1, c3), c2)  # std::clamp(c1, c3, c2)
    if ctas <= 1:
        return 0, 0, 0
    size = arg_bytes * n_out * ctas
    written = arg_bytes * out_vec * grid_x * ctas
    if not block_x_reduce:
        size *= bw * out_vec
        written *= bw
    return size, 4 * grid_x, min(written, size)


def gamma_beta_partials(spec: list[Any], sms: int) -> list[int]:
    """The dgamma/dbeta partial-sum buffers of ``layer_norm`` backward's two-pass path ([] on the one-pass path)."""
    m, n, elem, n_buffers = spec
    if not (m > LN_LARGE_M and n // LN_BLOCK_DIM_X < sms // 2):
        return []
    blocks_x = -(-n // LN_BLOCK_DIM_X)
    blocks_y = min(LN_MAX_GRID // blocks_x, -(-m // LN_ROWS_PER_BLOCK_Y))
    return [blocks_y * n * elem] * n_buffers


def embedding_final(spec: list[Any], sms: int) -> list[tuple[str, int]]:
    """The allocations of ``embedding_backward_cuda_kernel``'s last step for the GPU: the fused atomic path (a
    partial-to-segment map, plus an fp32 accumulator of the whole weight for 16-bit gradients) or the two-pass path
    (the per-partial-segment sums in the accumulate type)."""
    max_segments, max_partial, stride, idx_bytes, acc_bytes, num_weights, reduced_float = spec
    stride_warped = -(-stride // WARP_SIZE) * WARP_SIZE
    block = min(stride_warped, EMB_MAX_BLOCK_SIZE)
    sum_scatter_grid = -(-(max_segments * stride_warped) // block)
    fused = sum_scatter_grid < sms * EMB_ATOMIC_BLOCKS_PER_SM and max_partial > sum_scatter_grid * 4
    if fused:
        out = [("partial_to_segment_idx", max_partial * idx_bytes)]
        if reduced_float:
            out.append(("grad_weight_fp32", num_weights * stride * 4))
        return out
    return [("grad_weight_per_segment", max_partial * stride * acc_bytes)]


def resolve(entries: list[dict[str, Any]], sms: int, threads_per_sm: int) -> list[Temporary]:
    """The kernel's internal allocations sized for a GPU with ``sms`` SMs of ``threads_per_sm`` resident threads;
    entries that allocate nothing there are dropped (``until`` indices follow the kept list)."""
    staged: list[tuple[int, str, int, bool, Any, int | None, bool]] = []  # (entry, label, size, pre, until, written,
    # prefetched)
    last_of: dict[int, int] = {}  # entry index -> position of its last allocation in the kept list
    for i, e in enumerate(entries):
        parts: list[tuple[str, int, int | None]]
        if "b" in e:
            parts = [(e["l"], int(e["b"]), None)]
        elif "reduce" in e:
            buf, sem, written = reduce_buffers(e["reduce"], sms, threads_per_sm)
            parts = [(e["l"], buf, written), (e["l"] + "_semaphores", sem, None)] if buf else []
        elif "gamma_beta" in e:
            parts = [(e["l"], size, None) for size in gamma_beta_partials(e["gamma_beta"], sms)]
        elif "embedding" in e:
            parts = [(label, size, None) for label, size in embedding_final(e["embedding"], sms)]
        else:
            raise ValueError(f"unknown kernel temporary entry {e!r}")
        for label, size, written in parts:
            if size > 0:
                last_of[i] = len(staged)
                staged.append((i, label, int(size), bool(e.get("pre")), e.get("until"), written, bool(e.get("p"))))
    out = []
    for _i, label, size, pre, until, written, prefetched in staged:
        freed_after = None if until in (None, "outputs") else last_of.get(until)
        partial = None if written is None or written >= size else int(written)
        out.append(Temporary(label, size, pre, freed_after, until == "outputs", partial, prefetched))
    return out


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m``."""
    return -(-int(x) // m) * m
