"""A trace replayed through an allocator simulator that records PyTorch-style trace entries (for snapshots).

``place()`` keeps no simulator, so ``uvmlab estimate --snapshot`` and ``run --snapshot`` replay once more with
``record_events=True`` (same models, same event order); the callers check that the peaks agree.
"""

from __future__ import annotations

from typing import Any

from uvmlab.errors import InvariantError, OutOfMemoryError
from uvmlab.gpus import GpuSpec
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.nocache import NoCacheAllocatorSim
from uvmlab.trace.schema import Trace


def cudnn_workspace_ids(trace: Trace) -> list[int]:
    """Alloc ids of the per-call cuDNN workspaces: an OOM there makes PyTorch try the next engine config.

    ``try_configs`` / ``try_plans`` and the cached-plan path of ``run_single_conv`` catch ``c10::OutOfMemoryError``
    (aten/src/ATen/native/cudnn/Conv_v8.cpp, commit 06ca69ca), then the heuristic list goes on to the fallback
    list; so a workspace that does not fit never ends the run. Approximation: the engine that runs instead
    needs no workspace (the fallback engines' sizes are cuDNN's). The ``cudnn.benchmark`` trial workspaces too:
    ``generate_and_filter_plans`` halves a trial that does not fit until it does (approximation: dropped).
    """
    a = trace.allocations
    if "op" not in a.columns:
        return []
    return a.loc[a["op"].isin(("cudnn_workspace", "cudnn_benchmark_workspace")), "alloc_id"].astype("int64").tolist()


def recorded_run(
    trace: Trace, allocator: str, settings: Any, gpu: GpuSpec | None, entry_seqs: list[int] | None = None
) -> Any:
    """Replay ``trace`` through a simulator that records PyTorch-style trace entries; returns the simulator.

    ``place()`` does not keep its simulator, so ``--snapshot`` replays once more with ``record_events=True``
    (same models, same event order; :func:`estimate` checks the peaks agree). ``entry_seqs``, if given, receives
    the trace ``seq`` of the alloc/free that caused each recorded entry (one per entry, in order).
    """
    device = DeviceSim(None) if gpu is None else DeviceSim(gpu.memory_bytes, gpu.context_bytes)
    if allocator == "pca":
        sim: Any = CachingAllocatorSim(settings, device, record_events=True)
    else:
        sim = NoCacheAllocatorSim(device, record_events=True)
    blocks: dict[int, Any] = {}
    fallible = set(cudnn_workspace_ids(trace)) if gpu is not None else set()
    ev = trace.events()
    cols = [ev[c].tolist() for c in ("seq", "alloc_id", "size_bytes", "is_alloc", "stream")]
    for seq, aid, size, is_alloc, stream in zip(*cols, strict=True):
        if is_alloc:
            if size <= 0:
                continue
            try:
                blocks[aid] = sim.malloc(size, stream)
            except OutOfMemoryError:
                if aid not in fallible:  # a fallible one: PyTorch runs another cuDNN engine (cudnn_workspace_ids)
                    if entry_seqs is not None:
                        entry_seqs.extend([seq] * (len(sim.events) - len(entry_seqs)))
                    break  # the snapshot then shows the state at the OOM, with its ``oom`` trace entry
        elif aid in blocks:
            sim.free(blocks.pop(aid))
        if entry_seqs is not None:
            entry_seqs.extend([seq] * (len(sim.events) - len(entry_seqs)))
    sim.check_invariants()
    if not hasattr(sim, "to_snapshot_dicts"):
        raise InvariantError(f"the {allocator} simulator cannot export snapshot dicts")
    return sim
