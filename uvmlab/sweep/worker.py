"""The per-configuration child: ``python -m uvmlab.sweep.worker RUNDIR`` runs one configuration in a fresh process.

It reads ``RUNDIR/config.json``, takes an exclusive lock on ``RUNDIR/.worker.lock`` (``fcntl.flock``: released by
the kernel when the process dies, even on ``kill -9``), and, if the run is not complete yet, clears what a killed
earlier attempt left behind (the files its manifest lists, but config.json and logs/) and calls
``uvmlab.run.run(cfg, out=RUNDIR, force=True)``. A run that fails with an uvmlab error (OOM, bad input, unavailable
GPU) gets a ``result.json`` with ``outcome`` "oom" or "error" and the error sentence; a crash (a bug, a signal)
leaves no result and the parent (:func:`run_one`) records it.

Exactly one result per configuration: two workers of the same run directory (e.g. an orphan of a killed sweep and
the resumed sweep) serialize on the lock, and the second one finds ``result.json`` and exits. ``result.json`` is
written last and atomically (uvmlab.files.atomic), so a partial file is never taken for a result.

``run_chunk(rundirs)`` is what one Slurm array task (submitit) executes: each configuration in its own process.

``UVMLAB_SWEEP_RUN_FN=module:function`` replaces ``uvmlab.run.run`` (same signature): tests use it to exercise
the sweep machinery with a tiny stand-in; nothing else should set it.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from uvmlab import SCHEMA_VERSION
from uvmlab.errors import InputError, OutOfMemoryError, UvmlabError
from uvmlab.files.atomic import write_failure
from uvmlab.files.rundir import RunDir
from uvmlab.stats.schema import RESULT_KEYS

LOCK_NAME = ".worker.lock"
"""The per-run worker lock (``fcntl.flock``)."""
RUN_FN_ENV = "UVMLAB_SWEEP_RUN_FN"
INTERRUPTED_CODES = (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP, 130, 143)
"""Child exits that mean "the sweep was interrupted" (no result is recorded; a resumed sweep runs it again)."""


@contextmanager
def run_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of run directory ``path`` (blocks while another worker holds it)."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_config(rundir: RunDir) -> Any:
    """The RunConfig of a run directory's config.json (written by the sweep before the run starts)."""
    from uvmlab.config import RunConfig
    from uvmlab.sweep.aggregate import unwrap_config

    data = unwrap_config(rundir.read_json(rundir.config_json))
    if not isinstance(data, dict):
        raise InputError(f"{rundir.config_json} does not hold a run configuration")
    return RunConfig.from_dict(data)


def failure_result(cfg: Any, outcome: str, error: str) -> dict[str, Any]:
    """A result.json for a run that did not finish: every RESULT_KEYS scalar, not-collected ones null."""
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(
        schema_version=SCHEMA_VERSION,
        mode=cfg.mode,
        outcome=outcome,
        error=error,
        workload=cfg.workload.workload,
        pca=cfg.pca,
        oversub=cfg.oversub,
        gpu=cfg.gpu,
        iterations=cfg.workload.iterations,
    )
    return result


def clear_partial(path: Path) -> None:
    """Remove what an interrupted attempt left: the files its manifest lists (and their atomic-write temporaries)
    but the config and the logs; anything uvmlab did not write stays (docs/safety.md)."""
    RunDir(path).clear_incomplete()


def _run_fn() -> Callable[..., Any]:
    spec = os.environ.get(RUN_FN_ENV)
    if not spec:
        from uvmlab.run import run

        return run
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _append(path: Path, text: str) -> None:
    """Append ``text`` to the log ``path``; a full disk is one sentence naming it (files.atomic.write_failure)."""
    try:
        with open(path, "a") as fh:
            fh.write(text)
    except OSError as exc:
        raise write_failure(path, exc) from None


def _log_attempt(rundir: RunDir, event: str) -> None:
    rundir.logs.mkdir(parents=True, exist_ok=True)
    _append(rundir.record(rundir.logs / "attempts.log"), f"{time.time():.6f} {os.getpid()} {event}\n")


