"""env.json of a simulated run or an estimate: the versions of this machine and what the trace was captured with."""

from __future__ import annotations

import platform
from typing import Any

import numpy as np

from uvmlab import __version__


def env_info(trace_header: dict[str, Any] | None = None) -> dict[str, Any]:
    """env.json for a simulated run: versions of this machine, and what the trace was captured with."""
    import pandas as pd

    head = trace_header or {}
    return {
        "mode": "sim",
        "uvmlab": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "trace_torch_version": head.get("torch_version"),
        "trace_capture_device": head.get("capture_device"),
        "trace_notes": head.get("notes"),
        "PYTORCH_CUDA_ALLOC_CONF": None,
    }
