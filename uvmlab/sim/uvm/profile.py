"""Cost profiles per GPU: calibrated ``CostParams`` shipped as data, and the rule that picks one for a GPU.

A profile is a parameter file (``uvmlab.sim.uvm.timing.CostParams.from_file`` format) in ``uvmlab/sim/uvm/profiles/``
whose JSON also names what it was fitted on (``fitted_on``), what it was validated on (``validated_on``) and the
GPU / driver / link it describes. ``uvmlab calibrate`` (``uvmlab.measure.profile_fit``) writes them.

Rule for a GPU without its own profile (docs/uvm-sim.md "Cost profiles"): take the profile of the same GPU name;
else a profile whose ``link`` (PCIe generation) matches, else any shipped profile (the fault-path constants
describe the driver generation, which is what the data can say), in both cases with ``link_bytes_per_s`` scaled by
the ratio of the two GPUs' ``link_bytes_per_s`` (gpus.py); with no profile shipped, the ``CostParams`` defaults.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.sim.uvm.timing import CostParams

PROFILE_DIR = Path(str(resources.files("uvmlab.sim.uvm.profiles")))


def profile_docs() -> dict[str, dict[str, Any]]:
    """Every shipped profile's JSON document, by GPU name."""
    out = {}
    for p in sorted(PROFILE_DIR.glob("*.json")):
        doc = json.loads(p.read_text())
        out[doc["gpu"]] = doc | {"path": str(p)}
    return out


def load_profile(gpu_name: str) -> CostParams:
    """The shipped profile of ``gpu_name`` (KeyError if none)."""
    doc = profile_docs()[gpu_name]
    return CostParams.from_file(doc["path"])


def pick_profile(gpu: GpuSpec) -> tuple[CostParams, str]:
    """(costs, why) for ``gpu`` by the module's rule."""
    docs = profile_docs()
    base_name = gpu.name.split(" (")[0]
    if base_name in docs:
        return load_profile(base_name), f"profile {base_name} ({docs[base_name]['path']})"
    same_link = [n for n in docs if n in GPUS and GPUS[n].link == gpu.link]
    others = [n for n in docs if n in GPUS]
    for name in same_link or others:
        spec = GPUS[name]
        c = load_profile(name)
        if c.link_bytes_per_s:
            c = replace(c, link_bytes_per_s=c.link_bytes_per_s * gpu.link_bytes_per_s / spec.link_bytes_per_s)
        how = "same link" if same_link else "nearest: no profile with this link"
        return c, f"profile {name} ({how}; link bandwidth scaled by {gpu.link} / {spec.link} from gpus.py)"
    return CostParams(), "defaults (uvmlab.sim.uvm.timing.CostParams): no profile shipped"
