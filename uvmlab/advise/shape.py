"""Job-shape policies that change what the device holds: activation checkpointing, CPU offload of the optimizer (its
step serial or overlapped), 8-bit optimizer state, bf16 autocast and CPU offload of the saved activations.

- ``checkpoint-activations``: the trace is captured with ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)`` around the workload's repeated blocks (``WorkloadConfig.checkpoint="auto"``,
  workloads/checkpointing.py), so the fewer saved activations and the recomputed forward kernels come from the
  trace itself; it costs one more capture, cached like every trace.
- ``offload-optimizer``: the job's own trace with its optimizer moved to the host (``uvmlab.trace.offload``):
  no optimizer state on the device, gradients DtoH and parameters HtoD each iteration, the step on the CPU;
  ``offload-optimizer-overlapped`` runs that step beside the next forward and backward.
- ``optimizer-8bit``: the trace with Adam's state quantised to 8 bits and one fused step (``uvmlab.trace.optim8bit``).
- ``bf16-autocast``: the trace captured with ``WorkloadConfig.dtype="bf16"`` (autocast emulated on meta).
- ``offload-activations``: the trace with every saved tensor copied to the host and back
  (``uvmlab.trace.offload_activations``, the device side of ``torch.autograd.graph.save_on_cpu``).

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
    {
        "name": "offload-optimizer-overlapped",
        "family": "job-shape",
        "summary": "offload-optimizer with the CPU step overlapped: the step of iteration i runs on the CPU while the "
        "GPU does iteration i+1's forward and backward (ZeRO-Offload's one-step delayed parameter update); the "
        "updated parameters go up before the next gradients come down",
        "apply_how": "DeepSpeed ZeRO-Offload (overlaps the CPU step with GPU work), or a CPU thread running "
        "optimizer.step() during the next forward/backward; simulated only",
        "source": "Ren et al., ZeRO-Offload, USENIX ATC'21 (arXiv 2101.06840), one-step delayed parameter update; "
        "uvmlab/trace/offload.py (overlap)",
        "offload_optimizer": True,
        "overlap_step": True,
        "needs_code_change": (
            "import threading  # on top of offload-optimizer's lines (host copies, Adam on the CPU)\n"
            "def upload():\n"
            "    for h, p in zip(host, model.parameters()): p.data.copy_(h, non_blocking=True)\n"
            "step = None\n"
            "# each iteration, after loss.backward():\n"
            "if step: step.join(); upload()  # the previous step's parameters go up first (one step stale)\n"
            "for h, p in zip(host, model.parameters()): h.grad = p.grad.to('cpu')\n"
            "step = threading.Thread(target=optimizer.step); step.start()  # beside the next forward/backward\n"
            "model.zero_grad(set_to_none=True)"
        ),
    },
    {
        "name": "optimizer-8bit",
        "family": "job-shape",
        "summary": "Adam state in 8 bits (bitsandbytes' block-wise quantisation): a quarter of the state bytes, one "
        "fused step kernel per parameter with no temporaries",
        "apply_how": "pip install bitsandbytes; optimizer = bitsandbytes.optim.Adam8bit(model.parameters(), lr=lr)",
        "source": "Dettmers et al., 8-bit Optimizers via Block-wise Quantization, ICLR'22; bitsandbytes/optim/"
        "optimizer.py Optimizer2State.init_state (bitsandbytes-foundation/bitsandbytes @06029dd); "
        "uvmlab/trace/optim8bit.py",
        "optimizer_8bit": True,
        "needs_code_change": (
            "import bitsandbytes as bnb  # pip install bitsandbytes\n"
            "optimizer = bnb.optim.Adam8bit(model.parameters(), lr=lr)  # instead of torch.optim.Adam"
        ),
    },
    {
        "name": "bf16-autocast",
        "family": "job-shape",
        "summary": "forward and loss under torch.autocast(bfloat16): matmuls and convolutions in bf16 on tensor cores, "
        "their saved activations half the bytes; parameters, gradients and Adam state stay fp32",
        "apply_how": "wrap the forward and the loss in torch.autocast('cuda', dtype=torch.bfloat16)",
        "source": "torch.autocast (torch/amp/autocast_mode.py and the CUDA autocast op lists, pytorch/pytorch); "
        "uvmlab.trace.emulate AutocastEmulation",
        "dtype": "bf16",
        "needs_code_change": (
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)\nloss.backward()"
        ),
    },
    {
        "name": "offload-activations",
        "family": "job-shape",
        "summary": "torch.autograd.graph.save_on_cpu: every tensor saved for backward is copied to the host after "
        "its last forward use (the device copy is freed) and back before backward needs it",
        "apply_how": "wrap the forward and the loss in torch.autograd.graph.save_on_cpu(pin_memory=True); "
        "simulated only",
        "source": "torch/autograd/graph.py save_on_cpu (pytorch/pytorch, torch 2.14.1 as installed); "
        "uvmlab/trace/offload_activations.py",
        "offload_activations": True,
        "needs_code_change": (
            "with torch.autograd.graph.save_on_cpu(pin_memory=True):\n    loss = loss_fn(model(x), y)\nloss.backward()"
        ),
    },
)
"""Keyword arguments of the job-shape ``Policy`` objects (uvmlab.advise.policies.POLICIES)."""


def shape_note(policy: Any, prep: Any, given_prep: Any) -> str:
    """What a checkpointing, offload or 8-bit row changed, from the two traces (for the advisor's note column)."""
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
    if policy.optimizer_8bit:
        q = prep.trace.header.get("optimizer_8bit", {})
        parts.append(
            f"optimizer state {format_bytes(q.get('state_bytes_fp32', 0))} -> "
            f"{format_bytes(q.get('state_bytes_8bit', 0))} ({q.get('tensors_kept_fp32', 0)} small tensors kept fp32)"
        )
    if policy.offload_activations:
        o = prep.trace.header.get("offload_activations", {})
        its = max(prep.trace.n_iterations, 1)
        parts.append(
            f"{o.get('saved_tensors', 0):,} saved tensors per run ({o.get('saved_activations', 0):,} activations, the "
            f"rest parameters) copied to the host and back: {format_bytes(o.get('dtoh_bytes', 0) / its)} each way per "
            "iteration"
        )
    if policy.offload_optimizer:
        off = prep.trace.header.get("offload_optimizer", {})
        link = off.get("dtoh_bytes_per_iteration", 0) + off.get("htod_bytes_per_iteration", 0)
        step_ms = off.get("cpu_params", 0) / off.get("cpu_params_per_s", 1.0) * 1e3
        parts.append(
            f"{format_bytes(off.get('removed_optimizer_state_bytes', 0))} optimizer state off the device; "
            f"{format_bytes(link)} over the link and a {step_ms:,.0f} ms CPU step per iteration"
            + (" (overlapped with the next forward and backward)" if off.get("overlap") else "")
        )
    return "; ".join(parts)
