"""The RTX 5090 PyTorch GCN of noob512/uvm as a synthetic, torch-free trace (a workload uvmlab ships).

Source: noob512/uvm ``workloads/pytorch/benchmark_gnn_uvm.py`` at 5a9f2f2 (``--dataset random --prop chunked``,
features 128, hidden 256, 10 classes, 10 edges per node, chunk 2,000,000 edges, Adam, 1 warm-up + 2 timed epochs),
measured in real-data/uvm/noob512-uvm_rtx5090_pytorch_gcn. With ``use_uvm`` every tensor is its own
``cudaMallocManaged`` (no caching: placement ``nocache``), every free a ``cudaFree``.

The trace follows the script tensor by tensor (sizes exact, fp32 features, int64 indices):

* setup: the random graph (``edge_index`` [2, 10N], ``x`` [N, 128], ``y``, ``train_mask``) and the normalised
  graph (symmetrised + self loops: ``src``, ``dst`` [21N] int64, ``edge_weight`` [21N] fp32; temporaries freed);
* per epoch: ``lin1`` -> h1 [N, 256]; chunked aggregation (``ChunkedIndexAddWeightedFunction``): ``out = zeros``,
  per chunk of 2M edges ``g = x[src]`` [m, F], ``msg = g * w``, ``out.index_add_(0, dst, msg)``; ReLU, dropout
  (bool mask), ``lin2`` -> [N, 10], aggregation again; cross-entropy on the 10 % train nodes; the backward mirrors
  it (``grad_out.index_select(0, dst) * w`` then ``index_add_`` per chunk); Adam over the 4 parameters.
* A gather or scatter through random indices touches every page of the indexed tensor (its UVM access is the whole
  tensor) but moves only ``m`` rows of DRAM traffic: the kernel's ``touched_bytes`` column gives the native roofline
  the bytes actually moved [approximation: rows read once, 32 B sectors not modelled].

Setup tensors of category ``input``/``parameter`` written in phase setup count as retained host-to-device copies
(uvmlab.sim.uvm.replay.copy_kernels: the seed study's convention), although the script creates them on the device;
either way they are GPU-resident before the first epoch, so only setup time differs (not reported).
Approximations: inference-mode evaluation after training, CPU-side ``.item()`` and the loss's small tensors are not
modelled; ``y``/``train_mask`` indexing is one kernel. The user-prefetch variant (``with_prefetch``) issues a
``cudaMemPrefetchAsync(ptr, size, device, stream)`` of every new tensor right after its ``cudaMallocManaged``, at
every size, with no budget and no advice: the allocator of the with-user-prefetch runs as listed in noob512/uvm
``workloads/pytorch/docs/UVM_EVALUATION.md`` section 2.4 (the document that reports those runs) and as committed in
weiso131/schedcp ``workloads/pytorch/uvm_allocator.c`` @8a8dccd. The replay models it as a prefetch (uvm.md 1.9:
populates without faults; beyond free memory it evicts, ``uvm_migrate.c``). A later allocator (crupest/gpu_ext
``workloads/pytorch/uvm_allocator.c`` @bf75d9f, the README's "budget" text) instead advises preferred location CPU
beyond ``total - 2 GiB`` and does not prefetch; ``prefetch_budget`` (bytes of live tensors up to which new tensors
are prefetched; None = all) keeps that variant's first half available.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from uvmlab.trace.schema import NEVER_FREED, Trace

FEATURES = 128
HIDDEN = 256
CLASSES = 10
EDGES_PER_NODE = 10
CHUNK_EDGES = 2_000_000
"""benchmark_gnn_uvm.py defaults as recorded in every result JSON (``chunk_size``, ``hidden_dim``, ...)."""


class _Builder:
    def __init__(self) -> None:
        self.allocs: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.accesses: list[dict[str, Any]] = []
        self.seq = 0
        self.phase = "setup"
        self.it = -1
        self.live = 0
        self.prefetch = False
        self.prefetch_budget: int | None = None

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def alloc(self, nbytes: int, cat: str = "activation") -> int:
        aid = self._alloc(nbytes, cat)
        if self.prefetch and (self.prefetch_budget is None or self.live + nbytes <= self.prefetch_budget):
            self.prefetch_range(aid)
        self.live += nbytes
        return aid

    def _alloc(self, nbytes: int, cat: str) -> int:
        aid = len(self.allocs)
        self.allocs.append(
            {
                "alloc_id": aid,
                "size_bytes": int(nbytes),
                "alloc_seq": self._next(),
                "free_seq": NEVER_FREED,
                "category": cat,
                "phase": self.phase,
                "iteration": self.it,
                "op": "gcn",
                "stream": 0,
            }
        )
        return aid

    def prefetch_range(self, aid: int) -> None:
        """``cudaMemPrefetchAsync(ptr, size, gpu)`` of a whole tensor (a zero-FLOP "kernel" with api=prefetch)."""
        self.kernel("cudaMemPrefetchAsync", [], [aid])
        self.kernels[-1]["api"] = "prefetch"
        self.kernels[-1]["touched_bytes"] = 0.0

    def free(self, *aids: int) -> None:
        for a in aids:
            self.allocs[a]["free_seq"] = self._next()
            self.live -= self.allocs[a]["size_bytes"]

    def kernel(
        self,
        name: str,
        reads: list[int],
        writes: list[int],
        flops: float = 0.0,
        touched: float | None = None,
        read_slices: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        """One kernel; ``read_slices`` limits a read to (offset, size) bytes of a tensor (a slice view)."""
        kid = len(self.kernels)
        rs = read_slices or {}
        acc = [(a, *rs.get(a, (0, self.allocs[a]["size_bytes"])), False) for a in reads]
        acc += [(a, 0, self.allocs[a]["size_bytes"], True) for a in writes]
        self.kernels.append(
            {
                "kernel_id": kid,
                "seq": self._next(),
                "name": name,
                "phase": self.phase,
                "iteration": self.it,
                "flops": float(flops),
                "stream": 0,
                "touched_bytes": float(touched if touched is not None else sum(s for _, _, s, _ in acc)),
                "api": "",
                "order": "address",  # the replica's calibrated model (uvmlab.sim.uvm.order derives no order for it)
            }
        )
        for a, off, size, w in acc:
            self.accesses.append(
                {"kernel_id": kid, "alloc_id": a, "offset_bytes": int(off), "size_bytes": int(size), "is_write": w}
            )


def _aggregate(
    b: _Builder, x: int, src: int, dst: int, w: int, n: int, feat: int, backward: bool, chunk: int = CHUNK_EDGES
) -> int:
    """Chunked weighted aggregation (forward: gather by src, scatter by dst; backward: the reverse)."""
    e = (2 * EDGES_PER_NODE + 1) * n
    out = b.alloc(n * feat * 4)
    b.kernel("zeros", [], [out])
    for s in range(0, e, chunk):
        m = min(chunk, e - s)
        rows = m * feat * 4
        g = b.alloc(rows)
        idx_in = dst if backward else src
        idx_out = src if backward else dst
        b.kernel(
            "index_select" if backward else "index",
            [idx_in, x],
            [g],
            touched=m * 8 + 2 * rows,
            read_slices={idx_in: (s * 8, m * 8)},  # this chunk's edges
        )
        msg = b.alloc(rows)
        b.kernel("mul", [g, w], [msg], flops=m * feat, touched=2 * rows + m * 4, read_slices={w: (s * 4, m * 4)})
        b.free(g)
        b.kernel(
            "index_add_", [msg, idx_out, out], [out], touched=3 * rows + m * 8, read_slices={idx_out: (s * 8, m * 8)}
        )
        b.free(msg)
    return out


def gcn_trace(
    nodes: int,
    epochs: int = 3,
    with_prefetch: bool = False,
    prefetch_budget: int | None = None,
    chunk_edges: int = CHUNK_EDGES,
) -> Trace:
    """The chunked GCN of benchmark_gnn_uvm.py on ``nodes`` nodes: setup plus ``epochs`` epochs (the first is the
    script's warm-up epoch). See the module docstring. ``chunk_edges``: the script's ``--chunk_size``."""
    n = int(nodes)
    e0 = EDGES_PER_NODE * n
    e = 2 * e0 + n
    b = _Builder()
    b.prefetch, b.prefetch_budget = with_prefetch, prefetch_budget
    edge_index = b.alloc(2 * e0 * 8, "input")
    b.kernel("randint", [], [edge_index])
    x = b.alloc(n * FEATURES * 4, "input")
    b.kernel("randn", [], [x])
    y = b.alloc(n * 8, "input")
    b.kernel("randint", [], [y])
    mask = b.alloc(n, "input")
    b.kernel("fill", [], [mask])
    src_sym = b.alloc(2 * e0 * 8, "temporary")
    dst_sym = b.alloc(2 * e0 * 8, "temporary")
    b.kernel("cat", [edge_index], [src_sym, dst_sym])
    loop = b.alloc(n * 8, "temporary")
    b.kernel("arange", [], [loop])
    src = b.alloc(e * 8, "input")
    dst = b.alloc(e * 8, "input")
    b.kernel("cat", [src_sym, dst_sym, loop], [src, dst])
    deg = b.alloc(n * 8, "temporary")
    b.kernel("bincount", [dst], [deg])
    degf = b.alloc(n * 4, "temporary")
    b.kernel("clamp_float", [deg], [degf])
    ds = b.alloc(e * 4, "temporary")
    b.kernel("gather_sqrt", [degf, src], [ds])
    dd = b.alloc(e * 4, "temporary")
    b.kernel("gather_sqrt", [degf, dst], [dd])
    w = b.alloc(e * 4, "input")
    b.kernel("rsqrt_mul", [ds, dd], [w])
    b.free(src_sym, dst_sym, loop, deg, degf, ds, dd)
    shapes = [(HIDDEN, FEATURES), (HIDDEN,), (CLASSES, HIDDEN), (CLASSES,)]
    params = []
    for shp in shapes:
        p = b.alloc(4 * math.prod(shp), "parameter")
        b.kernel("init", [], [p])
        params.append(p)
    w1, b1, w2, b2 = params
    adam: list[int] = []
    grads: list[int] = []
    n_train = n // 10
    for it in range(epochs):
        b.it = it
        b.phase = "zero_grad"
        if grads:
            b.free(*grads)
        b.phase = "forward"
        h1 = b.alloc(n * HIDDEN * 4)
        b.kernel("addmm", [x, w1, b1], [h1], flops=2.0 * n * FEATURES * HIDDEN)
        out1 = _aggregate(b, h1, src, dst, w, n, HIDDEN, backward=False, chunk=chunk_edges)
        b.free(h1)
        r1 = b.alloc(n * HIDDEN * 4)
        b.kernel("relu", [out1], [r1])
        b.free(out1)
        dmask = b.alloc(n * HIDDEN)
        d1 = b.alloc(n * HIDDEN * 4)
        b.kernel("native_dropout", [r1], [dmask, d1])
        h2 = b.alloc(n * CLASSES * 4)
        b.kernel("addmm", [d1, w2, b2], [h2], flops=2.0 * n * HIDDEN * CLASSES)
        out2 = _aggregate(b, h2, src, dst, w, n, CLASSES, backward=False, chunk=chunk_edges)
        b.free(h2)
        sel = b.alloc(n_train * CLASSES * 4)
        b.kernel("index_mask", [out2, mask], [sel])
        ysel = b.alloc(n_train * 8)
        b.kernel("index_mask", [y, mask], [ysel])
        lsm = b.alloc(n_train * CLASSES * 4)
        b.kernel("log_softmax", [sel], [lsm])
        loss = b.alloc(4)
        b.kernel("nll_loss", [lsm, ysel], [loss])
        b.phase = "backward"
        g_lsm = b.alloc(n_train * CLASSES * 4)
        b.kernel("nll_loss_backward", [ysel, loss], [g_lsm])
        g_sel = b.alloc(n_train * CLASSES * 4)
        b.kernel("log_softmax_backward", [g_lsm, lsm], [g_sel])
        b.free(g_lsm, lsm, loss, ysel, sel)
        g_out2 = b.alloc(n * CLASSES * 4)
        b.kernel("index_put", [g_sel, mask], [g_out2])
        b.free(g_sel, out2)
        g_h2 = _aggregate(b, g_out2, src, dst, w, n, CLASSES, backward=True, chunk=chunk_edges)
        b.free(g_out2)
        g_w2 = b.alloc(4 * CLASSES * HIDDEN)
        g_b2 = b.alloc(4 * CLASSES)
        b.kernel("mm", [g_h2, d1], [g_w2, g_b2], flops=2.0 * n * HIDDEN * CLASSES)
        g_d1 = b.alloc(n * HIDDEN * 4)
        b.kernel("mm", [g_h2, w2], [g_d1], flops=2.0 * n * HIDDEN * CLASSES)
        b.free(g_h2, d1)
        g_r1 = b.alloc(n * HIDDEN * 4)
        b.kernel("native_dropout_backward", [g_d1, dmask], [g_r1])
        b.free(g_d1, dmask)
        g_out1 = b.alloc(n * HIDDEN * 4)
        b.kernel("threshold_backward", [g_r1, r1], [g_out1])
        b.free(g_r1, r1)
        g_h1 = _aggregate(b, g_out1, src, dst, w, n, HIDDEN, backward=True, chunk=chunk_edges)
        b.free(g_out1)
        g_w1 = b.alloc(4 * HIDDEN * FEATURES)
        g_b1 = b.alloc(4 * HIDDEN)
        b.kernel("mm", [g_h1, x], [g_w1, g_b1], flops=2.0 * n * FEATURES * HIDDEN)
        b.free(g_h1)
        grads = [g_w1, g_b1, g_w2, g_b2]
        b.phase = "optimizer"
        if not adam:
            for p in params:
                sz = b.allocs[p]["size_bytes"]
                adam += [b.alloc(sz, "optimizer_state"), b.alloc(sz, "optimizer_state")]
        b.kernel(
            "_fused_adam", grads + adam, params + adam, flops=10.0 * sum(b.allocs[p]["size_bytes"] for p in params)
        )
    trace = Trace(
        allocations=pd.DataFrame(b.allocs),
        kernels=pd.DataFrame(b.kernels),
        accesses=pd.DataFrame(b.accesses),
        header={
            "workload": "gcn",
            "nodes": n,
            "epochs": epochs,
            "with_prefetch": with_prefetch,
            "source": "noob512/uvm workloads/pytorch/benchmark_gnn_uvm.py @5a9f2f2 (synthetic trace)",
        },
    )
    trace.validate("gcn trace")
    return trace
