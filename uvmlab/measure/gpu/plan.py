"""GPU-mode planning (pure): :class:`GpuRunOptions`, :func:`plan_run` -> :class:`Plan`, :func:`format_plan`.

``plan_run(cfg, opts)`` decides the balloon arithmetic and the exact commands (argv lists plus the environment
variables each one sets), in order:

``calibrate``  (``--footprint measure``) a short run under the shim, no balloon: its allocation log gives the
               footprint (peak live managed bytes = peak reserved with PCA on, peak live tensors with it off);
``baseline``   (``--baseline``) the same job without UVM (shim in passthrough mode): the non-UVM time;
``run``        the job under the shim with the balloon, optionally inside ``nsys profile``;
``export``     (``--nsys``) ``nsys export --type sqlite`` of the report.

Without a GPU the plan still works: it assumes the ``--gpu`` spec and says so. With ``--footprint measure`` the
later steps depend on the calibration result: the plan shows them with the simulator's estimate as a stand-in
(said in the output) and ``uvmlab.measure.gpu.runner.run_gpu`` re-plans with the measured number.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from uvmlab.config import AppliedPolicy, RunConfig
from uvmlab.errors import InputError, InvariantError
from uvmlab.files.inputs import short
from uvmlab.gpus import GpuSpec, get_gpu
from uvmlab.measure.gpu.balloon import DEFAULT_RESERVE_BYTES, BalloonPlan, plan_balloon
from uvmlab.measure.gpu.detect import GpuStatus, gpu_status
from uvmlab.numbers import parse_float
from uvmlab.units import format_bytes

REQUIRED_ALLOC_CONF = "backend:native,expandable_segments:False"
"""Expandable segments and cudaMallocAsync never call cudaMalloc, so the shim would miss them (DESIGN.md Traps)."""
NSYS_PROFILE_FLAGS = (
    "--trace=cuda,nvtx",
    "--cuda-um-gpu-page-faults=true",
    "--cuda-um-cpu-page-faults=true",
    "--cuda-memory-usage=true",
    "--force-overwrite=true",
)
FOOTPRINT_CHOICES = ("measure", "estimate")
ALLOC_LOG = "{role}.alloc.bin"
CUDNN_LOG = "{role}.cudnn.log"
"""cuDNN API log of a step's warm-up iteration (``same_workspace_limit``), under RUNDIR/logs/."""
WARMUP_ENV = "UVMLAB_WARMUP_ITERATIONS"
"""Untimed iterations the worker runs first (the baseline and run steps: 1)."""
CUDNN_LOG_WARMUP_ONLY_ENV = "UVMLAB_CUDNN_LOG_WARMUP_ONLY"
"""1: the worker switches the cuDNN API log off after the warm-up (its engine choices are made by then)."""
"""Shim allocation log of each step, under RUNDIR/logs/."""
BALLOON_CLAIM = "{role}.balloon.claim"
"""The shim creates this file (O_EXCL) when it takes the balloon: the first process of a step to allocate owns it,
later processes of the step (e.g. a child started by the worker) do not take a second one."""
DEVICE_ORDER = "PCI_BUS_ID"
"""CUDA_DEVICE_ORDER of every step: CUDA numbers GPUs as nvidia-smi and NVML's PCI listing do (CUDA's default,
FASTEST_FIRST, may put another GPU at index 0; CUDA Programming Guide, "CUDA Environment Variables")."""
EMPTY_CACHE_ENV = "UVMLAB_EMPTY_CACHE_EACH_ITERATION"
"""Set by a plan whose policy releases cached blocks: the worker calls torch.cuda.empty_cache() after each step."""
FACTOR_TOLERANCE = 0.05
"""A run whose measured factor is more than 5 % from the requested one warns (``--strict-factor``: fails)."""
INHERITED_ENV_DROPPED = (
    "PYTORCH_NO_CUDA_MEMORY_CACHING",  # "1" turns the caching allocator off (c10 forceUncachedAllocator, check_env)
    "PYTORCH_NO_HIP_MEMORY_CACHING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",  # the newer name of PYTORCH_CUDA_ALLOC_CONF (c10/core/AllocatorConfig.cpp)
    "PYTORCH_HIP_ALLOC_CONF",
    "CUDA_DEVICE_ORDER",
    "LD_PRELOAD",
    "CUBLAS_WORKSPACE_CONFIG",  # cuBLAS workspace size per handle and stream: the footprint (cuBLAS docs 2.1.4)
    "CUBLASLT_WORKSPACE_SIZE",  # PyTorch's cuBLASLt workspace size (aten/src/ATen/cuda/CUDABlas.cpp)
    "CUDA_LAUNCH_BLOCKING",  # every kernel launch synchronous: the timing (CUDA Programming Guide, env variables)
)
"""Variables of the parent's environment a step never inherits: each changes the experiment (allocator on/off,
backend, which GPU, which shim, workspace sizes, launch timing). A step sets what it needs itself; ``UVMLAB_*``
variables are dropped too, but for ``INHERITED_UVMLAB_KEPT``. What was dropped is recorded in env.json
(``dropped_env``)."""
INHERITED_UVMLAB_KEPT = ("UVMLAB_SHIM_VERBOSE",)
"""``UVMLAB_*`` variables a step does inherit: diagnostics that change nothing measured (the shim's stderr lines)."""
MEMORY_FRACTION_ENV = "UVMLAB_MEMORY_FRACTION"
"""Set by a plan whose allocator config has ``garbage_collection_threshold``: the worker calls
``torch.cuda.set_per_process_memory_fraction`` with it before building the job. PyTorch's garbage collection acts
only when a fraction is set (c10/cuda/CUDACachingAllocator.cpp ``malloc``: ``if (set_fraction &&
garbage_collection_threshold() > 0.0) garbage_collect_cached_blocks()``), so without it the threshold does nothing."""
REQUIRE_CONCURRENT_MANAGED_ENV = "UVMLAB_REQUIRE_CONCURRENT_MANAGED"
"""Set to 1 on the run step of an oversubscribed plan (factor > 1): the worker then requires
``cudaDevAttrConcurrentManagedAccess`` (uvmlab.measure.gpu.worker.check_concurrent_managed_access)."""
STEP_CONTROL_ENV = (
    "UVMLAB_SHIM_MODE",
    "UVMLAB_ADVISE",
    "UVMLAB_PREFETCH",
    "UVMLAB_BALLOON_BYTES",
    "UVMLAB_BALLOON_LEAVE_BYTES",
    "UVMLAB_BALLOON_CLAIM",
    "UVMLAB_BALLOON_DEFER",
    "UVMLAB_REPORT_FREE_BYTES",
    "UVMLAB_ALLOC_LOG",
    "UVMLAB_CUDART",
    "UVMLAB_HINTS",
    "UVMLAB_WARMUP_ITERATIONS",
    "UVMLAB_CUDNN_LOG_WARMUP_ONLY",
    EMPTY_CACHE_ENV,
    MEMORY_FRACTION_ENV,
    REQUIRE_CONCURRENT_MANAGED_ENV,
)
"""The ``UVMLAB_*`` variables the shim and the worker read: a printed command unsets those it does not set."""


