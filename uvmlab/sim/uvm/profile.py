"""Cost profiles per GPU: calibrated ``CostParams`` shipped as data, and the rule that picks one for a run.

A profile is a parameter file (``uvmlab.sim.uvm.timing.CostParams.from_file`` format) in ``uvmlab/sim/uvm/profiles/``
whose JSON also names what it was fitted on (``fitted_on``), what it was validated on (``validated_on``) and the
GPU / driver / link it describes. ``uvmlab calibrate`` (``uvmlab.measure.profile_fit``) and
``uvmlab.measure.generation_fit`` write them.

The rule (docs/uvm-sim.md "Cost profiles and driver generations"), for a GPU spec with its driver version:

1. the fault-path constants (``generations.FAULT_PATH_FIELDS``) come from the profile of the driver's generation
   (``uvmlab.sim.uvm.generations``): a run under driver 460 gets the closed generation's, under 535 or 575 the open
   one's, whatever the GPU;
2. the GPU's own quantities (host link rate, kernel efficiencies) come from the GPU's own profile when one is
   shipped (e.g. the A100's link fitted on an nsys export), else from gpus.py (the sustained link rate) and the
   ``CostParams`` defaults;
3. every link rate is capped at the GPU's link peak (``GpuSpec.link_limit_bytes_per_s``): a rate measured on
   another host never exceeds what this GPU's link can carry.

A GPU whose own profile was fitted under the run's driver generation gets that profile whole (capped).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.generations import FAULT_PATH_FIELDS, generation
from uvmlab.sim.uvm.timing import CostParams

PROFILE_DIR = Path(str(resources.files("uvmlab.sim.uvm.profiles")))
GPU_FIELDS = (
    "link_bytes_per_s",
    "remote_read_bytes_per_s",
    "remote_partial_write_ns",
    "compute_efficiency",
    "gemm_efficiency",
    "memory_efficiency",
    "index_memory_efficiency",
    "sector_memory_efficiency",
    "kernel_min_ns",
    "cta_dispatch_ns",
    "warp_trip_ns",
)
"""The CostParams fields a GPU's own profile contributes under another driver generation."""


def profile_docs() -> dict[str, dict[str, Any]]:
    """Every shipped profile's JSON document, by GPU name."""
    out = {}
    for p in sorted(PROFILE_DIR.glob("*.json")):
        doc = json.loads(p.read_text())
        out[doc["gpu"]] = doc | {"path": str(p)}
    return out


def profile_driver(doc: dict[str, Any]) -> str:
    """The driver version a profile was fitted under: ``driver_version``, else the first version in ``driver``."""
    if doc.get("driver_version"):
        return str(doc["driver_version"])
    m = re.search(r"\b(\d{3}(?:\.\d+){0,2})\b", str(doc.get("driver", "")))
    if m is None:
        raise ValueError(f"profile {doc.get('path')} names no driver version")
    return m.group(1)


def load_profile(gpu_name: str) -> CostParams:
    """The shipped profile of ``gpu_name`` (KeyError if none)."""
    doc = profile_docs()[gpu_name]
    return CostParams.from_file(doc["path"])


def cap_link(costs: CostParams, gpu: GpuSpec) -> CostParams:
    """``costs`` with every link rate at most the GPU's link peak."""
    limit = gpu.link_limit_bytes_per_s
    capped = {
        f: min(getattr(costs, f), limit)
        for f in ("link_bytes_per_s", "remote_read_bytes_per_s", "remote_write_bytes_per_s")
        if getattr(costs, f) is not None
    }
    return replace(costs, **capped)


def pick_profile(gpu: GpuSpec) -> tuple[CostParams, str]:
    """(costs, why) for ``gpu`` under its driver, by the module's rule."""
    docs = profile_docs()
    gen = generation(gpu.driver)
    base_name = gpu.catalog_name
    own = docs.get(base_name)
    if own is not None and generation(profile_driver(own)) == gen:
        return cap_link(load_profile(base_name), gpu), f"profile {base_name} ({own['path']}; driver {gpu.driver})"
    anchor = docs[gen.profile_gpu]
    fault = CostParams.from_file(anchor["path"])
    costs = replace(CostParams(), **{f: getattr(fault, f) for f in FAULT_PATH_FIELDS})
    if own is not None:
        mine = load_profile(base_name)
        costs = replace(costs, **{f: getattr(mine, f) for f in GPU_FIELDS})
        gpu_part = f"link and kernel efficiencies from profile {base_name}"
    else:
        gpu_part = f"link {gpu.link} from gpus.py, default kernel efficiencies"
    why = (
        f"fault path of driver generation {gen.name} (driver {gpu.driver}; profile {gen.profile_gpu}, "
        f"{anchor['path']}); {gpu_part}"
    )
    return cap_link(costs, gpu), why


__all__ = ["PROFILE_DIR", "cap_link", "load_profile", "pick_profile", "profile_docs", "profile_driver"]
