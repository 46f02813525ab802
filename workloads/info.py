"""Descriptions of the built-in workloads for ``uvmlab workloads`` (parameter counts from a meta build)."""

from __future__ import annotations

from typing import Any

from uvmlab.config import WorkloadConfig
from workloads.registry import WORKLOADS


def parameter_count(name: str, cfg: WorkloadConfig | None = None) -> int:
    """Number of parameters of workload ``name`` (built on the meta device: no memory, no download)."""
    spec = WORKLOADS[name]
    wl = spec.build(cfg or WorkloadConfig(name), "meta")
    return sum(p.numel() for p in wl.model.parameters())


def describe_workloads() -> list[dict[str, Any]]:
    """One dict per built-in workload: name, description, default batch size, parameters, options."""
    return [
        {
            "name": name,
            "description": spec.description,
            "default_batch_size": spec.default_batch_size,
            "parameters": parameter_count(name),
            "options": dict(spec.options),
        }
        for name, spec in WORKLOADS.items()
    ]