@dataclass(frozen=True)
class GpuRunOptions:
    """How to run on the GPU (the ``uvmlab run`` flags of GPU mode)."""

    footprint: str | int = "estimate"
    """'measure' (a calibration run under the shim), 'estimate' (the simulator), or a number of bytes."""
    baseline: bool = False
    """Also run without UVM, for the measured slowdown."""
    nsys: bool = False
    """Run under ``nsys profile`` with UM page faults and memory usage, then export SQLite."""
    alloc_conf: str = ""
    """Extra PYTORCH_CUDA_ALLOC_CONF entries (backend and expandable_segments are fixed)."""
    dry_run: bool = False
    advise: tuple[str, ...] = ()
    """Shim cudaMemAdvise policies (uvmlab.measure.gpu.shim.ADVISE_POLICIES)."""
    prefetch: str = "off"
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    host_memory_bytes: int | None = None
    """Host RAM for the managed spill check; None: read /proc/meminfo."""
    calibration_iterations: int = 2
    python: str = field(default_factory=lambda: sys.executable)
    nsys_path: str = "nsys"
    shim_library: str | None = None
    """Path of the shim; None: the cached build for the current source (uvmlab.measure.gpu.shim.shim_path)."""
    strict_factor: bool = False
    """Fail the run (after writing its results) when the measured factor is more than 5 % from the requested one."""
    same_workspace_limit: bool = True
    """With ``baseline``: both steps' ``cudaMemGetInfo`` report the same free figure (the UVM capacity C, through the
    shim's ``UVMLAB_REPORT_FREE_BYTES``), so PyTorch gives cuDNN the same workspace limit in both and they choose
    the same engines, and both record their cuDNN engine choices (the API log of the warm-up iteration)."""

    def __post_init__(self) -> None:
        fp = self.footprint
        if isinstance(fp, bool) or not (fp in FOOTPRINT_CHOICES or (isinstance(fp, int) and fp > 0)):
            raise InputError(f"--footprint must be measure, estimate or a byte size > 0, not {fp!r}")
        if isinstance(self.calibration_iterations, bool) or self.calibration_iterations < 1:
            raise InputError(f"calibration iterations must be >= 1, not {self.calibration_iterations!r}")


