"""One rank of a data-parallel job, made from the single-GPU trace: ``shard_trace(trace, mode, world_size)``.

Torch-free. No process group runs: the collectives are emulated as kernels (``nccl:all_gather``,
``nccl:reduce_scatter``, ``nccl:all_reduce``) that touch their buffers, and every buffer a layout adds is an
allocation with the size and lifetime its library gives it, category ``communication`` when a collective writes
into it or reads from it. The layouts (``WorkloadConfig.shard``, uvmlab.config.SHARD_MODES):

- ``ddp``: PyTorch DistributedDataParallel's gradient buckets (uvmlab.trace.shard.ddp);
- ``zero1``, ``zero2``, ``zero3``: DeepSpeed ZeRO (uvmlab.trace.shard.zero);
- ``fsdp``: PyTorch FullyShardedDataParallel, FULL_SHARD; ``fsdp2``: ``fully_shard`` (uvmlab.trace.shard.fsdp).

Rank 0 is modelled: under dim-0 chunking it holds the largest shard. The trace must carry the capture's parameter
map (uvmlab.trace.param_map). :func:`job_trace` is the one place a job's trace is made from its single-GPU capture
(``uvmlab.trace.cache.get_trace`` applies it to the cached capture, so every world size shares one capture;
``uvmlab.trace.capture.capture_trace`` to a fresh one).
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import SHARD_MODES, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.trace.schema import Trace
from uvmlab.trace.shard.ddp import ddp
from uvmlab.trace.shard.fsdp import fsdp1, fsdp2
from uvmlab.trace.shard.layout import Layout
from uvmlab.trace.shard.zero import zero3, zero12, zero_config


def job_trace(cfg: WorkloadConfig, single_gpu: Trace) -> Trace:
    """The trace of job ``cfg`` from the capture of ``cfg.single_gpu``: rank 0's trace of a data-parallel job
    (``cfg.shard``: :func:`shard_trace`), else the capture itself."""
    if not cfg.shard:
        return single_gpu
    return shard_trace(single_gpu, cfg.shard, cfg.world_size, cfg.shard_options)


def shard_trace(trace: Trace, mode: str, world_size: int, options: dict[str, Any] | None = None) -> Trace:
    """The trace of rank 0 of ``trace``'s job run under ``mode`` on ``world_size`` ranks (module docstring);
    ``options``: ``WorkloadConfig.shard_options`` (uvmlab.config.SHARD_OPTIONS)."""
    if mode not in SHARD_MODES:
        raise InputError(f"shard must be one of {', '.join(SHARD_MODES)}, not {mode!r}")
    if "shard" in trace.header:
        done = trace.header["shard"]
        raise InputError(
            f"this trace is already rank 0 of a {done.get('mode')} job on {done.get('world_size')} ranks; "
            "give the single-GPU trace"
        )
    options = dict(options or {})
    layout = Layout(trace, world_size, "modules" if mode == "zero3" else "blocks")
    if mode == "ddp":
        summary = ddp(layout, options.get("bucket_cap_mb"))
    elif mode in ("zero1", "zero2", "zero3"):
        config = zero_config(options, trace.header.get("model_hidden_size"))
        summary = zero3(layout, config) if mode == "zero3" else zero12(layout, int(mode[-1]), config)
        summary["config"] = {k: getattr(config, k) for k in config.__dataclass_fields__}
    else:
        summary = fsdp1(layout) if mode == "fsdp" else fsdp2(layout)
    summary = {"mode": mode, "world_size": world_size, **summary}
    header = dict(trace.header)
    header["shard"] = summary
    header["notes"] = [
        *header.get("notes", []),
        f"data-parallel layout {mode} on {world_size} ranks, rank 0 (uvmlab.trace.shard): collectives emulated",
    ]
    return layout.edit.build(header)
