"""The estimators practitioners use, run on the same jobs as uvmlab (docs/estimate.md, "Peers side by side").

- ``accelerate``: ``accelerate estimate-memory``'s own code on the job's config.json: ``AutoModel`` built under
  ``init_empty_weights`` (what ``create_empty_model`` does, without its Hub look-up), ``calculate_maximum_sizes``
  and ``estimate_training_usage``, whose largest entry is the CLI's "Training using Adam (Peak vRAM)" (4 x the
  fp32 size in float32, 2 x it in mixed precision); it knows nothing of LoRA, sharding, batch or sequence;
- ``deepspeed``: DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
  (no offload) with the model's parameter count and largest layer (DeepSpeed's ``model_to_params`` on the meta
  model): per-GPU model states only, no activations;
- ``memtracker``: PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker`` on the job's training loop
  (``workloads.train.train_step``) under ``FakeTensorMode`` on the CPU (no GPU on this machine), peak of the
  tracked tensors; it sees activations but no allocator, workspaces or CUDA's kernel choices;
- ``fsdp_memtracker``: ``FSDPMemTracker`` on the same loop with the model's blocks and root wrapped in FSDP2's
  ``fully_shard`` over a fake process group of ``world_size`` ranks (``torch.testing._internal.distributed.fake_pg``).

A peer that cannot answer a job raises InputError with the reason: PyTorch's trackers run full fine-tuning in fp32
weights only here (a fake parameter cannot be cast: peft's adapters and a bf16 load fail under FakeTensorMode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError


def accelerate_estimate(config: dict[str, Any], dtype: str) -> dict[str, float]:
    """accelerate's model size and "Training using Adam (Peak vRAM)" (bytes) of a transformers config for ``dtype``
    (``float32``, or ``bfloat16``/``float16`` for mixed precision)."""
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import CONFIG_MAPPING, AutoModel

    fields = {k: v for k, v in config.items() if k != "model_type"}
    with init_empty_weights():
        model = AutoModel.from_config(CONFIG_MAPPING[config["model_type"]].from_dict(fields))
    total, largest = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total, dtype)
    return {"model_bytes": float(total), "largest_layer_bytes": float(largest[0]),
            "training_bytes": float(max(usage.values()))}  # fmt: skip


def deepspeed_estimate(total_params: int, largest_layer_params: int, stage: int, world_size: int) -> float:
    """DeepSpeed's per-GPU model-state estimate (bytes) of ZeRO ``stage`` (2 or 3) without offload."""
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _cpu, gpu, _largest = estimate_zero3_model_states_mem_needs(
            total_params, largest_layer_params, num_gpus_per_node=world_size, num_nodes=1, cpu_offload=False,
            cpu_offload_params=False, zero_init=1,
        )  # fmt: skip
        return float(gpu)
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=world_size, num_nodes=1,
                                                      cpu_offload=False)  # fmt: skip
    return float(gpu)


def deepspeed_params(cfg: WorkloadConfig) -> tuple[int, int]:
    """(total parameters, largest layer's) of ``cfg``'s model as DeepSpeed's ``model_to_params`` (stage3.py) counts
    them: the largest layer is the most parameters one module holds directly. DeepSpeed removes shared parameters
    by ``data_ptr()``, which is 0 for every tensor on meta: here ``model.parameters()`` removes them by identity."""
    from workloads.registry import load_workload

    model = load_workload(cfg.workload).build(replace(cfg, lora_rank=0, qlora=False, lora_targets=()), "meta").model
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total), int(largest)


@contextlib.contextmanager
def _fake_group(world_size: int) -> Iterator[Any]:
    """A fake process group of ``world_size`` ranks (rank 0) and its CPU device mesh, torn down after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def memtracker_peak(cfg: WorkloadConfig, world_size: int | None = None) -> float:
    """Peak bytes of PyTorch's MemTracker (``world_size`` None) or FSDPMemTracker (FSDP2 over ``world_size``
    ranks) on ``cfg``'s training loop under FakeTensorMode on the CPU (module docstring)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from workloads.checkpointing import apply_checkpointing, repeated_blocks
    from workloads.registry import load_workload
    from workloads.train import make_optimizer, train_step

    if cfg.lora_rank or cfg.weights_dtype != "fp32":
        raise InputError(
            "PyTorch's trackers cannot run this job here: under FakeTensorMode a fake parameter cannot be cast or "
            "moved (module._apply swaps tensors and FakeTensorMode keeps a weakref to each), which peft's adapters "
            "and a bf16 load need"
        )
    spec = load_workload(cfg.workload)
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(_fake_group(world_size)) if world_size else None
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        workload = spec.build(cfg.single_gpu, "cpu")
        if mesh is not None:
            from torch.distributed.fsdp import fully_shard

            for block in repeated_blocks(workload.model):
                fully_shard(block, mesh=mesh)
            fully_shard(workload.model, mesh=mesh)
        if cfg.checkpoint:
            apply_checkpointing(workload, cfg.checkpoint)
        optimizer = make_optimizer(workload.model, cfg)
        tracker = FSDPMemTracker(workload.model, optimizer) if mesh is not None else MemTracker()
        if mesh is None:
            tracker.track_external(workload.model, optimizer)
        with tracker:
            for it in range(cfg.iterations):
                train_step(workload, optimizer, cfg, iteration=it)
                tracker.reset_mod_stats()
        snapshot = tracker.get_tracker_snapshot("peak")
    return float(max(stats["Total"] for dev, stats in snapshot.items() if dev != torch.device("meta")))
