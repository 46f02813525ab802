"""``uvmlab run``: one workload under UVM at one oversubscription factor, PCA on or off, simulated or on a GPU.

Mode ``auto`` runs on the GPU only where ``uvmlab.measure.gpu.detect.gpu_status()`` reports a CUDA device and the shim;
otherwise it runs the simulator and says so in one line on stderr. Mode ``gpu`` without a GPU is an
UnavailableError naming what is missing. Both modes write the same run directory (uvmlab.files.rundir.RunDir).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvmlab.advise.advisor import resolve_policy
from uvmlab.config import RunConfig
from uvmlab.console import note
from uvmlab.errors import InputError, UnavailableError
from uvmlab.files.rundir import RunDir
from uvmlab.stats.figures import RUN_FIGURES
from uvmlab.units import parse_bytes


@dataclass
class RunResult:
    """What a run produced: the mode that ran, its directory and its result.json content.

    ``table(name)`` / ``tables`` give the run directory's tables (iterations, kernels, memory, ...) as DataFrames.
    """

    mode: str
    path: Path
    result: dict[str, Any]
    reused: bool = False
    """True when nothing ran: ``path`` already held this run's complete result (:func:`default_output`)."""

    def table(self, name: str) -> Any:
        """Table ``name`` of the run directory as a pandas DataFrame (InputError if the run has none)."""
        return RunDir(self.path).read_table(name)

    @property
    def tables(self) -> dict[str, Any]:
        """Every table the run wrote, by name, as pandas DataFrames (read on access)."""
        folder = self.path / "tables"
        names = sorted(p.stem for p in folder.glob("*.parquet")) if folder.is_dir() else []
        return {name: self.table(name) for name in names}


def gpu_availability() -> Any:
    """Whether GPU mode can run here: ``uvmlab.measure.gpu.detect.gpu_status()`` (``.available``, ``.reason``)."""
    from uvmlab.measure.gpu.detect import gpu_status

    return gpu_status()


def default_run_dir(cfg: RunConfig, root: Path | str = "runs") -> Path:
    """``runs/<workload>-x<F>-pca<on|off>[-<policy>]-<hash>``: the folder names the policy a run applies."""
    name = Path(cfg.workload.workload).stem if "/" in cfg.workload.workload else cfg.workload.workload
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "workload"
    policy = f"-{re.sub(r'[^A-Za-z0-9_.+-]+', '_', cfg.policy)}" if cfg.policy else ""
    return Path(root) / f"{name}-x{cfg.oversub:g}-pca{'on' if cfg.pca else 'off'}{policy}-{cfg.config_hash()[:8]}"


def canonical(cfg: RunConfig, spec: Any) -> RunConfig:
    """``cfg`` with its workload's defaults resolved one way, so that one job is one configuration (one hash, one
    run folder) whether a default is given or left out: the batch size as a number (the workload's default when
    None), and workload options equal to their defaults dropped (``spec``: the workload's
    ``workloads.base.WorkloadSpec``). ``api.run("gpt2", batch_size=8)`` and ``api.run("gpt2")`` are one run."""
    from dataclasses import replace

    wl = cfg.workload
    defaults = dict(spec.options)
    options = {
        k: v for k, v in wl.options.items() if not (k in defaults and type(v) is type(defaults[k]) and v == defaults[k])
    }
    return replace(cfg, workload=replace(wl, batch_size=spec.batch_size(wl), options=options))


def stored_run_differs(path: Path, cfg: RunConfig, figure_format: str = "png") -> str | None:
    """Why the complete simulated run in ``path`` is not ``cfg``'s result as this uvmlab would write it, or None
    when it is: same configuration (config.json), simulated by the same uvmlab version (env.json), figures in
    ``figure_format``, in a folder uvmlab owns. A workload file or a ``params_file`` may have changed since (their
    contents are not in the configuration), so such runs never count as the same; an upgraded torch or
    workload package is not detected either (``force`` runs it again)."""
    from uvmlab import __version__

    rd = RunDir(path, figure_format=figure_format)
    if not (rd.is_complete() and rd.is_owned()):
        return "it is not a complete run uvmlab wrote"
    workload = cfg.workload.workload
    if workload.endswith(".py") or Path(workload).is_file() or cfg.params_file:
        return "a workload file or parameter file may have changed since"
    try:
        record, env = rd.read_json(rd.config_json), rd.read_json(rd.env_json)
    except InputError as exc:
        return str(exc)
    if not isinstance(record, dict) or not isinstance(env, dict) or record.get("mode") != "sim":
        return "it is not a simulated run"
    if record.get("run") != json.loads(json.dumps(cfg.to_dict(), default=str)):
        return "its configuration differs"
    if env.get("uvmlab") != __version__:
        return f"uvmlab {env.get('uvmlab')} wrote it (this is {__version__})"
    if not all(rd.figure(name).is_file() for name in RUN_FIGURES):
        return f"it has no {figure_format} figures"
    from uvmlab.uvm.simulate import stored_tables_problem

    try:  # what is shown again must be what the run wrote
        return stored_tables_problem(rd, rd.read_result())
    except InputError as exc:
        return str(exc)


