"""Slurm options of a sweep: the resources asked of Slurm (spec ``slurm:`` section) and their validation.

The spec parser (``uvmlab.sweep.spec``) locates each value in the YAML and calls :func:`check_slurm_field`;
the job-array plan that turns these options into submitit parameters is in ``uvmlab.sweep.runner``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from uvmlab.errors import InputError

SLURM_FIELDS = {
    "partition": str,
    "time_min": int,
    "gpus_per_task": int,
    "cpus_per_task": int,
    "mem_gb": (int, float),
    "configs_per_task": int,
    "array_parallelism": int,
    "account": str,
    "qos": str,
    "constraint": str,
    "exclusive": bool,
    "setup": list,
    "additional": dict,
}
"""Fields of the spec's ``slurm:`` section and the YAML types they take."""


@dataclass(frozen=True)
class SlurmOptions:
    """Resources asked of Slurm (spec ``slurm:`` section; the command line overrides)."""

    partition: str | None = None
    time_min: int = 60
    gpus_per_task: int | None = None
    """None: 1 for GPU-mode configurations, 0 for simulation-only sweeps."""
    cpus_per_task: int = 2
    mem_gb: float | None = None
    configs_per_task: int = 1
    array_parallelism: int = 64
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    setup: tuple[str, ...] = ()
    additional: dict[str, Any] = field(default_factory=dict)


def check_slurm_field(key: str, value: Any) -> Any:
    """Validate and normalize one ``slurm:`` value (``key`` in SLURM_FIELDS); raise InputError without location."""
    want = SLURM_FIELDS[key]
    if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
        raise InputError(f"has the wrong type ({value!r})")
    minimum = 0 if key == "gpus_per_task" else 1
    if want is int and value < minimum:
        raise InputError(f"must be >= {minimum}, not {value!r}")
    if key == "setup":
        if not all(isinstance(s, str) for s in value):
            raise InputError("must be a list of shell lines")
        value = tuple(value)
    return value
