"""Child step of ``uvmlab collect``: the noob512 GCN (``benchmark_gnn_uvm.py``), under UVM and natively.

``python -m uvmlab.measure.gpu.kit.gcn OUT (--nodes N | --fraction-of-free F --max-seconds S) [--epochs 3]
[--chunk-edges 2000000] [--variant uvm|native] [--device cuda | --device cpu --cudart LIB]``

Sizing (issue 43 blocker 3): with ``--fraction-of-free`` the node count is decided here, from the free memory this
process measures when it starts (``cudaMemGetInfo``; the runtime LIB's with ``--device cpu``), not from a plan made
earlier elsewhere: the largest count whose simulated footprint, inflated by the estimator's worst known error, fits
``F x free`` and the managed limit, and whose epochs fit ``--max-seconds`` (uvmlab.measure.gpu.kit.sizing
``gcn_nodes_within``); ``OUT/sizing.json`` records the numbers. Before, the plan sized it from NVML's free memory
with a 10 % margin: a simulator 9 % low would have asked for more managed memory than was free.

The program is the one of workloads/files/gcn.py, noob512/uvm
``workloads/pytorch/benchmark_gnn_uvm.py`` at 5a9f2f2 (``--dataset random --prop chunked``; features 128, hidden 256,
10 classes, 10 edges per node, chunks of 2,000,000 edges, Adam): a random graph, symmetrised with self loops and
``1 / sqrt(deg_src deg_dst)`` edge weights; per epoch ``lin1``, a chunked weighted aggregation (``g = x[src]``,
``msg = g * w``, ``out.index_add_(0, dst, msg)`` per chunk; its backward the reverse), ReLU, dropout, ``lin2``, the
aggregation again, cross-entropy on the first 10 % of the nodes, Adam. Epoch 0 is the warm-up; the others are timed
(``torch.cuda.synchronize`` at each end). [approximation: the first 10 % of the nodes, not a random 10 %, are the
training nodes; the script's evaluation pass is not run, as in the simulated trace.]

``--variant uvm`` is what the script's ``use_uvm`` did (every tensor its own ``cudaMallocManaged``, no caching): the
plan runs this step with the uvmlab shim preloaded and ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, so each tensor is one
``cudaMalloc`` turned managed, and the shim's allocation log gives the peak of live managed bytes;
``--variant native`` runs with PyTorch's caching allocator, as the script's runs without UVM. ``OUT/<nodes>.json``
has the script's result keys (``avg_epoch_time_s``, ``epoch_times_s``, ``uvm_stats.peak_allocated_GB`` filled in
when the collection is assembled from the shim log, ``memory.gpu_allocated_GB``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from uvmlab.errors import UvmlabError
from workloads.files.gcn import CLASSES, DROPOUT, EDGES_PER_NODE, FEATURES, HIDDEN, LR, OPTIONS, aggregate

CHUNK_EDGES = OPTIONS["chunk_edges"]
"""The model, its sizes and the chunked aggregation are the shipped file's (workloads/files/gcn.py): what the kit
measures on a GPU is the program ``uvmlab validate`` simulates."""
VARIANTS = ("uvm", "native")


def run_gcn(nodes: int, epochs: int = 3, chunk_edges: int = CHUNK_EDGES, device: str = "cuda") -> dict[str, Any]:
    """Build the graph and train ``epochs`` epochs on ``device``; the result keys of the module docstring."""
    import torch

    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise UvmlabError("the GCN step found no CUDA device (torch.cuda.is_available() is False)")
    sync = torch.cuda.synchronize if is_cuda else (lambda: None)
    torch.manual_seed(0)
    n = int(nodes)
    edge_index = torch.randint(0, n, (2, EDGES_PER_NODE * n), device=dev)
    x = torch.randn(n, FEATURES, device=dev)
    y = torch.randint(0, CLASSES, (n,), device=dev)
    mask = torch.zeros(n, dtype=torch.bool, device=dev)
    mask[: n // 10] = True
    loop = torch.arange(n, device=dev)
    src = torch.cat([edge_index[0], edge_index[1], loop])
    dst = torch.cat([edge_index[1], edge_index[0], loop])
    del loop
    deg = torch.bincount(dst, minlength=n).float().clamp(min=1.0)
    w = deg[src].rsqrt() * deg[dst].rsqrt()
    del deg
    lin1, lin2 = torch.nn.Linear(FEATURES, HIDDEN).to(dev), torch.nn.Linear(HIDDEN, CLASSES).to(dev)
    opt = torch.optim.Adam([*lin1.parameters(), *lin2.parameters()], lr=LR)
    agg = aggregate(torch)
    sync()
    times = []
    for _epoch in range(epochs):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        h = agg(lin1(x), src, dst, w, chunk_edges)
        h = torch.nn.functional.dropout(torch.relu(h), DROPOUT, training=True)
        out = agg(lin2(h), src, dst, w, chunk_edges)
        loss = torch.nn.functional.cross_entropy(out[mask], y[mask])
        loss.backward()
        opt.step()
        del h, out, loss
        sync()
        times.append(time.perf_counter() - start)
    timed = times[1:] or times
    return {
        "nodes": n,
        "epochs": epochs,
        "chunk_size": chunk_edges,
        "hidden_dim": HIDDEN,
        "features": FEATURES,
        "epoch_times_s": times,
        "avg_epoch_time_s": sum(timed) / len(timed),
        "memory": {"gpu_allocated_GB": torch.cuda.max_memory_allocated() / 1e9 if is_cuda else None},
        "uvm_stats": {"peak_allocated_GB": None},
        "device": device,
    }


def measured_free(device: str, cudart: str | None) -> int:
    """Free device memory now: the real ``cudaMemGetInfo`` (the runtime LIB's with ``--device cpu --cudart``)."""
    import ctypes

    from uvmlab.measure.gpu.worker import real_mem_get_info

    if device.startswith("cuda"):
        import torch

        from uvmlab.measure.gpu.cudart import load_cudart

        torch.cuda.init()
        return real_mem_get_info(load_cudart())[0]
    if not cudart:
        raise UvmlabError("--fraction-of-free on the CPU needs --cudart (the runtime whose free memory to read)")
    return real_mem_get_info(ctypes.CDLL(cudart))[0]


def size_nodes(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The node count: ``--nodes``, or from the measured free memory (module docstring)."""
    if args.nodes:
        return int(args.nodes), {"nodes_given": True}
    from uvmlab.measure.gpu.kit.plan import gcn_nodes_for
    from uvmlab.measure.gpu.kit.sizing import gcn_nodes_within

    free = measured_free(args.device, args.cudart)
    nodes, numbers = gcn_nodes_within(
        free, args.fraction_of_free, args.max_seconds, args.epochs, lambda t: gcn_nodes_for(t, args.chunk_edges)
    )
    if nodes is None:
        raise UvmlabError(
            f"the GCN fits no node count: {numbers['target_bytes']:.0f} B allowed by the free memory, the margin "
            "and the time cap is less than 1,000 nodes need"
        )
    return nodes, {**numbers, "nodes": nodes, "fraction_of_free": args.fraction_of_free}


def main(argv: list[str] | None = None) -> int:
    from uvmlab.files.atomic import atomic_write_json

    parser = argparse.ArgumentParser(prog="python -m uvmlab.measure.gpu.kit.gcn", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--fraction-of-free", type=float, default=None)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--chunk-edges", type=int, default=CHUNK_EDGES)
    parser.add_argument("--variant", choices=VARIANTS, default="uvm")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cudart", default=None)
    args = parser.parse_args(argv)
    if not args.nodes and not args.fraction_of_free:
        parser.error("give --nodes or --fraction-of-free")
    try:
        import torch

        args.nodes, sizing = size_nodes(args)
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / "sizing.json", sizing)

        try:
            doc = run_gcn(args.nodes, args.epochs, args.chunk_edges, args.device)
            doc["outcome"] = "ok"
        except torch.OutOfMemoryError as exc:
            doc = {"nodes": args.nodes, "outcome": "oom", "error": str(exc).splitlines()[0]}
    except UvmlabError as exc:
        print(f"uvmlab gcn step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    doc["use_uvm"] = args.variant == "uvm"
    atomic_write_json(args.out / f"{args.nodes}.json", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