def default_output(cfg: RunConfig, mode: str, reusable: bool = True, figure_format: str = "png") -> tuple[Path, bool]:
    """Where a run without ``out`` goes, and whether that folder already holds its result (nothing to run).

    Running the same command twice works: the first of :func:`default_run_dir`, ``<dir>-2``, ``<dir>-3``, ... that
    holds no complete run is written; but a simulated run (``mode`` "sim", ``reusable``: no extra outputs asked
    for) whose identical result is already there (:func:`stored_run_differs`) is shown instead of simulated
    again. A measurement (``mode`` "gpu") always gets a new folder.
    """
    base = default_run_dir(cfg)
    candidate, n = base, 1
    while RunDir(candidate).is_complete():
        if reusable and mode == "sim" and stored_run_differs(candidate, cfg, figure_format) is None:
            return candidate, True
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate, False


def _default_target(cfg: RunConfig, mode: str, reusable: bool, figure_format: str, quiet: bool) -> tuple[Path, bool]:
    """:func:`default_output`, saying on stderr what it chose when the default folder was taken."""
    path, reused = default_output(cfg, mode, reusable, figure_format)
    base = default_run_dir(cfg)
    if quiet or (path == base and not reused):
        return path, reused
    if reused:
        note(f"{path} already holds this run (same configuration and uvmlab version): its stored result, not run "
             "again (--force runs it again)")  # fmt: skip
    else:
        if mode != "sim":
            why = "a measurement is never shown again"
        elif not reusable:
            why = "--snapshot and --timeline need the simulation"
        else:
            why = stored_run_differs(base, cfg, figure_format)
        note(f"{base} holds an earlier complete run ({why}): writing {path}")
    return path, reused


def choose_mode(cfg: RunConfig, quiet: bool = False, dry_run: bool = False) -> str:
    """Resolve ``cfg.mode`` to "sim" or "gpu" (auto: gpu only where available); say which on stderr.

    A GPU dry run (``--mode gpu --dry-run``) only prints the plan, so it needs no GPU.
    """
    if cfg.mode == "sim":
        return "sim"
    if cfg.workload.shard:  # one rank of a data-parallel job: only the simulator makes it (uvmlab.trace.shard)
        if cfg.mode == "gpu":
            raise UnavailableError(
                f"--mode gpu runs one process; --shard {cfg.workload.shard} is one rank of a {cfg.workload.world_size}"
                "-rank job, which only the simulator models: use --mode sim"
            )
        return "sim"
    if cfg.mode == "gpu" and dry_run:
        return "gpu"
    avail = gpu_availability()
    if cfg.mode == "gpu":
        if not avail.available:
            raise UnavailableError(
                f"--mode gpu needs a CUDA device and the uvmlab shim: {avail.reason or 'none found'}; "
                "use --mode sim to simulate instead"
            )
        return "gpu"
    if avail.available:
        if not quiet:
            note("CUDA device and shim found: running on the GPU (--mode gpu)")
        return "gpu"
    if not quiet:
        why = avail.reason or "no CUDA device found"
        note(f"{why}: running the simulator (--mode sim)")  # printed as written: the console has markup off
    return "sim"


def _gpu_run_options(gpu_options: Any) -> Any:
    """``GpuRunOptions`` from the CLI's dict of GPU flags (or pass one through)."""
    from uvmlab.measure.gpu.runner import GpuRunOptions

    if gpu_options is None:
        return GpuRunOptions()
    if not isinstance(gpu_options, dict):
        return gpu_options
    given = {k: v for k, v in gpu_options.items() if v not in (None, False)}
    fp = given.get("footprint")
    if isinstance(fp, str) and fp not in ("measure", "estimate"):
        given["footprint"] = parse_bytes(fp)
    if isinstance(given.get("alloc_conf"), str):
        from uvmlab.measure.gpu.plan import build_alloc_conf

        build_alloc_conf(given["alloc_conf"])  # checked before anything is estimated or run
    try:
        return GpuRunOptions(**given)
    except TypeError as exc:
        raise InputError(f"GPU run options {sorted(given)} are not all understood by the GPU runner: {exc}") from None


