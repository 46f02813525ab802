"""GPU mode: plan a run (pure, ``uvmlab.measure.gpu.plan``), execute it (thin), collect the run directory.

``execute_step`` runs one step (an argv list, never through a shell); ``run_gpu(cfg, opts, rundir)`` executes a
plan on this machine's GPU and writes the same run directory as simulation mode (``uvmlab.measure.gpu.collect``);
``dry_run`` prints the plan and runs nothing (it works without a GPU). The planning names (``GpuRunOptions``,
``Step``, ``Plan``, ``plan_run``, ``format_plan``, ``build_alloc_conf``) are re-exported here: this module is the
contract other parts import (docs/contracts.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from uvmlab.config import RunConfig
from uvmlab.errors import UnavailableError, UvmlabError
from uvmlab.measure.gpu.detect import gpu_status
from uvmlab.measure.gpu.plan import (
    ALLOC_LOG,
    BALLOON_CLAIM,
    FOOTPRINT_CHOICES,
    NSYS_PROFILE_FLAGS,
    REQUIRED_ALLOC_CONF,
    GpuRunOptions,
    Plan,
    Step,
    build_alloc_conf,
    format_plan,
    host_memory_bytes,
    plan_run,
    step_environment,
)

__all__ = [
    "ALLOC_LOG",
    "FOOTPRINT_CHOICES",
    "NSYS_PROFILE_FLAGS",
    "REQUIRED_ALLOC_CONF",
    "GpuRunOptions",
    "Plan",
    "Step",
    "build_alloc_conf",
    "dry_run",
    "execute_step",
    "format_plan",
    "host_memory_bytes",
    "plan_run",
    "run_gpu",
    "step_environment",
]


TIMED_OUT = 124
"""Exit code of a step killed at its time cap (the convention of coreutils ``timeout``)."""
KILL_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL to a step's process group at its cap."""


def execute_step(step: Step, log_dir: Path, timeout_s: float | None = None) -> int:
    """Run one step (argv list, no shell) with its variables on top of this environment (minus the inherited
    variables that would change the experiment: ``step_environment``); stdout/stderr go to
    ``log_dir/<step>.out`` / ``.err``. Returns the exit code; a missing program is an UnavailableError.

    The step runs in a process group of its own; at ``timeout_s`` the whole group (the step and every process it
    started, e.g. ``uvmlab run``'s workers) gets SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`, and the code is
    :data:`TIMED_OUT`. An exception here (Ctrl-C) ends the group too before it propagates."""
    import signal

    log_dir.mkdir(parents=True, exist_ok=True)
    env = step_environment(step, os.environ)
    with open(log_dir / f"{step.name}.out", "wb") as out, open(log_dir / f"{step.name}.err", "wb") as err:
        try:
            proc = subprocess.Popen(
                list(step.argv), env=env, cwd=step.cwd, stdout=out, stderr=err, start_new_session=True
            )
        except FileNotFoundError:
            raise UnavailableError(f"step {step.name}: {step.argv[0]} is not installed or not on PATH") from None

        def kill(sig: int) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                kill(signal.SIGKILL)
                proc.wait()
            err.write(f"\nuvmlab: step {step.name} was stopped at its time cap of {timeout_s:g} s\n".encode())
            return TIMED_OUT
        except BaseException:
            kill(signal.SIGKILL)
            proc.wait()
            raise


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_gpu(cfg: RunConfig, opts: GpuRunOptions, rundir: Any) -> dict[str, Any]:
    """Run ``cfg`` on this machine's GPU into ``rundir`` (a RunDir) and return result.json's content.

    Raises UnavailableError (one sentence) without a GPU, without g++ for the shim, or without nsys when asked.
    """
    from uvmlab.measure.gpu import collect
    from uvmlab.measure.gpu.shim import build_shim, managed_footprint_bytes, read_alloc_log

    if opts.dry_run:
        return dry_run(cfg, opts, Path(rundir.path))
    status = gpu_status().require()
    library = str(build_shim())
    opts = replace(opts, shim_library=library)
    path = Path(rundir.path)
    plan = plan_run(cfg, opts, path.resolve(), status=status, standin=False)
    if opts.nsys and plan.steps and not shutil.which(opts.nsys_path):
        raise UnavailableError(f"--nsys needs Nsight Systems: {opts.nsys_path} is not on PATH")
    rundir.logs.mkdir(parents=True, exist_ok=True)
    rundir.write_json(rundir.config_json, {**cfg.to_dict(), "gpu_options": _opts_dict(opts)})
    for pattern in ("*.alloc.bin", "*.balloon.claim"):  # an earlier attempt's logs (logs/ survives a take-over)
        for old in rundir.logs.glob(pattern):
            if rundir.owns(old):
                old.unlink()
    for step in plan.steps:  # with --footprint measure: only the calibrate step (standin=False)
        _run_checked(step, rundir)
    if plan.needs_measurement:
        log = read_alloc_log(rundir.logs / ALLOC_LOG.format(role="calibrate"))
        measured = managed_footprint_bytes(log)
        if measured <= 0:
            raise UvmlabError("the calibration run allocated no managed memory: was the shim preloaded?")
        plan = plan_run(cfg, opts, path.resolve(), status=status, measured_footprint_bytes=measured)
        for step in plan.steps:
            _run_checked(step, rundir)
    res = collect.collect_run(cfg, opts, plan, rundir, status)
    check_effective_factor(res, opts.strict_factor)
    return res


