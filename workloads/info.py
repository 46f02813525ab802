"""Descriptions of the built-in workloads for ``uvmlab workloads`` (parameter counts from a meta build).

Listing is torch-free and instant; counting parameters builds each model on the meta device (imports torch and
the model libraries: seconds), so it is asked for separately.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvmlab.config import WorkloadConfig
from workloads.registry import WORKLOADS


def parameter_count(name: str, cfg: WorkloadConfig | None = None) -> int:
    """Number of parameters of workload ``name`` (built on the meta device: no memory, no download)."""
    spec = WORKLOADS[name]
    wl = spec.build(cfg or WorkloadConfig(name), "meta")
    return sum(p.numel() for p in wl.model.parameters())


def describe_workloads(parameters: bool = True, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One dict per built-in workload: name, description, default batch size, parameters, options.

    ``parameters=False`` leaves ``parameters`` null and never imports torch; ``progress(name)`` is called before
    each model is built.
    """
    rows = []
    for name, spec in WORKLOADS.items():
        if parameters and progress is not None:
            progress(name)
        rows.append(
            {
                "name": name,
                "description": spec.description,
                "default_batch_size": spec.default_batch_size,
                "parameters": parameter_count(name) if parameters else None,
                "options": dict(spec.options),
            }
        )
    return rows
