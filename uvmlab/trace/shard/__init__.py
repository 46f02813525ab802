"""One rank of a data-parallel job, made from the single-GPU trace: ``shard_trace(trace, mode, world_size)``.

Torch-free. No process group runs: the collectives are emulated as kernels (``nccl:all_gather``,
``nccl:reduce_scatter``, ``nccl:all_reduce``) that touch their buffers, and every buffer a layout adds is an
allocation with the size and lifetime its library gives it, category ``communication`` when a collective writes
into it or reads from it. The layouts (``WorkloadConfig.shard``, uvmlab.config.SHARD_MODES):

- ``ddp``: PyTorch DistributedDataParallel's gradient buckets (uvmlab.trace.shard.ddp);
- ``zero1``, ``zero2``, ``zero3``: DeepSpeed ZeRO (uvmlab.trace.shard.zero);
- ``fsdp``: PyTorch FullyShardedDataParallel, FULL_SHARD; ``fsdp2``: ``fully_shard`` (uvmlab.trace.shard.fsdp).

Rank 0 is modelled: under dim-0 chunking it holds the largest shard. The trace must carry the capture's parameter
map (uvmlab.trace.param_map). ``uvmlab.trace.cache.get_trace`` applies this to the cached single-GPU capture, so every
world size shares one capture.
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import SHARD_MODES
from uvmlab.errors import InputError
from uvmlab.trace.schema import Trace
from uvmlab.trace.shard.ddp import ddp
from uvmlab.trace.shard.fsdp import fsdp1, fsdp2
from uvmlab.trace.shard.layout import Layout
from uvmlab.trace.shard.zero import zero3, zero12


def shard_trace(trace: Trace, mode: str, world_size: int) -> Trace:
    """The trace of rank 0 of ``trace``'s job run under ``mode`` on ``world_size`` ranks (module docstring)."""
    if mode not in SHARD_MODES:
        raise InputError(f"shard must be one of {', '.join(SHARD_MODES)}, not {mode!r}")
    layout = Layout(trace, world_size, "modules" if mode == "zero3" else "blocks")
    apply = {
        "ddp": ddp,
        "zero1": lambda lay: zero12(lay, 1),
        "zero2": lambda lay: zero12(lay, 2),
        "zero3": zero3,
        "fsdp": fsdp1,
        "fsdp2": fsdp2,
    }[mode]
    summary: dict[str, Any] = {"mode": mode, "world_size": world_size, **apply(layout)}
    header = dict(trace.header)
    header["shard"] = summary
    header["notes"] = [
        *header.get("notes", []),
        f"data-parallel layout {mode} on {world_size} ranks, rank 0 (uvmlab.trace.shard): collectives emulated",
    ]
    return layout.edit.build(header)
