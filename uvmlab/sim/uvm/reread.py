"""Re-reads within one GEMM-like kernel: the passes a tiled GEMM makes over its operands (torch-free).

A trace kernel (one aten op) lists each tensor it touches once, and the fault model lets a kernel fault a page at
most once. A tiled GEMM reads more: CTA tile (m, n) of ``C = A x B`` reads the A panel of tile row m and the B
panel of tile column n. The grid is rasterized with the M tile index fastest (CUTLASS
``GemmIdentityThreadblockSwizzle::get_tile_offset``: tile m = ``blockIdx.x >> log_tile``;
NVIDIA/cutlass include/cutlass/gemm/threadblock/threadblock_swizzle.h), so a B panel is reused by consecutive
CTAs (resident, read once) while the whole of A is swept again for every group of tile columns that runs
after the previous group finished. When A, plus the slices of B and C touched between two sweeps, does not fit
in the GPU memory left, the LRM order (uvm_pmm_gpu.c root-chunk list, reference/uvm.md 1.6) evicts the start of
A before the next sweep reaches it: an LRU cycle larger than memory misses every time, within one kernel.

The model (an approximation; docs/uvm-sim.md "Re-reads within a kernel"):

* Tile ``TILE_M x TILE_N`` = 128 x 128 (CUTLASS ``DefaultGemmConfiguration<OpClassSimt, ...>::ThreadblockShape
  = GemmShape<128, 128, 8>``, include/cutlass/gemm/device/default_gemm_configuration.h; cuBLAS/cuDNN kernels are
  closed, their tiles on A100 are 64-256 wide). ``CTAS_PER_SM`` = 1 resident CTA per SM [U].
* Passes over A: ``P = min(nt, ceil(mt * nt / W))`` with ``mt``, ``nt`` the tile counts along M and N and
  ``W`` = SMs x CTAS_PER_SM the CTAs in flight (when all tiles of one column group run at once, each wave reads
  all of A once; when a column has more tiles than W, A is swept once per column, ``nt`` times).
* Pass j (of P) reads all of A, the j-th 1/P byte slice of B and writes the j-th 1/P byte slice of C (the tile
  columns of that pass; a slice of an NCHW output's channels is strided in reality, taken as contiguous here).
* Which operand is A (the M operand, swept):
  - ``mm`` / ``addmm`` (PyTorch row-major ``out[m, n] = a[m, k] b[k, n]``, computed by cuBLAS column-major as
    ``out^T = b^T a^T``): cuBLAS's M is PyTorch's n, so A = ``b`` (the last read, e.g. a linear layer's
    weight), B = ``a`` (sliced by rows), passes over ``ceil(m / TILE_N)`` tile columns.
  - ``convolution`` (implicit GEMM forward, M = N*P*Q output pixels, N = output channels, K = C*R*S): A = the
    input (im2col view, swept), B = the filter, C = the output.
  - ``convolution_backward``: data gradient (M = N*H*W input pixels, N = input channels C, K = K_out*R*S): A =
    grad_output swept, B = filter, C = grad_input; C is recovered as ``|filter| / (K * elem)``. The filter
    gradient (M = K_out, N = C*R*S: few tiles, one wave) and the bias gradient read their operands once, after.
  - batched GEMMs (``bmm``, ``baddbmm``, attention) are left as they are: each batch's slices are reused within
    that batch, far smaller than the GPU.
* Shapes come from the trace's sizes and FLOPs (PyTorch's flop formulas, 2 per multiply-add): for ``mm``
  ``K = flops * elem / (2 |out|)``; kernels whose sizes do not give whole, consistent shapes are left alone.
* The split is used only when the kernel's bytes, plus 2 MiB per access for partly used chunks, exceed the GPU
  memory available to UVM (``uvm_replay._Replayer._access``; otherwise no page of the kernel can be evicted by the
  kernel itself, and one pass gives the same faults). Under LRM the swept operand's chunks reach the head of the
  eviction list once the kernel has migrated more than memory holds, even though they are in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.occupancy import ELEM_BYTES, sm_count
from uvmlab.trace.orchestrate import op_base

Access = tuple[int, int, int, bool]

TILE_M = 128
"""CTA tile rows (CUTLASS default SIMT ``GemmShape<128, 128, 8>``, default_gemm_configuration.h)."""
TILE_N = 128
"""CTA tile columns (same source)."""
CTAS_PER_SM = 1
"""[U] resident CTAs of one 128x128 GEMM tile per SM (register/shared-memory bound; 1-2 on A100)."""
SPLIT_K_MIN = 128
"""[U] Smallest K slice a split-K GEMM gives one CTA (``occupancy``): CUTLASS's split-K kernels divide K among
``split_k_slices`` CTAs per output tile (include/cutlass/gemm/device/gemm_splitk_parallel.h); cuBLAS and cuDNN pick
their splits by closed heuristics, so this floor is our choice, not measured."""

GEMM_OPS = frozenset({"mm", "addmm", "convolution", "convolution_backward"})
BATCHED_GEMM_OPS = frozenset({"bmm", "baddbmm", "baddbmm_"})
"""Batched GEMMs (``op_base`` names): :func:`mm_operands` with ``batched``; no re-read passes (module docstring)."""


def sweep_passes(mt: int, nt: int, ctas: int) -> int:
    """Sweeps over the M operand: ``min(nt, ceil(mt * nt / ctas))`` (module docstring)."""
    if mt <= 0 or nt <= 0:
        return 1
    return max(1, min(nt, -(-mt * nt // max(1, ctas))))


def occupancy(
    flops: np.ndarray, out_bytes: np.ndarray, gemm: np.ndarray, dtype: str, gpu_name: str | GpuSpec
) -> np.ndarray:
    """Share of the GPU's compute a GEMM-like kernel can use: its parallel work units over the SMs, at most 1.

    Units = output tiles (``TILE_M x TILE_N`` elements of its written bytes) x split-K slices, where a kernel with
    fewer tiles than SMs splits its K = flops / (2 x output elements) into up to ceil(SMs / tiles) slices of at
    least :data:`SPLIT_K_MIN` (as CUTLASS's split-K kernels do). A kernel with fewer units than SMs runs one partial
    wave: units / SMs of the peak (the NVIDIA Deep Learning Performance Guide's wave quantization, "Matrix
    Multiplication Background", for the one-wave case; the tail of larger grids is not charged). Other kernels: 1.
    This is what makes a small micro-batch's GEMMs and convolutions slower per sample than a large batch's.
    Approximation: tiles are counted from elements (tile quantization inside a tile is not charged).
    """
    e = ELEM_BYTES.get(dtype, 4)
    sms = sm_count(gpu_name) * CTAS_PER_SM
    out_el = np.asarray(out_bytes, dtype=float) / e
    eff = np.ones(len(out_el))
    sel = np.asarray(gemm, dtype=bool) & (out_el > 0) & (np.asarray(flops, dtype=float) > 0)
    if not sel.any():
        return eff
    tiles = np.ceil(out_el[sel] / (TILE_M * TILE_N))
    k = np.asarray(flops, dtype=float)[sel] / (2.0 * out_el[sel])
    split = np.minimum(np.ceil(sms / tiles), np.maximum(1.0, np.floor(k / SPLIT_K_MIN)))
    eff[sel] = np.minimum(1.0, tiles * split / sms)
    return eff


def _slice(row: Access, j: int, p: int) -> Access | None:
    """The j-th of ``p`` contiguous byte slices of an access (page boundaries are the simulator's business)."""
    rid, off, size, w = row
    lo, hi = size * j // p, size * (j + 1) // p
    return (rid, off + lo, hi - lo, w) if hi > lo else None


def _passes(swept: Access, sliced: list[Access], p: int) -> list[list[Access]]:
    out = []
    for j in range(p):
        rows = [swept]
        for r in sliced:
            s = _slice(r, j, p)
            if s is not None:
                rows.append(s)
        out.append(rows)
    return out


def _whole(x: float) -> int | None:
    """``x`` as a positive integer if it is one (to 1e-6 relative), else None."""
    n = round(x)
    return n if n >= 1 and abs(x - n) <= 1e-6 * max(1.0, abs(x)) else None


def _operands(rows: list[Access], min_reads: int) -> tuple[list[Access], list[Access]] | None:
    """(reads, writes) of a kernel with at least ``min_reads`` reads and one write, else None."""
    reads = [r for r in rows if not r[3]]
    writes = [r for r in rows if r[3]]
    return (reads, writes) if len(reads) >= min_reads and writes else None


def _inner_dim(flops: float, e: int, out_bytes: int) -> int | None:
    """GEMM K from 2 FLOPs per multiply-add: ``flops * elem / (2 |out|)`` if whole, else None."""
    return _whole(flops * e / (2.0 * out_bytes)) if out_bytes > 0 else None


@dataclass(frozen=True)
class MmOperands:
    """A GEMM's operands as PyTorch names them, ``out[m, n] = a[m, k] b[k, n]`` (``batch`` such products for a
    ``bmm`` / ``baddbmm``, each batch's matrices stored one after another), and its shape."""

    others: list[Access]  # reads before ``a`` (addmm's bias, baddbmm's input)
    a: Access
    b: Access
    writes: list[Access]  # ``out`` first
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def operands(self) -> list[Access]:
        """``[*others, a, b, out]``: the accesses the tile order ranks (uvmlab.sim.uvm.tile_order)."""
        return [*self.others, self.a, self.b, self.writes[0]]


def mm_operands(rows: list[Access], flops: float, e: int, batched: bool = False) -> MmOperands | None:
    """The operands and shape of an ``mm`` / ``addmm`` kernel (``batched``: a ``bmm`` / ``baddbmm``) from its sizes
    and FLOPs (module docstring), or None when they do not give whole, consistent shapes.

    With ``K`` from the FLOPs, ``|a| = B m K e``, ``|b| = B K n e`` and ``|out| = B m n e`` give the batch count
    ``B = (Bm)(Bn) / (Bmn)``, which must be 1 for a 2-D GEMM."""
    ops = _operands(rows, 2)
    if ops is None:
        return None
    reads, writes = ops
    a, b, out = reads[-2], reads[-1], writes[0]
    k = _inner_dim(flops, e, out[2])
    if k is None:
        return None
    bm, bn = _whole(a[2] / (k * e)), _whole(b[2] / (k * e))
    if bm is None or bn is None:
        return None
    batch = _whole(bm * bn * e / out[2])
    if batch is None or bm % batch or bn % batch or (batch != 1 and not batched):
        return None
    m, n = bm // batch, bn // batch
    if batch * m * n * e != out[2]:
        return None
    return MmOperands(reads[:-2], a, b, writes, m, n, k, batch)


def _mm(rows: list[Access], flops: float, e: int, ctas: int) -> list[list[Access]] | None:
    mm = mm_operands(rows, flops, e)
    if mm is None:
        return None
    p = sweep_passes(-(-mm.n // TILE_M), -(-mm.m // TILE_N), ctas)
    if p <= 1:
        return None
    passes = _passes(mm.b, [mm.a, *mm.writes], p)
    passes[0][1:1] = mm.others  # addmm's bias: read with the first pass
    return passes


def _conv(rows: list[Access], flops: float, e: int, ctas: int) -> list[list[Access]] | None:
    ops = _operands(rows, 2)
    if ops is None:
        return None
    reads, writes = ops
    x, w, out = reads[0], reads[1], writes[0]
    k = _inner_dim(flops, e, out[2])  # C*R*S
    if k is None:
        return None
    kout = _whole(w[2] / (k * e))
    if kout is None or out[2] % (kout * e):
        return None
    mpix = out[2] // (kout * e)
    p = sweep_passes(-(-mpix // TILE_M), -(-kout // TILE_N), ctas)
    if p <= 1:
        return None
    passes = _passes(x, [w, out], p)
    passes[-1].extend(r for r in reads[2:])  # bias
    passes[-1].extend(writes[1:])  # workspace
    return passes


def _conv_backward(rows: list[Access], flops: float, e: int, ctas: int) -> list[list[Access]] | None:
    ops = _operands(rows, 3)
    if ops is None:
        return None
    reads, writes = ops
    gout, x, w = reads[0], reads[1], reads[2]
    gin = [r for r in writes if r[2] == x[2]]
    if not gin or x[2] == w[2]:
        return None  # no data gradient (first layer), or ambiguous sizes
    n_grads = 1 + any(r[2] == w[2] for r in writes)  # PyTorch counts one forward's FLOPs per gradient
    kk = _inner_dim(flops / n_grads, e, gin[0][2])  # dgrad K = K_out*R*S
    if kk is None:
        return None
    c = _whole(w[2] / (kk * e))
    if c is None or gin[0][2] % (c * e):
        return None
    mpix = gin[0][2] // (c * e)
    p = sweep_passes(-(-mpix // TILE_M), -(-c // TILE_N), ctas)
    if p <= 1:
        return None
    passes = _passes(gout, [w, gin[0]], p)
    rest = [x, gout, *(r for r in writes if r is not gin[0])]  # filter/bias gradients: one more pass, read once
    passes.append(rest)
    return passes


_RULES = {"mm": _mm, "addmm": _mm, "convolution": _conv, "convolution_backward": _conv_backward}


def gemm_passes(
    name: str, rows: list[Access], flops: float, dtype: str, gpu_name: str | GpuSpec
) -> list[list[Access]] | None:
    """The kernel's accesses as the passes its tiled GEMM makes (module docstring), or None (one pass)."""
    rule = _RULES.get(op_base(name))
    e = ELEM_BYTES.get(dtype)
    if rule is None or e is None or not math.isfinite(flops) or flops <= 0:
        return None
    return rule(rows, flops, e, sm_count(gpu_name) * CTAS_PER_SM)
