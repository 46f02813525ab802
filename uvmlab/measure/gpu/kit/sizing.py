"""How much managed memory a kit step may ask for, and how long it may take: sized on the machine, when it runs.

The rule of the machine this project can be lent (one H200; never more managed memory than the card has free: a
program that asks for more can hang the GPU, not only itself; .library/device README): every managed allocation
of a kit step is sized from the free memory the step MEASURES when it starts (``cudaMemGetInfo``), minus a stated
margin, and a size that comes from uvmlab's own estimator is first inflated by the estimator's worst known error:

* :func:`managed_limit` = free - max(:data:`MARGIN_FRACTION` x free, :data:`MARGIN_BYTES`): the most managed memory
  a step holds at once (10 % of the free memory, at least 2 GiB, stays for the context's growth, cuDNN/cuBLAS
  workspaces, lazily loaded modules and the driver) [I];
* an estimated footprint E counts as E / (1 - :data:`WORST_UNDERESTIMATE`): the worst under-prediction of uvmlab's
  memory estimator on held-out real runs is VGG16 batch 64 at -25.6 % (docs/estimate.md, "Validation: CARMA
  A100-40GB CNN runs"; docs/evaluation.md "Stack calibration": worst 25.6 %, every CARMA ImageNet row under), so a
  step sized this way stays under the limit even when the estimate is that far off.

Time: a step sized by its work (the GCN's node count) also fits its time cap (:func:`gcn_nodes_within`).
"""

from __future__ import annotations

from uvmlab.units import GiB

MARGIN_FRACTION = 0.10
"""Share of the measured free memory a step never takes [I]."""
MARGIN_BYTES = 2 * GiB
"""Smallest margin [I]: cuDNN/cuBLAS workspaces and lazily loaded modules of a PyTorch process are hundreds of MiB
(docs/estimate.md "Device peak": 93 MiB of modules, workspaces up to 430 MB in the cuDNN 7 AlexNet log)."""
WORST_UNDERESTIMATE = 0.256
"""The estimator's worst known under-prediction of a measured peak (VGG16 b64, CARMA ImageNet, docs/estimate.md)."""
GCN_EPOCH_S_PER_GB = 2.2
"""Seconds per epoch per GB of GCN footprint [I]: the RTX 5090 scaling of issue 43 (3 epochs at 0.9 x 141 GB take
about 14 minutes: 840 s / 3 / 127 GB), used only to cap the node count by a step's time cap."""


def managed_limit(free_bytes: int) -> int:
    """The most managed memory a step may hold with ``free_bytes`` measured free (module docstring); 0 when the
    margin takes it all."""
    margin = max(int(MARGIN_FRACTION * free_bytes), MARGIN_BYTES)
    return max(0, int(free_bytes) - margin)


def inflated(estimate_bytes: int) -> int:
    """An estimated footprint as the sizing rule counts it: survives the estimator's worst known error."""
    return int(estimate_bytes / (1.0 - WORST_UNDERESTIMATE)) + 1


def fits(estimate_bytes: int, free_bytes: int) -> bool:
    """An estimated footprint may be allocated as managed memory with ``free_bytes`` measured free."""
    return inflated(estimate_bytes) <= managed_limit(free_bytes)


def gcn_nodes_within(
    free_bytes: int, fraction: float, seconds: float, epochs: int, nodes_for: object, startup_s: float = 30.0
) -> tuple[int | None, dict[str, float]]:
    """The GCN node count for ``fraction`` of the measured free memory, under the managed limit after the worst
    estimator error and within ``seconds`` (``nodes_for(target_bytes)``: the largest node count whose simulated
    footprint is at most the target, uvmlab.measure.gpu.kit.plan.gcn_nodes_for). Returns (nodes or None, the
    numbers that decided it)."""
    limit = managed_limit(free_bytes)
    by_memory = min(int(fraction * free_bytes), limit)
    target = int(by_memory * (1.0 - WORST_UNDERESTIMATE))
    time_left = max(0.0, seconds - startup_s)
    by_time = int(time_left / max(epochs, 1) / GCN_EPOCH_S_PER_GB * 1e9 * (1.0 - WORST_UNDERESTIMATE))
    chosen = min(target, by_time)
    nodes = nodes_for(chosen) if chosen > 0 else None  # type: ignore[operator]
    return nodes, {
        "free_bytes": float(free_bytes),
        "managed_limit_bytes": float(limit),
        "target_bytes_by_memory": float(target),
        "target_bytes_by_time": float(by_time),
        "target_bytes": float(chosen),
    }