def completed_outcome(rundir: RunDir) -> str | None:
    """The outcome of a complete run, or None if it has no usable result.json.

    An unreadable result.json cannot come from uvmlab's atomic writes; it is moved aside into logs/ (kept, not
    deleted) so the configuration counts as pending everywhere (dry run, sweep, --retry-failed, collect) and
    runs again.
    """
    if not rundir.is_complete():
        return None
    try:
        result = rundir.read_result()
    except (InputError, ValueError, TypeError):
        result = None
    if isinstance(result, dict):
        return str(result.get("outcome", "ok"))
    rundir.logs.mkdir(parents=True, exist_ok=True)
    aside = rundir.record(rundir.logs / f"result.json.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    with suppress(FileNotFoundError):
        os.replace(rundir.result_json, aside)
    print(f"uvmlab: warning: {rundir.result_json} was unreadable; moved to {aside}; the run is redone", file=sys.stderr)
    return None


def run_in_process(path: Path) -> str:
    """Run the configuration of run directory ``path`` in this process; return its outcome."""
    rundir = RunDir(path)
    cfg = read_config(rundir)
    with run_lock(path):
        done = completed_outcome(rundir)
        if done is not None:
            return done
        clear_partial(path)
        rundir.mark_owned()  # a sweep run directory is uvmlab's (older sweeps wrote no marker)
        _log_attempt(rundir, "start")
        try:
            _run_fn()(cfg, out=path, force=True)
        except OutOfMemoryError as exc:
            rundir.write_json(rundir.result_json, failure_result(cfg, "oom", str(exc)))
        except UvmlabError as exc:
            rundir.write_json(rundir.result_json, failure_result(cfg, "error", str(exc)))
        if not rundir.is_complete():
            rundir.write_json(
                rundir.result_json, failure_result(cfg, "error", "the run returned without writing result.json")
            )
        _log_attempt(rundir, "end")
        return str(rundir.read_result().get("outcome", "ok"))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"the worker process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker process was killed by signal {-code}"
    return f"the worker process exited with code {code}"


def _last_line(path: Path, offset: int) -> str:
    """The last non-empty line the child wrote to ``path`` after byte ``offset`` (this attempt only)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def run_one(path: str | os.PathLike[str], python: str | None = None, timeout_s: float | None = None) -> str:
    """Run one configuration in a fresh ``python -m uvmlab.sweep.worker`` process; return its outcome.

    The child's stdout/stderr go to ``RUNDIR/logs/worker.{stdout,stderr}`` (appended, one header per attempt).
    If the child dies without a result (crash, signal, timeout), a result.json with outcome "error" records it.
    """
    path = Path(path)
    rundir = RunDir(path)
    out_log, err_log = rundir.logs / "worker.stdout", rundir.logs / "worker.stderr"
    with run_lock(path):
        done = completed_outcome(rundir)
        if done is None:
            rundir.logs.mkdir(parents=True, exist_ok=True)
            rundir.record(out_log)
            rundir.record(err_log)
    if done is not None:
        return done
    header = f"--- attempt at {time.strftime('%Y-%m-%dT%H:%M:%S')} ---\n"
    argv = [python or sys.executable, "-m", "uvmlab.sweep.worker", str(path)]
    _append(out_log, header)
    _append(err_log, header)
    with open(out_log, "a") as out, open(err_log, "a") as err:
        offset = err.tell()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait(timeout=timeout_s)
            reason = _describe_exit(code)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code, reason = -9, f"the run exceeded its time limit of {timeout_s:g} s and was killed"
    if rundir.is_complete():
        return str(rundir.read_result().get("outcome", "ok"))
    if code in INTERRUPTED_CODES:
        return "interrupted"  # Ctrl-C / scancel / Slurm time limit of the sweep: not the run's fault; resume reruns
    detail = _last_line(err_log, offset)
    with run_lock(path):
        if not rundir.is_complete():
            cfg = read_config(rundir)
            message = f"{reason}" + (f": {detail}" if detail and code != 0 else "")
            rundir.write_json(rundir.result_json, failure_result(cfg, "error", message))
    return str(rundir.read_result().get("outcome", "error"))


def run_chunk(rundirs: list[str]) -> dict[str, str]:
    """One array task: run each configuration in its own fresh process, one after another; outcome per run."""
    return {path: run_one(path) for path in rundirs}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m uvmlab.sweep.worker RUNDIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m uvmlab.sweep.worker RUNDIR", file=sys.stderr)
        return 2
    try:
        outcome = run_in_process(Path(args[0]))
    except InputError as exc:  # an unreadable config.json: the parent records this sentence
        print(f"uvmlab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps({"rundir": args[0], "outcome": outcome}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