def run(
    cfg: RunConfig,
    out: Path | str | None = None,
    force: bool = False,
    gpu_options: Any = None,
    progress: Any = None,
    quiet: bool = False,
    capture_progress: Any = None,
    snapshot: Path | str | None = None,
    timeline: Path | str | None = None,
    figure_format: str = "png",
) -> RunResult:
    """Run ``cfg`` (simulated or on the GPU) into ``out`` (default :func:`default_run_dir`).

    ``snapshot`` (simulation only): also write a PyTorch memory snapshot; ``timeline``: a Perfetto JSON timeline;
    ``figure_format``: png, svg or pdf for the run's figures.
    """
    from uvmlab.uvm.simulate import check_simulator_inputs
    from workloads.registry import load_workload

    check_simulator_inputs(cfg)  # --sim-option knobs and the --params file: before anything is captured or removed
    spec = load_workload(cfg.workload.workload)  # an unknown workload is reported before anything else happens
    cfg = canonical(cfg, spec)  # a default given or left out: one configuration
    dry_run = bool(
        gpu_options.get("dry_run") if isinstance(gpu_options, dict) else getattr(gpu_options, "dry_run", False)
    )
    given = cfg
    mode = choose_mode(cfg, quiet=quiet, dry_run=dry_run)
    if out is not None or dry_run or force:  # -o: the folder named (a complete run there needs force)
        path = Path(out) if out is not None else default_run_dir(given)
    else:
        path, reused = _default_target(given, mode, snapshot is None and timeline is None, figure_format, quiet)
        if reused:
            return RunResult(mode, path, RunDir(path).read_result(), reused=True)
    if cfg.policy and cfg.applied is None:  # the one place a run's policy is resolved (an unknown name: one sentence)
        cfg = resolve_policy(cfg, progress=capture_progress)
    if cfg.applied is not None and snapshot is not None and cfg.applied.release_each_iteration:  # before any removal
        raise InputError(f"--snapshot does not model policy {cfg.policy}'s empty_cache calls yet; drop one")
    if not dry_run:  # before anything runs or is removed: an existing file needs --force (uvmlab.files.outputs)
        _check_output_files(cfg, force, {"--snapshot": snapshot if mode == "sim" else None, "--timeline": timeline})
    rundir = RunDir(path, figure_format=figure_format)
    if mode == "gpu":
        from uvmlab.measure.gpu.runner import run_gpu

        opts = _gpu_run_options(gpu_options)
        if cfg.applied is not None:
            opts = _gpu_policy(given, cfg, opts)
        if not dry_run:
            rundir.prepare(force=force)
        with rundir:  # releases the writer's lock
            result = run_gpu(cfg, opts, rundir)
            if snapshot is not None and not quiet:
                note("--snapshot applies to simulated runs only (a GPU run: torch.cuda.memory._dump_snapshot); ignored")
            if timeline is not None and not dry_run and rundir.is_complete():
                from uvmlab.export.timeline import run_timeline

                run_timeline(rundir, timeline)
        return RunResult("gpu", path, result)
    if isinstance(gpu_options, dict) and not quiet:
        used = sorted(k for k, v in gpu_options.items() if v not in (None, False))
        if used:
            note(f"{', '.join('--' + k.replace('_', '-') for k in used)} only apply to --mode gpu; ignored")
    from uvmlab.uvm.simulate import simulate_run

    rundir.prepare(force=force)
    with rundir:  # releases the writer's lock
        result = simulate_run(
            cfg,
            rundir,
            progress=progress,
            capture_progress=capture_progress,
            snapshot=snapshot,
            timeline=timeline,
            given=given,
        )
    eff = result.get("effective_oversub")
    if not quiet and eff is not None and eff > cfg.oversub * 1.001:
        note(
            f"footprint / {cfg.oversub:g} does not fit this GPU's usable memory: simulated at factor {eff:.3g} "
            "(give a larger --gpu-memory for the requested factor)"
        )
    return RunResult("sim", path, result)


def _check_output_files(cfg: RunConfig, force: bool, files: dict[str, Path | str | None]) -> None:
    """Refuse an extra output file (``--snapshot``, ``--timeline``) that is the workload file, a folder, or an
    existing file without ``force``."""
    from uvmlab.files.outputs import check_output_file

    workload = Path(cfg.workload.workload)
    inputs = [workload] if workload.exists() else []
    for option, file in files.items():
        if file is not None:
            check_output_file(file, inputs, force, option)


def _gpu_policy(given: RunConfig, cfg: RunConfig, opts: Any) -> Any:
    """GPU options for ``cfg`` (a resolved policy): the policy's settings on the GPU memory the job as given has.

    With ``--footprint estimate`` (the default) the balloon is sized from the simulated footprint of the job as
    given, so the policy runs on footprint(given) / --oversub of memory, as ``uvmlab advise`` simulated it.
    """
    from dataclasses import replace

    from uvmlab.uvm.simulate import footprint_bytes

    if cfg.applied.gpu_refusal:
        raise InputError(cfg.applied.gpu_refusal)
    prefetch = cfg.applied.env("UVMLAB_PREFETCH")
    if prefetch:
        opts = replace(opts, prefetch=prefetch)
    if opts.footprint == "estimate":
        opts = replace(opts, footprint=footprint_bytes(replace(given, policy=None)))
    return opts


def simulate_run(cfg: RunConfig, rundir: RunDir, **kwargs: Any) -> dict:
    """``uvmlab.uvm.simulate.simulate_run`` for the public API: a named policy is resolved first, as in :func:`run`."""
    from uvmlab.uvm.simulate import simulate_run as simulate

    if cfg.policy and cfg.applied is None:
        kwargs.setdefault("given", cfg)
        cfg = resolve_policy(cfg, progress=kwargs.get("capture_progress"))
    return simulate(cfg, rundir, **kwargs)
