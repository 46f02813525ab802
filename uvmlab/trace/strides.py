"""Strided views of a kernel's operands: the trace columns ``stride_bytes`` and ``touched_bytes`` (IFACE.md table A).

A kernel over a strided view (``x[::1024]``) touches one element every ``stride`` bytes of the range the recorder
records (the view's whole extent, uvmlab.trace.recorder). Two facts follow, both used by the replay
(uvmlab.sim.uvm.order):

* ``stride_bytes``: the largest innermost stride, in bytes, of the kernel's operands whose innermost stride (the
  smallest ``|stride|`` over dimensions of size > 1) is larger than one element; 0 when every operand is dense
  along its innermost dimension. A stride of a page or more makes every element its own page: the replay then
  faults the kernel as interleaved streams.
* ``touched_bytes``: the DRAM bytes the kernel moves when an operand is strided by at least two 32 B sectors: such
  an operand moves one 32 B sector per element (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory":
  a warp's scattered 4 B accesses are served one 32 B sector each), a dense operand its recorded range; NaN
  (= the sum of the recorded ranges) when no operand is strided that far.

Approximations: a view strided along several dimensions is charged by its innermost stride only; two elements of a
strided operand that share a sector are charged two sectors.
"""

from __future__ import annotations

import math

SECTOR_BYTES = 32
"""L2 / DRAM sector (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory")."""


def extent_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a strided view's first element to its last, both included (1 + sum((size - 1) * |stride|));
    0 for an empty view. The recorder's access range and the meta memo's fresh-storage check both use it."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride, strict=True))


def inner_stride_bytes(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    """Smallest ``|stride|`` in bytes over the dimensions of size > 1 (``itemsize`` for a scalar or a 1-element
    tensor)."""
    st = [abs(s) for n, s in zip(shape, stride, strict=True) if n > 1]
    return (min(st) if st else 1) * itemsize


def strided_columns(operands: list[tuple[tuple[int, ...], tuple[int, ...], int, int]]) -> tuple[int, float]:
    """(stride_bytes, touched_bytes) of a kernel (module docstring) from its operands, each ``(shape, stride,
    itemsize, recorded range bytes)``."""
    widest = 0
    touched = 0.0
    sparse = False
    for shape, stride, item, span in operands:
        inner = inner_stride_bytes(shape, stride, item)
        if inner > item:
            widest = max(widest, inner)
        if inner >= 2 * SECTOR_BYTES:
            sparse = True
            touched += math.prod(shape) * SECTOR_BYTES
        else:
            touched += span
    return widest, (touched if sparse else math.nan)


def matrix_layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> str:
    """BLAS layout of a 2-D operand: ``n`` when its last dimension is contiguous (row-major), ``t`` when the one
    before it is (a transposed view of a row-major tensor, ``w.t()``), "" for any other view (the trace column
    ``layout``, read by uvmlab.sim.uvm.tile_order). A dimension of size 1 is contiguous whatever its stride. Padded
    rows (a stride above the row) are given a layout here; the replay's shape check (reread.mm_operands: the bytes
    must be rows x cols) then leaves such an operand in address order."""
    if len(shape) != 2:
        return ""
    (r, c), (sr, sc) = shape, stride
    if (c == 1 or sc == 1) and (r == 1 or sr >= c):
        return "n"
    if (r == 1 or sr == 1) and (c == 1 or sc >= r):
        return "t"
    return ""


def gemm_operand_layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> str:
    """BLAS layout of a GEMM operand: a 2-D matrix (:func:`matrix_layout`), or a 3-D batch of matrices stored one
    after another (``bmm``'s strided batch with batch stride ``rows * cols``; a batch of one whatever its stride)
    by the layout of its matrices; "" for any other view (a broadcast or padded batch)."""
    if len(shape) == 3:
        b, r, c = shape
        if b != 1 and stride[0] != r * c:
            return ""
        shape, stride = shape[1:], stride[1:]
    return matrix_layout(shape, stride)
