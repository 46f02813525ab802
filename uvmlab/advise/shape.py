"""Job-shape policies that change what the device holds: activation checkpointing and CPU offload of the optimizer.

- ``checkpoint-activations``: the trace is captured with ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)`` around the workload's repeated blocks (``WorkloadConfig.checkpoint="auto"``,
  workloads/checkpointing.py), so the fewer saved activations and the recomputed forward kernels come from the
  trace itself; it costs one more capture, cached like every trace.
- ``offload-optimizer``: the job's own trace with its optimizer moved to the host (``uvmlab.trace.offload``):
  no optimizer state on the device, gradients DtoH and parameters HtoD each iteration, the step on the CPU.

The policy definitions are keyword dicts (``SHAPE_POLICIES``) that ``uvmlab.advise.policies`` turns into
``Policy`` objects; the row notes the advisor prints come from :func:`shape_note`.
"""

from __future__ import annotations

from typing import Any

SHAPE_POLICIES: tuple[dict[str, Any], ...] = (
    {
        "name": "checkpoint-activations",
        "family": "job-shape",
        "summary": "activation checkpointing of each repeated block (transformer layers, ResNet bottlenecks, "
        "AlexNet's features/classifier halves): only block inputs are saved in forward, each block's forward "
        "runs again in backward",
        "apply_how": "wrap each block in torch.utils.checkpoint.checkpoint(..., use_reentrant=False) "
        "(Hugging Face: model.gradient_checkpointing_enable())",
        "source": "torch/utils/checkpoint.py _checkpoint_without_reentrant_generator (pytorch/pytorch, torch "
        "2.14.1 as installed); transformers PreTrainedModel.gradient_checkpointing_enable",
        "checkpoint": "auto",
        "needs_code_change": (
            "from torch.utils.checkpoint import checkpoint\n"
            "for block in blocks:  # e.g. model.transformer.h, the bottlenecks of resnet.layer1..4\n"
            "    f = block.forward\n"
            "    block.forward = lambda *a, f=f, **k: checkpoint(f, *a, use_reentrant=False, **k)"
        ),
    },
    {
        "name": "offload-optimizer",
        "family": "job-shape",
        "summary": "optimizer state and step on the host (the ZeRO-Offload idea): each iteration the gradients "
        "go DtoH, Adam runs on the CPU, the parameters come back HtoD (2 x parameter bytes over the link)",
        "apply_how": "an fp32 copy of the parameters with torch.optim.Adam on the CPU (or DeepSpeed "
        '"zero_optimization": {"offload_optimizer": {"device": "cpu"}}); simulated only',
        "source": "Ren et al., ZeRO-Offload, USENIX ATC'21 (arXiv 2101.06840); www.deepspeed.ai/tutorials/"
        "zero-offload; uvmlab/trace/offload.py",
        "offload_optimizer": True,
        "needs_code_change": (
            "host = [p.detach().cpu().pin_memory().requires_grad_() for p in model.parameters()]\n"
            "optimizer = torch.optim.Adam(host, lr=lr)  # state on the host\n"
            "# each step, after loss.backward():\n"
            "for h, p in zip(host, model.parameters()): h.grad = p.grad.to('cpu')\n"
            "optimizer.step()\n"
            "for h, p in zip(host, model.parameters()): p.data.copy_(h, non_blocking=True)\n"
            "model.zero_grad(set_to_none=True)"
        ),
    },
)
"""Keyword arguments of the two ``Policy`` objects (uvmlab.advise.policies.POLICIES)."""


def shape_note(policy: Any, prep: Any, given_prep: Any) -> str:
    """What a checkpointing or offload row changed, from the two traces (for the advisor's note column)."""
    from uvmlab.units import format_bytes

    parts = []
    if policy.checkpoint:
        k, g = prep.trace.kernels, given_prep.trace.kernels
        steady = 1 if (k["iteration"] >= 1).any() else 0
        bwd = k[(k["phase"] == "backward") & (k["iteration"] == steady)]
        gbwd = g[(g["phase"] == "backward") & (g["iteration"] == steady)]
        a, ga = prep.trace.allocations, given_prep.trace.allocations

        def saved(t: Any) -> int:
            return int(t.loc[(t["category"] == "activation") & (t["iteration"] == steady), "size_bytes"].sum())

        extra = bwd["flops"].sum() / max(gbwd["flops"].sum(), 1.0) - 1.0
        parts.append(
            f"{len(bwd) - len(gbwd):+,} backward kernels (recomputed forward, {extra:+.0%} backward FLOPs); "
            f"saved activations {format_bytes(saved(ga))} -> {format_bytes(saved(a))}"
        )
    if policy.offload_optimizer:
        off = prep.trace.header.get("offload_optimizer", {})
        link = off.get("dtoh_bytes_per_iteration", 0) + off.get("htod_bytes_per_iteration", 0)
        step_ms = off.get("cpu_params", 0) / off.get("cpu_params_per_s", 1.0) * 1e3
        parts.append(
            f"{format_bytes(off.get('removed_optimizer_state_bytes', 0))} optimizer state off the device; "
            f"{format_bytes(link)} over the link and a {step_ms:,.0f} ms CPU step per iteration"
        )
    return "; ".join(parts)