@dataclass(frozen=True)
class Step:
    """One command: argv (never run through a shell), the environment variables it sets, its folder."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    description: str


@dataclass(frozen=True)
class Plan:
    """Everything a GPU run will do, decided before anything runs."""

    steps: tuple[Step, ...]
    balloon: BalloonPlan | None
    """None until the footprint is known (``--footprint measure`` before calibration)."""
    gpu_name: str
    gpu_source: str
    """'detected' or 'assumed from --gpu' (no GPU here; the reason is in ``notes``)."""
    footprint_source: str
    rundir: Path
    alloc_conf: str
    needs_measurement: bool
    """True: the steps after ``calibrate`` use a stand-in footprint and are re-planned after it runs."""
    notes: tuple[str, ...] = ()

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


def dropped_from(parent: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``parent`` a step does not inherit (``INHERITED_ENV_DROPPED`` and ``UVMLAB_*`` but for
    ``INHERITED_UVMLAB_KEPT``), with their values."""
    return {
        k: v
        for k, v in parent.items()
        if k in INHERITED_ENV_DROPPED or (k.startswith("UVMLAB_") and k not in INHERITED_UVMLAB_KEPT)
    }


def step_environment(step: Step, parent: Mapping[str, str]) -> dict[str, str]:
    """The environment a step runs with: the parent's minus the variables that would change the experiment
    (:func:`dropped_from`), plus the step's own."""
    dropped = dropped_from(parent)
    return {**{k: v for k, v in parent.items() if k not in dropped}, **step.env}


def shell_command(step: Step) -> str:
    """The step as one shell line to paste: ``cd DIR && env -u VAR ... K=V ... ARGV``. It unsets every variable
    the plan would drop from the caller's environment (``INHERITED_ENV_DROPPED`` and the ``UVMLAB_*`` variables of
    ``STEP_CONTROL_ENV``) that the step does not set itself, so a pasted command runs the planned experiment."""
    unset = [k for k in (*INHERITED_ENV_DROPPED, *STEP_CONTROL_ENV) if k not in step.env]
    parts = ["env", *(f"-u {k}" for k in unset), *(f"{k}={shlex.quote(v)}" for k, v in sorted(step.env.items()))]
    return f"cd {shlex.quote(step.cwd)} && {' '.join(parts)} {shlex.join(step.argv)}"


