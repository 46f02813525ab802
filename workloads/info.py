"""Descriptions of the workloads for ``uvmlab workloads`` (parameter counts from a meta build) and, with
``--all``, the names of every named model available (listed from the packages, nothing built).

Listing built-ins is torch-free and instant; counting parameters builds each model on the meta device (imports
torch and the model libraries: seconds), so it is asked for separately.
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


def named_models() -> list[dict[str, Any]]:
    """Every named model this installation offers: one dict per family (prefix, package, names, note).

    torchvision's and timm's names come from the packages themselves (``list_models``: imports them, builds
    nothing); ``hf:`` lists the built-in configs (any transformers config.json also works).
    """
    from uvmlab.errors import InputError
    from workloads.hf_models import PRESETS
    from workloads.packages import package_version
    from workloads.timm_models import list_timm_models
    from workloads.torchvision_models import list_torchvision_models

    rows = [
        {
            "prefix": "torchvision",
            "package": f"torchvision {package_version('torchvision')}",
            "names": list_torchvision_models(),
            "note": "classification models; options image_size, num_classes",
        }
    ]
    try:
        timm_names, timm_note = list_timm_models(), "options image_size (0: the model's own), num_classes"
    except InputError as exc:
        timm_names, timm_note = [], str(exc)
    rows.append(
        {"prefix": "timm", "package": f"timm {package_version('timm')}", "names": timm_names, "note": timm_note}
    )
    rows.append(
        {
            "prefix": "hf",
            "package": f"transformers {package_version('transformers')}",
            "names": list(PRESETS),
            "note": "built-in configs, or hf:PATH/config.json; options seq_len, num_layers",
        }
    )
    return rows
