"""A fast stand-in for ``uvmlab.run.run`` used by the sweep and report tests (via UVMLAB_SWEEP_RUN_FN).

It tests the sweep machinery (processes, resume, locking, aggregation) and the report's drawing, not the
simulator: numbers are synthetic but shaped like real run directories (uvmlab.stats.schema), and they depend on
the configuration so figures have something to show. Behaviour switches come from ``cfg.sim_options``:
``sleep_s`` (seconds to sleep, in steps, between writing tables and result.json), ``fail`` ("oom", "error",
"crash", "sigterm"), ``mode_override`` (write this result mode, e.g. "measured").
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, OutOfMemoryError
from uvmlab.files.rundir import RunDir
from uvmlab.stats.schema import FAULT_COLUMNS, KERNEL_COLUMNS, RESULT_KEYS

TESTS_DIR = Path(__file__).resolve().parent
RUN_FN = "sweep_fake_run:run"


def env_for_worker() -> dict[str, str]:
    """Environment making ``python -m uvmlab.sweep.worker`` use this module."""
    env = dict(os.environ)
    env["UVMLAB_SWEEP_RUN_FN"] = RUN_FN
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run(cfg: Any, out: Path, force: bool = False) -> dict[str, Any]:
    rundir = RunDir(out)
    rundir.prepare(force=force)
    opts = cfg.sim_options
    fail = opts.get("fail")
    if fail == "oom":
        raise OutOfMemoryError("simulated device out of memory at allocation 7 (fake)")
    if fail == "error":
        raise InputError("fake run refused this configuration")
    if fail == "crash":
        os.abort()
    if fail == "sigterm":  # what scancel / a Slurm time limit / Ctrl-C of the sweep does to the child
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    f, pca = cfg.oversub, cfg.pca
    n_iter = cfg.workload.iterations
    per_iter = 20
    base_ns = 1_000_000 * (2 if pca else 9)
    faults = int(1000 * f * (1 if pca else 2))
    kernels = []
    for it in range(n_iter):
        for k in range(per_iter):
            kid = it * per_iter + k
            kernels.append(
                {
                    "kernel_id": kid,
                    "name": f"k{k}",
                    "iteration": it,
                    "phase": "forward" if k < per_iter // 2 else "backward",
                    "start_ns": kid * 1000,
                    "end_ns": kid * 1000 + 900,
                    "duration_ns": 900,
                    "kernel_bytes": (k % 7 + 1) * 1024 * 1024,
                    "allocated_bytes": 64 * 1024 * 1024,
                    **{c: 1 for c in FAULT_COLUMNS},
                }
            )
    kdf = pd.DataFrame(kernels)[list(KERNEL_COLUMNS)]
    rundir.write_table("kernels", kdf)
    rundir.write_json(rundir.env_json, {"uvmlab_version": "test", "python": "3"})
    sleep_s = float(opts.get("sleep_s", 0))
    end = time.monotonic() + sleep_s
    while time.monotonic() < end:
        time.sleep(0.02)
    slow = 1.0 if f <= 1 else f ** (1.5 if pca else 0.7)
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    read_share = min(0.9, 0.1 * f) if f > 1 else 0.0
    result.update(
        schema_version=1,
        mode=opts.get("mode_override", "sim"),
        outcome="ok",
        workload=cfg.workload.workload,
        pca=pca,
        oversub=f,
        gpu=cfg.gpu,
        footprint_bytes=512 * 1024 * 1024,
        iterations=n_iter,
        iteration_time_ns=base_ns * slow,
        native_time_ns=base_ns,
        slowdown_vs_native=slow,
        fault_count=faults,
        read_fault_count=int(faults * read_share),
        write_fault_count=faults - int(faults * read_share),
        htod_count=faults * (3 if pca else 1),
        htod_bytes=faults * 65536,
        dtoh_count=faults,
        dtoh_bytes=faults * 65536,
    )
    verdict = "fits" if f <= 1 else "thrashing" if pca else "paging"  # uvmlab.uvm.regime's shape, made-up values
    result["regime"] = {
        "verdict": verdict,
        "thrashing_time_share": min(0.9, 0.1 * f) if verdict == "thrashing" else 0.0,
    }
    rundir.write_json(rundir.result_json, result)
    return result