_NUMBER_TOKEN = re.compile(r"(?i)(?<![a-z_])[+-]?(?:inf(?:inity)?|nan|[0-9][0-9_.]*(?:e[+-]?[0-9]+)?)(?![a-z_])")
"""A number inside an alloc-conf value (``max_split_size_mb:512``, ``roundup_power2_divisions:[256:1,>:4]``)."""


def build_alloc_conf(extra: str) -> str:
    """PYTORCH_CUDA_ALLOC_CONF for a GPU run: the required native backend plus the user's additions."""
    parts = [REQUIRED_ALLOC_CONF]
    for item in (p.strip() for p in _split_top_level(extra)):
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--alloc-conf entries are key:value pairs separated by commas, not {item!r}")
        key = key.strip()
        for token in _NUMBER_TOKEN.findall(value):  # PyTorch parses these as size_t / double: finite, short
            parse_float(token, f"--alloc-conf {short(key)}", lo=0, hi=2.0**64)
        if key == "backend" and value.strip() != "native":
            raise InputError(
                f"--alloc-conf backend:{value.strip()} never calls cudaMalloc, so the UVM shim cannot see it; "
                "GPU runs use backend:native"
            )
        if key == "expandable_segments" and value.strip().lower() != "false":
            raise InputError(
                "--alloc-conf expandable_segments:True maps memory with cuMemCreate, not cudaMalloc, so the UVM shim "
                "cannot see it; GPU runs use expandable_segments:False"
            )
        if key in ("backend", "expandable_segments"):
            continue
        parts.append(f"{key}:{value.strip()}")
    return ",".join(parts)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets (roundup_power2_divisions:[256:1,>:4] is one entry)."""
    items, depth, cur = [], 0, []
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return items


def host_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unreadable): what the host can still give the spilled managed
    pages without swapping; MemTotal counts the memory other processes already hold."""
    from uvmlab.measure.gpu.machine import meminfo

    return meminfo()["MemAvailable"]


def _gpu_for(cfg: RunConfig, status: GpuStatus) -> tuple[GpuSpec, int, str, str]:
    """(spec for context size, total bytes, name, source)."""
    spec = get_gpu(cfg.gpu)
    if status.available and status.memory_bytes:
        return spec, status.memory_bytes, status.name or cfg.gpu, "detected"
    if cfg.gpu_memory_bytes is not None:
        spec = spec.with_memory(cfg.gpu_memory_bytes)
    return spec, spec.memory_bytes, spec.name, "assumed from --gpu"


def _estimate_footprint(cfg: RunConfig) -> int:
    from uvmlab.uvm import simulate  # imported lazily (it captures a trace)

    return int(simulate.footprint_bytes(cfg))


