"""Run a sweep: one run directory per configuration, each run in a fresh process, resumable at any moment.

Layout of a sweep folder ``DIR``::

    DIR/spec.yaml            copy of the spec as last run
    DIR/sweep.json           name, source, configuration hashes, last summary
    DIR/runs/<name>/         one RunDir per configuration (config.json first, result.json last), named
                             <workload>-x<F>-pca<on|off>-<short config hash> (run_dir_name)
    DIR/results.parquet      one row per complete run (uvmlab.sweep.aggregate), rebuilt after every sweep
    DIR/submitit/            submitit job folders and per-task logs (executors slurm and submitit-local)

Executors:

``local``           a pool of ``--jobs`` threads, each starting ``python -m uvmlab.sweep.worker RUNDIR`` children;
                    simulation runs go in parallel, GPU/auto runs one at a time (each needs the GPU alone).
``slurm``           submitit ``AutoExecutor(cluster="slurm")``: one job array; each array task runs a chunk of
                    ``configs_per_task`` configurations, each still in its own fresh process (``worker.run_chunk``).
``submitit-local``  the same code path through submitit's LocalExecutor (what the tests exercise).

Resume: a configuration whose ``result.json`` exists is skipped (``retry_failed`` re-runs outcome "error").
The worker's per-run lock makes a resumed sweep wait for an orphan of a killed one instead of running it twice.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError, UnavailableError
from uvmlab.files.inputs import read_input_bytes, short
from uvmlab.files.outputs import same_path
from uvmlab.files.rundir import RunDir
from uvmlab.sweep.folder import SweepFolder, legacy_sweep_json
from uvmlab.sweep.slurm import SlurmOptions
from uvmlab.sweep.spec import MAX_SPEC_BYTES, SweepSpec
from uvmlab.sweep.worker import run_chunk, run_lock, run_one

EXECUTORS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class Entry:
    """One configuration of a sweep and where it runs."""

    run_id: str
    config: Any  # RunConfig
    path: Path
    status: str
    """'done' (result.json, outcome ok/oom), 'failed' (outcome error), 'pending'."""


@dataclass
class SweepSummary:
    """What a sweep did: counts by outcome, wall time, where the results are."""

    out: Path
    total: int
    skipped: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)
    wall_time_s: float = 0.0
    results_path: Path | None = None
    errors: list[str] = field(default_factory=list)
    failed_earlier: int = 0
    """Configurations skipped because an earlier run of the sweep finished them with outcome "error" (not retried
    without ``--retry-failed``): the sweep still has failures, so the command exits 1."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--format json`` and sweep.json)."""
        return {
            "out": str(self.out),
            "total": self.total,
            "skipped": self.skipped,
            "failed_earlier": self.failed_earlier,
            "ran": self.ran,
            "outcomes": dict(self.outcomes),
            "wall_time_s": round(self.wall_time_s, 3),
            "results": str(self.results_path) if self.results_path else None,
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class SubmitPlan:
    """A pure, inspectable submitit/Slurm plan: executor parameters and the chunks of run directories."""

    cluster: str
    folder: Path
    parameters: dict[str, Any]
    chunks: tuple[tuple[str, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--dry-run --format json``)."""
        return {
            "cluster": self.cluster,
            "folder": str(self.folder),
            "parameters": self.parameters,
            "array_size": len(self.chunks),
            "chunks": [list(c) for c in self.chunks],
        }


def _status(rundir: RunDir) -> str:
    if not rundir.is_complete():
        return "pending"
    try:
        result = rundir.read_result()
    except (InputError, ValueError, TypeError):
        return "pending"  # an unreadable result.json cannot come from our atomic writes: the run is redone
    return "failed" if result.get("outcome") == "error" else "done"


def run_dir_name(cfg: Any) -> str:
    """Readable run directory name: ``<workload>-x<F>-pca<on|off>[-<policy>]-<8 hex digits of config_hash()>``.

    The same name as ``uvmlab run``'s default directory (uvmlab.run.default_run_dir), e.g. gpt2-x4-pcaoff-1a2b3c4d.
    """
    from uvmlab.run import default_run_dir

    return default_run_dir(cfg, root="").name


def plan_entries(spec: SweepSpec, out: str | os.PathLike[str]) -> list[Entry]:
    """The configurations of ``spec`` with their run directories under ``out/runs`` and current status.

    A sweep folder written before readable names (``runs/<12-hex config_hash>``) keeps its folders: resume works.
    """
    runs = Path(out).resolve() / "runs"
    entries = []
    for cfg in spec.configs:
        legacy = runs / cfg.config_hash()
        path = legacy if legacy.is_dir() else runs / run_dir_name(cfg)
        entries.append(Entry(path.name, cfg, path, _status(RunDir(path))))
    return entries


def spec_hash(spec: SweepSpec) -> str:
    """What a sweep folder belongs to: the SHA-256 of its configurations' hashes, sorted (the spec's name, comments
    and order do not count; another grid, default, exclusion or override does)."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(c.config_hash() for c in spec.configs)).encode()).hexdigest()


def _check_same_spec(out: Path, spec: SweepSpec, entries: list[Entry], digest: str) -> None:
    """Refuse a sweep folder that holds the sweep of another spec (by :func:`spec_hash`; a sweep.json of an uvmlab
    before the hash: by its run ids)."""
    doc = legacy_sweep_json(out)
    if doc is None:
        return
    known = doc.get("spec_hash")
    same = known == digest if known is not None else set(doc["run_ids"]) == {e.run_id for e in entries}
    if not same:
        n = len(doc["run_ids"])
        raise InputError(
            f"{out} holds the sweep of another spec ({short(doc.get('name'))}, {n:,} configurations); a sweep folder "
            "belongs to one spec: give another -o (resume with the same spec and overrides)"
        )


def prepare(spec: SweepSpec, out: str | os.PathLike[str]) -> list[Entry]:
    """Create (or resume) the sweep folder and every run's config.json (atomic; an existing one is left alone).

    Refuses (InputError): a path that is a file or a link; a folder holding uvmlab's sweep names that uvmlab did
    not write; the folder of another spec's sweep (:func:`spec_hash`); a spec.yaml there that is not the copy of
    this spec uvmlab wrote.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"sweep output {out} exists and is not a folder; choose another -o")
    source = Path(spec.source) if spec.source and Path(spec.source).is_file() else None
    data = read_input_bytes(source, MAX_SPEC_BYTES, "a sweep spec (a YAML file)") if source is not None else None
    folder = SweepFolder(out)
    folder.adopt_legacy(data)
    entries = plan_entries(spec, out)
    digest = spec_hash(spec)
    folder.prepare()
    try:
        _check_same_spec(out, spec, entries, digest)
        for e in entries:  # a run's manifest that is not uvmlab's is refused before anything runs (or is removed)
            if e.path.is_dir() and e.status == "pending":  # an unreadable result.json is moved aside by the worker
                RunDir(e.path).verify(skip=(RunDir.complete_name,))
        _write_sweep_json(out, spec, entries, None, digest)  # first: from here on, a kill leaves a resumable folder
        copy = out / "spec.yaml"
        ours = copy.is_file() and folder.owns(copy) and data is not None and copy.read_bytes() == data
        if data is not None and not same_path(source, copy) and not ours:  # `sweep S/spec.yaml -o S`: kept
            folder.write_file_with(copy, lambda tmp: tmp.write_bytes(data))  # refuses a spec.yaml of yours
        for e in entries:
            rundir = RunDir(e.path)
            if not rundir.config_json.is_file():
                rundir.path.mkdir(parents=True, exist_ok=True)
                rundir.mark_owned()  # the sweep created this run directory: its worker may write into it
                rundir.write_json(rundir.config_json, e.config.to_dict())  # recorded in its manifest
        _write_sweep_json(out, spec, entries, None, digest)
    finally:
        folder.release()
    return entries


def _write_sweep_json(
    out: Path, spec: SweepSpec, entries: list[Entry], summary: SweepSummary | None, digest: str | None = None
) -> None:
    previous = legacy_sweep_json(out) or {}
    ids = list(dict.fromkeys([*previous.get("run_ids", []), *(e.run_id for e in entries)]))
    data = {
        "name": spec.name,
        "source": spec.source,
        "description": spec.description,
        "overrides": list(spec.overrides),
        "spec_hash": digest or previous.get("spec_hash") or spec_hash(spec),
        "configurations": len(entries),
        "run_ids": ids,
        "last_summary": summary.to_dict() if summary else previous.get("last_summary"),
    }
    SweepFolder(out).write_json_file(out / "sweep.json", data)


def submit_plan(
    entries: list[Entry],
    out: Path,
    options: SlurmOptions,
    cluster: str = "slurm",
    name: str = "uvmlab-sweep",
) -> SubmitPlan:
    """Chunk the pending runs and derive submitit parameters (pure: nothing is submitted)."""
    pending = [e for e in entries if e.status == "pending"]
    per = max(1, options.configs_per_task)
    chunks = tuple(tuple(str(e.path) for e in pending[i : i + per]) for i in range(0, len(pending), per))
    needs_gpu = any(e.config.mode != "sim" for e in pending)
    gpus = options.gpus_per_task if options.gpus_per_task is not None else (1 if needs_gpu else 0)
    params: dict[str, Any] = {
        "name": name,
        "timeout_min": options.time_min * per,
        "gpus_per_node": gpus,
        "cpus_per_task": options.cpus_per_task,
        "tasks_per_node": 1,
        "nodes": 1,
    }
    if options.mem_gb is not None:
        params["mem_gb"] = options.mem_gb
    if cluster == "slurm":
        params["slurm_array_parallelism"] = options.array_parallelism
        for key in ("partition", "account", "qos", "constraint", "exclusive"):
            value = getattr(options, key)
            if value is not None:
                params[f"slurm_{key}"] = value
        if options.setup:
            params["slurm_setup"] = list(options.setup)
        if options.additional:
            params["slurm_additional_parameters"] = dict(options.additional)
    return SubmitPlan(cluster=cluster, folder=out / "submitit", parameters=params, chunks=chunks)


def executor_plan(
    spec: SweepSpec, entries: list[Entry], out: str | os.PathLike[str], executor: str, slurm: SlurmOptions | None = None
) -> SubmitPlan | None:
    """The submitit plan ``executor`` would run for the pending ``entries`` (None for the local executor)."""
    if executor == "local":
        return None
    cluster = "slurm" if executor == "slurm" else "local"
    return submit_plan(entries, Path(out).resolve(), slurm or spec.slurm, cluster=cluster, name=f"uvmlab-{spec.name}")


def render_sbatch(plan: SubmitPlan) -> str:
    """The sbatch script submitit would write for ``plan`` (for --dry-run; uses submitit's own renderer)."""
    from submitit.slurm import slurm

    p = plan.parameters
    kwargs: dict[str, Any] = {
        "job_name": p["name"],
        "time": int(p["timeout_min"]),
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": p["cpus_per_task"],
        "gpus_per_node": p["gpus_per_node"] or None,
        "array_parallelism": p.get("slurm_array_parallelism", 256),
        "map_count": len(plan.chunks),
    }
    if "mem_gb" in p:
        kwargs["mem"] = f"{p['mem_gb']}GB"
    for key in ("partition", "account", "qos", "constraint", "exclusive", "setup"):
        if f"slurm_{key}" in p:
            kwargs[key] = p[f"slurm_{key}"]
    if "slurm_additional_parameters" in p:
        kwargs["additional_parameters"] = p["slurm_additional_parameters"]
    folder = plan.folder / "%j"
    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return str(slurm._make_sbatch_string(command=command, folder=folder, **kwargs))


ProgressFn = Callable[[str, str], None]


class _Progress:
    """Progress on stderr: bar, done / total, ok / oom / error counts, elapsed and estimated time remaining (on a
    terminal; in a log, a line every tenth of the configurations or 30 s: uvmlab.console.LogProgress)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.counts = {"ok": 0, "oom": 0, "error": 0}
        self._progress: Any = None
        self._task: Any = None
        if enabled and total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            from uvmlab.console import progress_bar

            self._progress = progress_bar(  # a bar on a terminal, a line now and then in a log
                TextColumn("sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TextColumn("remaining"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._progress.add_task("sweep", total=total, status=self.status())

    @property
    def done(self) -> int:
        """Configurations finished (any outcome)."""
        return sum(self.counts.values())

    def status(self) -> str:
        """'ok N  oom N  error N' (what the bar shows next to done / total)."""
        return "  ".join(f"{k} {v}" for k, v in self.counts.items())

    def __enter__(self) -> _Progress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, outcome: str) -> None:
        """Count one finished configuration by outcome (ok, oom, error; anything else counts as error)."""
        if outcome == "interrupted":
            return  # not a result: stays remaining (a resumed sweep runs it)
        key = outcome if outcome in self.counts else "error"
        self.counts[key] += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, status=self.status())


def _outcome(rundir: RunDir) -> str:
    """The outcome recorded in a complete run's result.json ("error" if unreadable)."""
    try:
        return str(rundir.read_result().get("outcome", "ok"))
    except InputError:
        return "error"


def _run_local(pending: list[Entry], jobs: int, progress: _Progress, outcomes: dict[str, int]) -> None:
    parallel = [e for e in pending if e.config.mode == "sim"]
    exclusive = [e for e in pending if e.config.mode != "sim"]
    for group, width in ((parallel, max(1, jobs)), (exclusive, 1)):
        if not group:
            continue
        pool = ThreadPoolExecutor(max_workers=width)
        try:
            futures: dict[Future[str], Entry] = {pool.submit(run_one, e.path): e for e in group}
            remaining = set(futures)
            while remaining:
                finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                for fut in finished:
                    outcome = fut.result()
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                    progress.update(outcome)
        finally:
            # on Ctrl-C: start nothing new; running children got the SIGINT too and record no result
            pool.shutdown(wait=True, cancel_futures=True)


def check_executor(executor: str) -> None:
    """Raise UnavailableError if ``executor`` cannot run here (checked before anything is written)."""
    if executor == "local":
        return
    try:
        import submitit  # noqa: F401
    except ModuleNotFoundError:
        raise UnavailableError(
            f"the {executor} executor needs submitit; install it with: pip install 'uvmlab[slurm]'"
        ) from None
    if executor == "slurm" and shutil.which("sbatch") is None:
        raise UnavailableError(
            "the slurm executor needs Slurm's sbatch on PATH; run on a login node, or use --executor local "
            "(--dry-run shows the job-array plan without Slurm)"
        )


def _run_submitit(plan: SubmitPlan, pending: list[Entry], progress: _Progress, summary: SweepSummary) -> None:
    import submitit

    executor = submitit.AutoExecutor(folder=plan.folder, cluster=plan.cluster)
    executor.update_parameters(**plan.parameters)
    jobs = executor.map_array(run_chunk, [list(c) for c in plan.chunks])
    seen: set[str] = set()
    by_path = {str(e.path): e for e in pending}
    while True:
        for path, e in by_path.items():
            if path not in seen and RunDir(e.path).is_complete():
                seen.add(path)
                progress.update(_outcome(RunDir(e.path)))
        if all(job.done() for job in jobs):
            break
        time.sleep(0.5)
    for job in jobs:
        exc = job.exception()
        if exc is not None:
            summary.errors.append(f"array task {job.job_id} failed: {str(exc).strip().splitlines()[-1][:300]}")
    for path, e in by_path.items():
        rundir = RunDir(e.path)
        if path not in seen and rundir.is_complete():
            progress.update(_outcome(rundir))
        outcome = _outcome(rundir) if rundir.is_complete() else "missing"
        summary.outcomes[outcome] = summary.outcomes.get(outcome, 0) + 1


def run_sweep(
    spec: SweepSpec,
    out: str | os.PathLike[str],
    executor: str = "local",
    jobs: int = 1,
    retry_failed: bool = False,
    slurm: SlurmOptions | None = None,
    progress: bool = True,
    collect_results: bool = True,
) -> SweepSummary:
    """Run every pending configuration of ``spec`` into ``out``; rebuild ``out/results.parquet`` at the end."""
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
    if jobs < 1:
        raise InputError(f"--jobs must be >= 1, not {jobs}")
    check_executor(executor)
    out = Path(out).resolve()  # array tasks may run elsewhere: absolute run directories
    start = time.monotonic()
    entries = prepare(spec, out)
    if retry_failed:
        for e in entries:
            if e.status == "failed":
                with run_lock(e.path):
                    RunDir(e.path).result_json.unlink(missing_ok=True)
        entries = [replace(e, status="pending") if e.status == "failed" else e for e in entries]
    pending = [e for e in entries if e.status == "pending"]
    summary = SweepSummary(out=out, total=len(entries), skipped=len(entries) - len(pending), ran=len(pending))
    summary.failed_earlier = sum(e.status == "failed" for e in entries)
    with _Progress(len(pending), progress) as bar:
        if executor == "local":
            _run_local(pending, jobs, bar, summary.outcomes)
        else:
            plan = executor_plan(spec, pending, out, executor, slurm)
            if plan is not None and plan.chunks:
                _run_submitit(plan, pending, bar, summary)
    summary.wall_time_s = time.monotonic() - start
    if collect_results:
        from uvmlab.sweep.aggregate import write_results

        summary.results_path = write_results(out)
    _write_sweep_json(out, spec, entries, summary)
    return summary
