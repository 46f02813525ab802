"""The order in which a tiled GEMM first asks for its operands' pages (torch-free; issue 41 section 3).

A GEMM's threads do not walk its operands in address order. cuBLAS and CUTLASS compute PyTorch's row-major
``out[m, n] = a[m, k] b[k, n]`` column-major as ``out^T = b^T a^T``, so the GEMM's M dimension is PyTorch's ``n``
(operand ``b``) and its N dimension PyTorch's ``m`` (operand ``a``). Its grid of ``TILE_M x TILE_N`` output tiles is
rasterized with the M tile index fastest (CUTLASS ``GemmIdentityThreadblockSwizzle``; uvmlab.sim.uvm.reread): CTA
``c = j * mt + i`` computes tile ``i`` along ``n`` and tile ``j`` along ``m``, with ``mt = ceil(n / TILE_M)``. The
CTAs resident at once (``reread.CTAS_PER_SM`` per SM) run as one *wave*; every CTA of a wave walks ``k`` in slabs of
``TILE_K`` (its main loop), reading at slab ``t`` the ``TILE_N`` rows of ``a`` of its tile and columns ``t*TILE_K ..``
and the ``TILE_K`` rows of ``b`` of slab ``t`` and its tile's ``TILE_M`` columns; it writes its output tile after
its last slab (the epilogue). A page's *first request* is the earliest (wave, slab, CTA) that reads or writes an
element of it; the faults of a kernel that finds its operands missing arrive in that order, and the driver's
batches take them in that order (uvmlab.sim.uvm.faults ``FaultService.access_in_order``).

Where the order differs from the address order: an operand whose contiguous dimension is ``k`` (``a`` stored
``[m, k]``, the ``n`` layout; ``b`` stored ``[n, k]``, a linear layer's weight, the ``t`` layout) is read *across*
its storage rows at every slab, one page per row of the tile, so a batch's faults are spread over many rows (and
blocks) rather than packed into a few runs: the prefetcher sees fewer faults per block and migrates smaller
regions, in more transfers. An operand whose contiguous dimension is not ``k`` is read along its storage rows
(a slab of ``b`` stored ``[k, n]`` is ``TILE_K`` whole rows): nearly the address order.

Sources: tiles ``TILE_M x TILE_N x TILE_K`` = 128 x 128 x 8, CUTLASS ``DefaultGemmConfiguration<OpClassSimt, ...>``
(``ThreadblockShape = GemmShape<128, 128, 8>``, include/cutlass/gemm/device/default_gemm_configuration.h); the
rasterization as above; a batched GEMM's (``bmm``, ``baddbmm``) batches run one after another, the batch index the
grid's slowest dimension (CUTLASS ``GemmBatchedIdentityThreadblockSwizzle``: grid ``(m tiles, n tiles, batches)``,
``get_batch_idx()`` is ``blockIdx.z``; threadblock_swizzle.h). Layouts come from the trace (column ``layout``,
written by the recorder from the operands' strides: ``n`` the last dimension contiguous, ``t`` the one before it).

Approximations (docs/uvm-sim.md "GEMM faults in tile order"): the CTAs of a wave advance slab by slab together (a
real wave's CTAs drift apart and later waves start as CTAs retire, not all at once); cuBLAS's closed kernels pick
other tiles (64-256 wide on A100) and may split ``k`` (split-K) or swizzle tiles in groups; reads of one slab are
taken together, before any write; ``addmm``'s bias and ``baddbmm``'s input are read first (the epilogue reads them,
last); an output that is not contiguous is taken as contiguous.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES
from uvmlab.sim.uvm.reread import TILE_M, TILE_N, MmOperands

TILE_K = 8
"""K slab of one main-loop iteration (CUTLASS SIMT ``GemmShape<128, 128, 8>``, default_gemm_configuration.h)."""
PLANS_KEPT = 4096
"""Cost, not physics: tile plans memoized per GEMM shape, layouts and page offsets, then dropped (a training step
has tens of distinct GEMMs)."""
LAYOUTS = ("n", "t")
"""Storage of a 2-D operand: ``n`` its last dimension contiguous (row-major), ``t`` the one before (a transposed
view of a row-major tensor, e.g. ``weight.t()``)."""


@dataclass(frozen=True)
class OperandOrder:
    """One operand's pages (byte offsets of each page's first byte within its range, page-aligned) and the rank
    of their first request, smaller first."""

    page_offsets: np.ndarray
    keys: np.ndarray


KeyFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""First-request key of storage elements (row, column), element-wise."""


