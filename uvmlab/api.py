"""The public Python API: everything the CLI does, callable from Python.

Names resolve lazily (PEP 562), so ``import uvmlab.api`` is cheap and torch is imported only by the
functions that capture traces or run on a GPU. Example::

    from uvmlab import api
    from uvmlab.config import RunConfig, WorkloadConfig

    result = api.run(RunConfig(WorkloadConfig("gpt2"), oversub=4, pca=False, mode="sim"), out="runs/gpt2-x4")
    est = api.estimate(WorkloadConfig("resnet50"), api.get_gpu("A100-80GB"))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # configs and GPUs
    "WorkloadConfig": "uvmlab.config",
    "RunConfig": "uvmlab.config",
    "get_gpu": "uvmlab.gpus",
    "RunDir": "uvmlab.rundir",
    # traces (capture needs torch)
    "capture_trace": "uvmlab.trace.capture",
    "get_trace": "uvmlab.trace.cache",
    "read_trace": "uvmlab.trace.schema",
    "write_trace": "uvmlab.trace.schema",
    "to_cuda": "uvmlab.trace.orchestrate",
    "read_snapshot": "uvmlab.trace.snapshot",
    "write_snapshot": "uvmlab.trace.snapshot",
    # allocator simulation and estimation
    "place": "uvmlab.sim.placement",
    "estimate": "uvmlab.estimate",
    "replay_snapshot": "uvmlab.replay",
    # UVM simulation and runs
    "simulate_run": "uvmlab.simulate",
    "footprint_bytes": "uvmlab.simulate",
    "run": "uvmlab.run",
    # measurement
    "open_export": "uvmlab.nsys.read",
    "summarize": "uvmlab.nsys.stats",
    "import_export": "uvmlab.nsys.measured",
    "compare_runs": "uvmlab.compare",
    "calibrate": "uvmlab.calibrate",
    # sweeps and reports
    "load_spec": "uvmlab.sweep.spec",
    "run_sweep": "uvmlab.sweep.runner",
    "collect": "uvmlab.sweep.aggregate",
    "build_report": "uvmlab.report.build",
    # evaluation, fragmentation, collocation
    "evaluate": "uvmlab.evaluate.harness",
    "characterize_source": "uvmlab.fragmentation",
    "colocate_workloads": "uvmlab.colocate",
    # fidelity scorecard
    "validate": "uvmlab.validate.scorecard",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"uvmlab.api has no {name!r}; public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
