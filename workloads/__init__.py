"""Training workloads: the seed study's six models plus user workload files, and the one training loop.

Built-in models are made from configurations with random weights; nothing is ever downloaded (the Hugging Face
offline switches are set here, before transformers is imported). ``workloads.registry.load_workload`` resolves a
name or a file path; ``workloads.train.train_step`` is the training loop shared by trace capture and GPU runs.
"""

from __future__ import annotations

import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # e.g. the loss_type=None warning of every build

from workloads.base import Workload, WorkloadSpec  # noqa: E402

__all__ = ["Workload", "WorkloadSpec"]