def plan_run(
    cfg: RunConfig,
    opts: GpuRunOptions,
    rundir: Path | str = "RUN",
    *,
    status: GpuStatus | None = None,
    measured_footprint_bytes: int | None = None,
    estimate: Callable[[RunConfig], int] | None = None,
    standin: bool = True,
) -> Plan:
    """Decide every command and number of a GPU run. Reads, never writes; no process is started.

    ``status`` defaults to :func:`gpu_status`; ``estimate`` to ``uvmlab.uvm.simulate.footprint_bytes``. With
    ``--footprint measure`` and no ``measured_footprint_bytes`` the plan starts with the ``calibrate`` step; the later
    steps are shown with the estimate as a stand-in (``standin=False`` leaves them out, as ``run_gpu`` does), or
    left out with a note when the estimate itself would be refused.
    """
    status = gpu_status() if status is None else status
    estimate = estimate or _estimate_footprint
    rundir = Path(rundir)
    logs = rundir / "logs"
    spec, total, gpu_name, gpu_source = _gpu_for(cfg, status)
    notes: list[str] = []
    if not status.available:
        notes.append(f"no GPU here ({status.reason}); this plan assumes the {gpu_name} from --gpu")
    # Without a GPU here the run will happen on another host: this machine's RAM says nothing about it.
    host = opts.host_memory_bytes
    if host is None and status.available:
        host = host_memory_bytes()
    policy = applied_policy(cfg)
    if policy is not None:
        notes.extend(policy.gpu_notes)
    extra_conf = ",".join(c for c in (opts.alloc_conf, policy.alloc_conf if policy else "") if c)
    alloc_conf = build_alloc_conf(extra_conf)

    from uvmlab.measure.gpu import shim as shim_mod

    library = opts.shim_library or str(shim_mod.shim_path())
    base_env: dict[str, str] = {
        "PYTORCH_CUDA_ALLOC_CONF": alloc_conf,
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_ORDER": DEVICE_ORDER,
    }
    if not cfg.pca:
        base_env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if policy is not None and policy.release_each_iteration:
        base_env[EMPTY_CACHE_ENV] = "1"
    managed_env: dict[str, str] = {}  # what only steps on managed memory get
    hints = policy.env("UVMLAB_HINTS") if policy is not None else None
    if hints:  # per-tensor hints (uvmlab.measure.gpu.hints)
        # cudaMemAdvise / cudaMemPrefetchAsync need managed ranges (CUDA 13 cuda_runtime_api.h): on the baseline's
        # device memory they fail with cudaErrorInvalidValue, so the baseline runs the job without hints
        managed_env["UVMLAB_HINTS"] = hints
        if opts.baseline:
            notes.append("the per-tensor hints need managed memory: the baseline runs the job without them")
    worker = (opts.python, "-m", "uvmlab.measure.gpu.worker", str(rundir))
    cwd = str(rundir)

    def shim_vars(role: str, mode: str, leave: int | None, report_free: int | None = None) -> dict[str, str]:
        return shim_mod.shim_env(
            library,
            mode=mode,
            advise=opts.advise if mode == "managed" else (),
            prefetch=opts.prefetch if mode == "managed" else "off",
            balloon_leave_bytes=leave,
            balloon_claim=logs / BALLOON_CLAIM.format(role=role) if leave is not None else None,
            alloc_log=logs / ALLOC_LOG.format(role=role),
            balloon_defer=leave is not None,
            report_free_bytes=report_free,
        )

    def paired_env(role: str, balloon: BalloonPlan) -> tuple[dict[str, str], int | None]:
        """The warm-up, and with a baseline the same reported free memory and the cuDNN engine log (module doc)."""
        env = {WARMUP_ENV: "1"}
        if not (opts.baseline and opts.same_workspace_limit):
            return env, None
        from uvmlab.measure.gpu.kit.cudnn_log import DEST_ENV, LOG_ENV

        env.update(LOG_ENV)
        env[DEST_ENV] = str(logs / CUDNN_LOG.format(role=role))
        env[CUDNN_LOG_WARMUP_ONLY_ENV] = "1"
        return env, balloon.available_bytes

    def later_steps(footprint: int) -> tuple[BalloonPlan, list[Step]]:
        balloon = plan_balloon(footprint, cfg.oversub, total, spec.context_bytes, opts.reserve_bytes, host)
        run_env = dict(managed_env)
        if balloon.oversub > 1:
            run_env[REQUIRE_CONCURRENT_MANAGED_ENV] = "1"
        fraction = gc_memory_fraction(alloc_conf, balloon)
        if fraction is not None:
            run_env[MEMORY_FRACTION_ENV] = f"{fraction:.6f}"
            notes.append(
                f"garbage_collection_threshold acts only with a memory fraction (CUDACachingAllocator.cpp): the run "
                f"step sets torch.cuda.set_per_process_memory_fraction({fraction:.6f}) = UVM capacity / GPU memory, "
                "so the allocator also refuses to reserve more than that (an oversubscribed job stops with an OOM, "
                "as uvmlab advise predicts); the calibrate and baseline steps run without a fraction"
            )
        steps: list[Step] = []
        if opts.baseline and opts.same_workspace_limit:
            notes.append(
                f"the baseline and run steps both see cudaMemGetInfo free = {balloon.available_bytes} B (the UVM "
                "capacity, UVMLAB_REPORT_FREE_BYTES): PyTorch sizes cuDNN workspaces from it (CUDACachingAllocator "
                "cacheInfo), so both choose the same engines; each records its choices (logs/<role>.cudnn.log, the "
                "warm-up iteration) and result.json compares them"
            )
        if opts.baseline:
            if footprint > balloon.total_bytes - balloon.context_bytes - balloon.reserve_bytes:
                raise InputError(
                    f"--baseline runs the job without UVM, but its footprint {format_bytes(footprint)} does not fit "
                    f"the {gpu_name}'s {format_bytes(total)}; drop --baseline"
                )
            b_env, b_free = paired_env("baseline", balloon)
            steps.append(
                Step(
                    "baseline",
                    (*worker, "--role", "baseline"),
                    {**base_env, **b_env, **shim_vars("baseline", "passthrough", None, b_free)},
                    cwd,
                    "the same job without UVM (shim in passthrough mode, logging only): the non-UVM time",
                )
            )
        run_argv: tuple[str, ...] = (*worker, "--role", "run")
        if opts.nsys:
            run_argv = (opts.nsys_path, "profile", *NSYS_PROFILE_FLAGS, "-o", str(logs / "profile"), *run_argv)
        r_env, r_free = paired_env("run", balloon)
        steps.append(
            Step(
                "run",
                run_argv,
                {**base_env, **run_env, **r_env, **shim_vars("run", "managed", balloon.leave_bytes, r_free)},
                cwd,
                f"the job under UVM: cudaMalloc -> cudaMallocManaged; after one warm-up iteration the balloon leaves "
                f"{format_bytes(balloon.leave_bytes)} free (UVM capacity {format_bytes(balloon.available_bytes)} + "
                f"reserve {format_bytes(balloon.reserve_bytes)})",
            )
        )
        if opts.nsys:
            export_argv = ("export", "--type", "sqlite", "--force-overwrite", "true", "-o")
            steps.append(
                Step(
                    "export",
                    (opts.nsys_path, *export_argv, str(logs / "profile.sqlite"), str(logs / "profile.nsys-rep")),
                    {},
                    cwd,
                    "SQLite export of the report, read by uvmlab.measure.nsys.measured.to_run_tables",
                )
            )
        return balloon, steps

    steps: list[Step] = []
    balloon: BalloonPlan | None = None
    needs_measurement = measured_footprint_bytes is None and opts.footprint == "measure"
    if measured_footprint_bytes is not None:
        fp_source = "measured (calibration run under the shim)"
        balloon, steps = later_steps(int(measured_footprint_bytes))
    elif isinstance(opts.footprint, int):
        fp_source = "given (--footprint)"
        balloon, steps = later_steps(opts.footprint)
    elif opts.footprint == "estimate":
        fp_source = "estimate (uvmlab.uvm.simulate.footprint_bytes)"
        balloon, steps = later_steps(estimate(cfg))
    else:
        steps.append(
            Step(
                "calibrate",
                (*worker, "--role", "calibrate", "--iterations", str(opts.calibration_iterations)),
                {**base_env, **managed_env, **shim_vars("calibrate", "managed", None)},
                cwd,
                f"{opts.calibration_iterations} iteration(s) under the shim without a balloon: the allocation log "
                "gives the footprint",
            )
        )
        fp_source = "to be measured by the calibrate step"
        if standin:
            try:
                balloon, later = later_steps(estimate(cfg))
            except InputError as exc:
                notes.append(f"with the simulator's estimate the later steps would be refused ({exc})")
            else:
                steps.extend(later)
                fp_source += "; the numbers below use the simulator's estimate until then"
    if balloon is not None:
        notes.extend(balloon.notes)
    return Plan(
        steps=tuple(steps),
        balloon=balloon,
        gpu_name=gpu_name,
        gpu_source=gpu_source,
        footprint_source=fp_source,
        rundir=rundir,
        alloc_conf=alloc_conf,
        needs_measurement=needs_measurement,
        notes=tuple(notes),
    )