def _page_keys(offset: int, rows: int, cols: int, e: int, key_of: KeyFn, batch_rows: int = 0) -> OperandOrder:
    """First-request keys of the pages of a row-major ``[rows, cols]`` storage starting at byte ``offset``, made of
    batches of ``batch_rows`` rows each (0: one batch).

    ``key_of(r, c)`` must not decrease along ``c``, nor from one row's first element to the next row's within a
    batch, nor from one batch's first element to the next batch's (true of every operand here), so a page's
    smallest key is that of its first element, of the first element of the next storage row when that row starts
    inside the page, or of the first element of the next batch when that batch starts inside the page.
    """
    total = rows * cols
    p0 = offset // PAGE_BYTES
    p1 = -(-(offset + total * e) // PAGE_BYTES)
    starts = np.arange(p0, p1, dtype=np.int64) * PAGE_BYTES
    ends = starts + PAGE_BYTES
    first = np.maximum(0, -(-(starts - offset) // e))  # first element at or after the page start
    first = np.minimum(first, total - 1)
    r, c = first // cols, first % cols
    key = key_of(r, c)
    zero = np.zeros_like(c)
    candidates = [r + 1]
    if 0 < batch_rows < rows:
        candidates.append((r // batch_rows + 1) * batch_rows)
    for nxt in candidates:
        inside = (nxt < rows) & (offset + nxt * cols * e < ends)
        if inside.any():
            key = np.where(inside, np.minimum(key, key_of(np.minimum(nxt, rows - 1), zero)), key)
    return OperandOrder(starts, key)


def mm_tile_orders(mm: MmOperands, layouts: str, e: int, ctas: int) -> list[OperandOrder] | None:
    """Per operand of an ``mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` (``[*others, a, b, out]``), its pages and
    first-request keys in the tile order (module docstring); None when a layout is not ``n`` or ``t``.

    ``layouts``: the layouts of ``a`` and ``b`` (e.g. ``"nt"``); ``ctas``: the CTAs resident at once (one wave). A
    batched GEMM's grid is its batches' grids one after another (the batch index is the grid's slowest dimension,
    ``blockIdx.z`` in CUTLASS's ``GemmBatchedIdentityThreadblockSwizzle``), so CTA ``batch * tiles + c`` computes
    tile ``c`` of its batch.
    """
    if len(layouts) != 2 or any(x not in LAYOUTS for x in layouts):
        return None
    m, n, k, nb = mm.m, mm.n, mm.k, mm.batch
    mt = -(-n // TILE_M)  # tiles along the GEMM's M (PyTorch n), rasterized fastest
    tiles = mt * -(-m // TILE_N)  # CTAs of one batch
    n_ctas = tiles * nb
    slabs = -(-k // TILE_K)
    w = max(1, ctas)

    def rank(cta: np.ndarray, slab: np.ndarray) -> np.ndarray:
        return ((cta // w) * (slabs + 1) + slab) * n_ctas + cta

    def split(row: np.ndarray, per_batch: int) -> tuple[np.ndarray, np.ndarray]:  # storage row -> (batch, row)
        return row // per_batch, row % per_batch

    def a_key(row: np.ndarray, col: np.ndarray) -> np.ndarray:  # element (batch, m, k) of a
        bt, r = split(row, a_rows)
        mm_, kk = (r, col) if layouts[0] == "n" else (col, r)
        return rank(bt * tiles + (mm_ // TILE_N) * mt, kk // TILE_K)

    def b_key(row: np.ndarray, col: np.ndarray) -> np.ndarray:  # element (batch, k, n) of b
        bt, r = split(row, b_rows)
        kk, nn = (r, col) if layouts[1] == "n" else (col, r)
        return rank(bt * tiles + nn // TILE_M, kk // TILE_K)

    def out_key(row: np.ndarray, col: np.ndarray) -> np.ndarray:  # element (batch, m, n) of out, after its last slab
        bt, r = split(row, m)
        return rank(bt * tiles + (r // TILE_N) * mt + col // TILE_M, np.full_like(row, slabs))

    a_rows, a_cols = (m, k) if layouts[0] == "n" else (k, m)
    b_rows, b_cols = (k, n) if layouts[1] == "n" else (n, k)
    out = [  # the bias / input: read before the main loop
        _page_keys(row[1], 1, max(1, row[2] // e), e, lambda r, c: np.full_like(r, -1)) for row in mm.others
    ]
    out.append(_page_keys(mm.a[1], nb * a_rows, a_cols, e, a_key, a_rows))
    out.append(_page_keys(mm.b[1], nb * b_rows, b_cols, e, b_key, b_rows))
    out.append(_page_keys(mm.writes[0][1], nb * m, n, e, out_key, m))
    return out


@dataclass(frozen=True)
class _Plan:
    """A GEMM's tile order independent of where its operands lie: per operand, its page indices relative to its
    first page; and the permutation that sorts the concatenated pages (reads, then writes) by first request."""

    rel_pages: list[np.ndarray]
    n_reads: int  # pages of the read operands (the first ``n_reads`` of the concatenation)
    perm_reads: np.ndarray
    perm_writes: np.ndarray


class TileOrders:
    """The tile-order fault stages of GEMM kernels (``mm``, ``addmm``, ``bmm``, ``baddbmm``), memoized on everything
    but the operands' ranges (a training step runs the same GEMM shapes every iteration)."""

    def __init__(self, ctas: int) -> None:
        self.ctas = ctas
        self._memo: dict[tuple[object, ...], _Plan | None] = {}

    def known(self, mm: MmOperands, layouts: str, e: int) -> bool:
        """True when the GEMM has a tile order (its layouts are ``n`` or ``t``); the plan is memoized."""
        return self._plan_of(mm, layouts, e) is not None

    def _plan_of(self, mm: MmOperands, layouts: str, e: int) -> _Plan | None:
        key = self._key(mm, layouts, e)
        plan = self._memo.get(key, False)
        if plan is False:
            if len(self._memo) >= PLANS_KEPT:
                self._memo.clear()
            plan = self._memo[key] = self._plan(mm, layouts, e)
        return plan

    def stages(
        self, mm: MmOperands, layouts: str, e: int, page_gids: Callable[[int, np.ndarray], np.ndarray]
    ) -> list[tuple[np.ndarray, bool]] | None:
        """(global page ids in first-request order, is_write) for the reads, then the writes (the input of
        ``FaultService.access_in_order``); None when the layouts are not known. ``page_gids(range_id, pages)``
        maps page indices within a range to global page ids."""
        ops = mm.operands
        plan = self._plan_of(mm, layouts, e)
        if plan is None:
            return None
        gids = np.concatenate(
            [page_gids(r[0], r[1] // PAGE_BYTES + rel) for r, rel in zip(ops, plan.rel_pages, strict=True)]
        )
        shared = len({r[0] for r in ops}) < len(ops)  # operands in one range may share a page: keep its first
        out = []
        for part, perm, is_write in (
            (gids[: plan.n_reads], plan.perm_reads, False),
            (gids[plan.n_reads :], plan.perm_writes, True),
        ):
            ordered = part[perm]
            if shared:
                _, first = np.unique(ordered, return_index=True)
                ordered = ordered[np.sort(first)]
            out.append((ordered, is_write))
        return out

    @staticmethod
    def _key(mm: MmOperands, layouts: str, e: int) -> tuple[object, ...]:
        ops = mm.operands
        return (mm.m, mm.n, mm.k, mm.batch, layouts, e, len(mm.others), *((r[1] % PAGE_BYTES, r[2]) for r in ops))

    @staticmethod
    def schedule_key(mm: MmOperands, layouts: str, e: int) -> tuple[object, ...]:
        """What, besides the state of its blocks, decides the batches of a GEMM's tile order: its plan, and where
        its operands lie relative to 2 MiB blocks and to each other (operands in one range share its blocks)."""
        ops = mm.operands
        groups: dict[int, int] = {}
        places = []
        for r in ops:
            g = groups.setdefault(r[0], len(groups))
            places.append((g, r[1] % VA_BLOCK_BYTES if sum(x[0] == r[0] for x in ops) == 1 else r[1]))
        return (mm.m, mm.n, mm.k, mm.batch, layouts, e, len(mm.others), *((r[2],) for r in ops), *places)

    def _plan(self, mm: MmOperands, layouts: str, e: int) -> _Plan | None:
        orders = mm_tile_orders(mm, layouts, e, self.ctas)
        if orders is None:
            return None
        rel = [o.page_offsets // PAGE_BYTES - o.page_offsets[0] // PAGE_BYTES for o in orders]
        keys = [o.keys for o in orders]
        n_reads = int(sum(r.size for r in rel[:-1]))
        return _Plan(
            rel,
            n_reads,
            np.argsort(np.concatenate(keys[:-1]), kind="stable"),
            np.argsort(keys[-1], kind="stable"),
        )