def check_effective_factor(res: dict[str, Any], strict: bool) -> None:
    """Say loudly (stderr) when the measured factor is off by more than the tolerance, or was not measured;
    with ``strict`` a factor off by more than the tolerance is an error (result.json, with both factors, is
    already written)."""
    from uvmlab.console import err

    eff = (res.get("gpu_run") or {}).get("effective") or {}
    message = eff.get("message")
    if message:
        err.print(f"uvmlab: {message}", markup=False)
    if strict and eff.get("ok") is False:
        raise UvmlabError(f"--strict-factor: {message}")


def dry_run(cfg: RunConfig, opts: GpuRunOptions, rundir: Path) -> dict[str, Any]:
    """The plan as a dict (``plan`` holds the printable text); works without a GPU (it assumes ``--gpu`` and says
    so); nothing runs or is written."""
    status = gpu_status()
    plan = plan_run(cfg, opts, rundir.resolve(), status=status)
    text = format_plan(plan)
    return {
        "mode": "gpu",
        "dry_run": True,
        "gpu": plan.gpu_name,
        "gpu_source": plan.gpu_source,
        "footprint_bytes": None if plan.balloon is None else plan.balloon.footprint_bytes,
        "available_bytes": None if plan.balloon is None else plan.balloon.available_bytes,
        "balloon": None if plan.balloon is None else plan.balloon.to_dict(),
        "steps": [{"name": s.name, "argv": list(s.argv), "env": dict(s.env), "cwd": s.cwd} for s in plan.steps],
        "plan": text,
    }


STEP_LOGS = (
    "{step}.out",
    "{step}.err",
    ALLOC_LOG,
    BALLOON_CLAIM,
    "{step}.worker.json",
    "{step}.samples.parquet",
    "{step}.cudnn.log",
)
"""What a step (its name is the worker's role) writes under RUNDIR/logs (uvmlab.measure.gpu.plan,
uvmlab.measure.gpu.worker); the
nsys steps also write ``profile.nsys-rep`` and ``profile.sqlite``."""


def _run_checked(step: Step, rundir: Any) -> int:
    """Run ``step`` after recording in the run's manifest the log files it may write (so --force and a take-over
    after a kill remove them by name)."""
    logs = rundir.logs
    for pattern in STEP_LOGS:
        rundir.record(logs / pattern.format(step=step.name, role=step.name))
    if step.name in ("run", "export"):
        for name in ("profile.nsys-rep", "profile.sqlite"):
            rundir.record(logs / name)
    rc = execute_step(step, logs)
    if rc != 0:
        raise UvmlabError(
            f"step {step.name} exited with code {rc}: {_tail(logs / f'{step.name}.err')} (see {logs}/{step.name}.err)"
        )
    return rc


def _opts_dict(opts: GpuRunOptions) -> dict[str, Any]:
    return {
        "footprint": opts.footprint,
        "baseline": opts.baseline,
        "nsys": opts.nsys,
        "alloc_conf": opts.alloc_conf,
        "advise": list(opts.advise),
        "prefetch": opts.prefetch,
        "reserve_bytes": opts.reserve_bytes,
        "calibration_iterations": opts.calibration_iterations,
        "shim_library": opts.shim_library,
        "strict_factor": opts.strict_factor,
        "same_workspace_limit": opts.same_workspace_limit,
    }