def gc_memory_fraction(alloc_conf: str, balloon: BalloonPlan) -> float | None:
    """The per-process memory fraction a run with ``garbage_collection_threshold`` in ``alloc_conf`` needs: the UVM
    capacity over the GPU's memory (what ``uvmlab.advise``'s gc policy simulates, advisor ``_gc_oom``); None when
    the config has no threshold or already sets a fraction."""
    keys = {item.partition(":")[0].strip() for item in _split_top_level(alloc_conf)}
    if "garbage_collection_threshold" not in keys or "per_process_memory_fraction" in keys:
        return None
    return min(1.0, balloon.available_bytes / balloon.total_bytes)


def format_plan(plan: Plan) -> str:
    """The dry run's text: the balloon arithmetic, then each command shell-quoted with the variables it sets."""
    b = plan.balloon
    lines = [f"GPU: {plan.gpu_name} ({plan.gpu_source})"]
    if b is None:
        lines.append(f"footprint: unknown, {plan.footprint_source}")
    else:
        lines += [
            f"footprint: {b.footprint_bytes} B ({format_bytes(b.footprint_bytes)}), {plan.footprint_source}",
            "balloon arithmetic (bytes):",
            f"  total memory               {b.total_bytes:>16}  {format_bytes(b.total_bytes)}",
            f"  - CUDA context + driver    {b.context_bytes:>16}  {format_bytes(b.context_bytes)}",
            f"  - reserve R (non-UVM)      {b.reserve_bytes:>16}  {format_bytes(b.reserve_bytes)}",
            f"  - UVM capacity C = M / f   {b.available_bytes:>16}  {format_bytes(b.available_bytes)}"
            f"  (f = {b.oversub:g}, achieved {b.achieved_oversub:.4f})",
            f"  = balloon (planned)        {b.balloon_bytes:>16}  {format_bytes(b.balloon_bytes)}",
            f"  the shim leaves C + R = {b.leave_bytes} B free, measured with cudaMemGetInfo after one warm-up "
            "iteration (modules, handles and workspaces exist by then; live managed ranges are prefetched to the host "
            "first);",
            "  UVM fills all free memory before it evicts (block_alloc_gpu_chunk, uvm_va_block.c), so it gets C + R "
            "less what non-UVM allocations take after the balloon",
            f"  factor over total memory (F_total): {b.oversub_total:.4f}",
            "effective factor, measured by the run step (the plan above is only the intent):",
            "  after the last timed iteration (the first one has loaded cuBLAS/cuDNN handles and lazy modules) the "
            "worker frees the job's memory,",
            "  then reads cudaMemGetInfo free F and the shim's live managed bytes L (uvmlab_live_managed_bytes):",
            "  C_measured = F + L; factor achieved = M_run / C_measured, M_run = the run's own peak of live managed "
            "bytes (its shim log)",
            f"  more than {FACTOR_TOLERANCE:.0%} from f = {b.oversub:g} warns and records both "
            "(result.json gpu_run.effective); --strict-factor makes it an error",
            "  a balloon the shim could not take (free memory already at or below what to leave) is logged as a "
            "balloon_alloc record of 0 bytes and said on stderr",
        ]
    lines.append(f"PYTORCH_CUDA_ALLOC_CONF: {plan.alloc_conf}")
    for note in plan.notes:
        lines.append(f"note: {note}")
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"step {i}: {step.name}: {step.description}")
        lines.append(f"  {shell_command(step)}")
    if plan.needs_measurement:
        lines.append("the steps after calibrate are re-planned with the measured footprint")
    return "\n".join(lines) + "\n"


def applied_policy(cfg: RunConfig) -> AppliedPolicy | None:
    """``cfg.applied``; a named policy that was never resolved is a bug of the caller, not silently dropped."""
    if cfg.policy and cfg.applied is None:
        raise InvariantError(
            f"policy {cfg.policy!r} reached the GPU plan unresolved (resolve it where the user names it: "
            "uvmlab.advise.advisor.resolve_policy)"
        )
    return cfg.applied
