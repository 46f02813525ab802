"""What ``uvmlab collect`` runs, decided before anything runs (pure): :func:`plan_collect`, :func:`format_kit_plan`.

Every step is a child process (an argv list with the variables it sets, never a shell; run by
``uvmlab.measure.gpu.runner.execute_step``, so the inherited variables that would change the experiment are dropped as
for a
GPU run, uvmlab.measure.gpu.plan.step_environment), writing under ``DIR/raw/<set>/``:

``memory``  one process per :class:`MemoryCase` (``memory_step``): snapshot with Python frames, PyTorch's peaks, the
            NVML peak; default cases: :data:`DEFAULT_CASES` (resnet50, vgg16, convnext_tiny and gpt2 at two batch
            sizes, SGD and Adam, the CNNs with ``cudnn.benchmark`` off and on);
``cudnn``   one process per convolutional workload, batch size and benchmark setting (SGD: the optimizer does not
            change a convolution), one iteration with the cuDNN API log on and C++ frames in the snapshot;
``uvm``     the streams (``uvm_step``) at ``factors`` of the free memory, inside ``nsys profile`` with the UM flags
            when nsys is on PATH (then ``nsys export``), and the GCN (``gcn``) at the node counts whose simulated
            footprint is each factor of the free memory, under UVM (the shim, caching off) and natively;
``link``    the microbenchmarks (``link_step``): prefetch bandwidth and page-touch costs; the oversubscribed rows
            only with ``allow_oversubscription``.

``facts``   the machine (``facts_step``): runtime (gVisor / Firecracker), kernel, driver, HMM/ATS attributes, UVM
            module parameters, the tools present, the worker's import check;
``probe``   the shim and UVM on the real runtime (``probe_step``): interposition, the balloon, residency in
            cudaMemGetInfo, memory returned after a free, non-UVM growth after the balloon, the hint calls' codes;
``run``     ``uvmlab run resnet50 --oversub 0.75 --baseline`` end to end (``run_step``): balloon after the warm-up,
            capacity probe, effective factor, comparable cuDNN engines, slowdown without eviction.

**The budget** (:func:`select_steps`): every candidate step has a value rank (:data:`FIRST_RUN_ORDER`: what the open
questions of docs/gpu.md need first: machine facts, the shim and balloon probe, the ImageNet CNN snapshots and cuDNN
engine logs, the link and fault costs, the end-to-end run, then the rest), an estimated duration on the GPU's spec
(:func:`estimate_seconds`, not measured: [I]) and a time cap (:func:`cap_seconds`). With ``budget_s`` the plan keeps
the candidates in value order whose estimates still fit the budget (a step that does not fit is left out and the
next ones are still considered) and lists what it left out; the runner also stops each step at its cap and at the
budget's end. Without a budget every candidate runs.

Safety: a factor above :data:`MAX_SAFE_FACTOR` (0.9) of the free memory asks a shared GPU for memory it may not have
(the driver then evicts, and another tenant's job may stall or fail); it is refused unless
``allow_oversubscription`` is set. Every step sizes its managed memory from the free memory it measures when it
starts, minus the margin of uvmlab.measure.gpu.kit.sizing, so the default never asks for more managed memory than
the card has free.

Outputs: each step writes into ``<its folder>.partial`` (the paths in its argv), which the runner renames to the
folder when the step succeeds: a step killed at its cap or failing never replaces or removes a finished step's
output.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.measure.gpu.detect import GpuStatus, gpu_status
from uvmlab.measure.gpu.plan import DEVICE_ORDER, NSYS_PROFILE_FLAGS, Step, shell_command
from uvmlab.units import format_bytes

WHAT = ("facts", "probe", "memory", "cudnn", "link", "run", "uvm")
STAGING_SUFFIX = ".partial"
"""A step writes into ``<output>.partial``; the runner renames it to ``<output>`` when the step succeeds."""
DEFAULT_BUDGET_S = 540.0
"""The default budget: what the lent machine allows in one command with time left to rerun it (10 minutes a
command, about 15 minutes in all; .library/device README)."""
MAX_SAFE_FACTOR = 0.9
"""Largest factor of the free memory asked without ``--allow-oversubscription`` [I]: 10 % of the free memory stays
for the context's growth, the process's other allocations and other tenants."""
DEFAULT_FACTORS = (0.1, 0.25)
"""Working sets of the streams and the GCN as fractions of the free memory: small enough for the budget (a 0.9
working set of an H200 is a 125 GB host write per row); --factors 0.25,0.5,0.9 gives the fuller set."""
OVERSUB_LINK_FACTORS = (1.5, 2.0, 4.0)
"""uvmlab.measure.gpu.microbench.DEFAULT_FACTORS: its oversubscribed rows (behind a balloon), with the flag only."""
CONV_WORKLOADS = ("resnet50", "resnet101", "alexnet")
"""Built-in workloads with convolutions; named ``torchvision:``/``timm:`` models count as convolutional too."""
STARTUP_S = 15.0
"""A fresh Python process importing torch and creating the CUDA context [I: not measured on the lent machine; its
gVisor runtime makes file I/O slower than a plain host]."""
BUILD_S = 5.0
"""Building a torchvision/HF model with random weights [I]."""
ITERATION_S = 3.0
"""One of the first training iterations of a memory case (cuDNN heuristics, lazy modules) [I]."""
SNAPSHOT_S = {"python": 10.0, "all": 30.0, "none": 0.0}
"""Pickling a memory snapshot with Python frames / with C++ frames symbolized (TORCH_SYMBOLIZE_MODE=fast) [I]."""
HOST_FILL_BYTES_PER_S = 4e9
"""The CPU writing managed memory (memset) in a sandbox [I]."""
RUN_STEP_S = 95.0
"""``uvmlab run`` with --footprint measure --baseline: three worker processes (calibrate, baseline, run), a trace
capture for the estimate, a few iterations each [I]."""
SYMBOLIZE_ENV = {"TORCH_SYMBOLIZE_MODE": "fast"}
"""C++ frames of a snapshot symbolized by PyTorch's own DWARF reader, not one ``addr2line`` process per frame (the
default in torch 2.x; minutes for a CNN iteration, and the lent machine has no binutils) [I: torch
``torch/csrc/profiler/unwind`` reads TORCH_SYMBOLIZE_MODE = dladdr | addr2line | fast]."""


@dataclass(frozen=True)
class MemoryCase:
    """One training case of the memory and cuDNN sets."""

    workload: str
    batch_size: int
    optimizer: str = "sgd"
    cudnn_benchmark: bool = False
    iterations: int = 2
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        w = re.sub(r"[^A-Za-z0-9]+", "-", self.workload).strip("-")
        return f"{w}_b{self.batch_size}_{self.optimizer}_bench-{'on' if self.cudnn_benchmark else 'off'}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "options": dict(self.options), "name": self.name}, sort_keys=True)


def is_convolutional(workload: str) -> bool:
    """A workload whose training runs cuDNN convolutions (the CNNs uvmlab ships and named vision models)."""
    return workload in CONV_WORKLOADS or workload.startswith(("torchvision:", "timm:"))


def default_cases() -> tuple[MemoryCase, ...]:
    """resnet50, vgg16, convnext_tiny (batch 32 and 64) and gpt2 (batch 4 and 8), SGD and Adam; the CNNs with
    ``cudnn.benchmark`` off and on (gpt2 has no convolution: off only)."""
    workloads = {
        "resnet50": (32, 64),
        "torchvision:vgg16": (32, 64),
        "torchvision:convnext_tiny": (32, 64),
        "gpt2": (4, 8),
    }
    cases = []
    for w, batches in workloads.items():
        for b in batches:
            for opt in ("sgd", "adam"):
                for bench in (False, True) if is_convolutional(w) else (False,):
                    cases.append(MemoryCase(w, b, opt, bench))
    return tuple(cases)


DEFAULT_CASES = default_cases()


def parse_workloads(specs: tuple[str, ...]) -> tuple[MemoryCase, ...]:
    """``NAME:B1,B2`` (or ``NAME`` for batch sizes 32 and 64) into cases, as :func:`default_cases` makes them."""
    cases = []
    for spec in specs:
        name, sep, batches = spec.rpartition("@") if "@" in spec else (spec, "", "")
        if not sep:
            name, batches = spec, "32,64"
        try:
            sizes = tuple(int(b) for b in batches.split(",") if b)
        except ValueError:
            raise InputError(f"--workload {spec!r}: give NAME or NAME@B1,B2 (whole batch sizes)") from None
        if not name or not sizes or min(sizes) < 1:
            raise InputError(f"--workload {spec!r}: give NAME or NAME@B1,B2 (whole batch sizes)")
        for b in sizes:
            for opt in ("sgd", "adam"):
                for bench in (False, True) if is_convolutional(name) else (False,):
                    cases.append(MemoryCase(name, b, opt, bench))
    return tuple(cases)


@dataclass(frozen=True)
class CollectOptions:
    """What ``uvmlab collect`` measures (the CLI's flags)."""

    what: tuple[str, ...] = WHAT
    cases: tuple[MemoryCase, ...] = DEFAULT_CASES
    factors: tuple[float, ...] = DEFAULT_FACTORS
    allow_oversubscription: bool = False
    kernels: tuple[str, ...] = ("seq_stream", "rand_stream")
    stream_iterations: int = 5
    gcn: bool = True
    gcn_factors: tuple[float, ...] | None = None
    """Factors of the GCN runs (None: ``factors``)."""
    gcn_chunk_edges: int = 2_000_000
    gcn_epochs: int = 3
    link_sizes: tuple[int, ...] = ()
    """Microbenchmark transfer sizes (empty: uvmlab.measure.gpu.microbench.DEFAULT_SIZES)."""
    gpu: str = "A100-80GB"
    """The GPU a plan assumes where none is detected (the dry run on a machine without a GPU)."""
    python: str = field(default_factory=lambda: sys.executable)
    nsys_path: str = "nsys"
    nsys: bool | None = None
    """Run the streams under nsys: None = when nsys is on PATH."""
    cudart: str | None = None
    """CUDA runtime for the link step's host-bound prefetch (``UVMLAB_CUDART``); None: the one the
    nvidia-cuda-runtime wheel installed (uvmlab.measure.gpu.cudart)."""
    dry_run: bool = False
    force: bool = False
    budget_s: float | None = DEFAULT_BUDGET_S
    """Seconds the whole collection may take (None: no budget, every step)."""
    caps: Mapping[str, float] = field(default_factory=dict)
    """Time caps (seconds) by step name instead of the planned ones (a step known to be slower here; tests)."""
    resume: bool = False
    """Skip the steps a previous collection into the same folder finished; run the rest."""
    run_workload: tuple[str, int] = ("resnet50", 64)
    """The ``run`` set's job (workload, batch size), at factor :data:`RUN_FACTOR` with a baseline."""

    def __post_init__(self) -> None:
        if self.budget_s is not None and not self.budget_s > 0:
            raise InputError(f"--budget must be a number of seconds > 0, not {self.budget_s:g}")
        if self.resume and self.force:
            raise InputError("give --resume (keep finished steps) or --force (run every step again), not both")
        bad = [w for w in self.what if w not in WHAT]
        if bad or not self.what:
            raise InputError(f"--what takes a comma list of {', '.join(WHAT)}, not {','.join(self.what) or 'nothing'}")
        every = (*self.factors, *(self.gcn_factors or ()))
        if not self.factors or any(not f > 0 for f in every):
            raise InputError(f"factors must be > 0 (fractions of the free GPU memory), not {list(every)}")
        over = [f for f in every if f > MAX_SAFE_FACTOR]
        if over and not self.allow_oversubscription:
            raise InputError(
                f"factor {over[0]:g} asks for more than {MAX_SAFE_FACTOR:g} of the GPU's free memory, which can stall "
                "or fail other jobs on a shared GPU; pass --allow-oversubscription on a GPU you have to yourself"
            )


@dataclass(frozen=True)
class KitStep:
    """One step of the kit: the command (a GPU-run Step), the data set it feeds, its estimated duration and time
    cap, its value rank, what it settles (and what needs nsys elsewhere), its output folder (the argv writes into
    ``output + STAGING_SUFFIX``)."""

    step: Step
    what: str
    seconds: float
    output: str
    cap_s: float = 600.0
    value: int = 1000
    settles: str = ""
    needs_nsys: str = ""

    @property
    def staging(self) -> str:
        return self.output + STAGING_SUFFIX


@dataclass(frozen=True)
class KitPlan:
    """Everything ``uvmlab collect`` will do."""

    out: Path
    steps: tuple[KitStep, ...]
    gpu_name: str
    gpu_source: str
    total_bytes: int
    free_bytes: int
    factors: tuple[float, ...]
    nsys: bool
    notes: tuple[str, ...] = ()
    budget_s: float | None = None
    left_out: tuple[KitStep, ...] = ()
    """Candidates the budget left out, in value order."""
    spec_name: str = ""
    """The GPU spec the estimates use (uvmlab.gpus)."""

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


GCN_EDGES_PER_NODE = 21
"""Edges of the symmetrised graph per node (10 random edges each way plus a self loop: workloads/files/gcn.py)."""


@functools.lru_cache(maxsize=64)
def gcn_peak_bytes(nodes: int, chunk_edges: int) -> int:
    """Simulated peak allocated bytes of ``workloads/files/gcn.py`` at ``nodes`` as ``uvmlab run FILE --pca off``
    prepares it (every tensor its own managed range)."""
    from uvmlab.uvm.simulate import prepare, shipped_config

    cfg = shipped_config("gcn", {"nodes": nodes, "chunk_edges": chunk_edges}, "RTX5090", iterations=2)
    return int(prepare(cfg).placement.peak_allocated_bytes)


def gcn_nodes_for(target_bytes: int, chunk_edges: int) -> int | None:
    """The largest node count (a multiple of 1,000) whose simulated GCN footprint (:func:`gcn_peak_bytes`) is at most
    ``target_bytes``; None when even 1,000 nodes need more (the chunk temporaries alone).

    Once a chunk holds ``chunk_edges`` edges (``21 x nodes >= chunk_edges``, node count ``n1``) every tensor the
    file allocates is either fixed (the chunk temporaries, the two layers and Adam's state) or proportional to the
    node count, so the footprint is affine in it: the traces at ``n1`` and ``2 n1`` give the line (the same for
    every factor of a plan) and the answer is read off it [approximation: allocation rounding, under 1 KiB a tensor;
    tests/test_gpu_collect.py checks the line against a third trace; the step records the real peak]. Below ``n1``
    the chunk grows with the graph and the count is bisected to 1 %."""
    lo = 1_000
    if gcn_peak_bytes(lo, chunk_edges) > target_bytes:
        return None
    n1 = max(lo, -(-chunk_edges // GCN_EDGES_PER_NODE) // 1_000 * 1_000 + 1_000)
    p1 = gcn_peak_bytes(n1, chunk_edges)
    if p1 > target_bytes:  # inside the region where the chunk grows with the graph
        hi = n1
        while hi - lo > max(1_000, lo // 100):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if gcn_peak_bytes(mid, chunk_edges) <= target_bytes else (lo, mid)
        return lo // 1_000 * 1_000
    per_node = (gcn_peak_bytes(2 * n1, chunk_edges) - p1) / n1
    return n1 if per_node <= 0 else int(n1 + (target_bytes - p1) / per_node) // 1_000 * 1_000


RUN_FACTOR = 0.75
"""The ``run`` set's factor: UVM capacity M / 0.75 > M, so nothing is evicted and nothing is oversubscribed."""
FIRST_RUN_ORDER = (
    "facts",
    "probe",
    "memory-torchvision-vgg16_b64_sgd_bench-off",
    "cudnn-torchvision-vgg16_b64_sgd_bench-off",
    "memory-resnet50_b64_sgd_bench-off",
    "link",
    "run",
    "memory-torchvision-vgg16_b64_sgd_bench-on",
    "uvm-streams",
    "uvm-export",
    "cudnn-resnet50_b64_sgd_bench-off",
)
"""Value order of the candidate steps (the rest follow in plan order): the open questions of docs/gpu.md ("What each
step settles"), the ImageNet CNN gap of the memory estimator and the shim/balloon first (issue 43)."""
MIN_STEP_S = 20.0
"""A step is not started with less of the budget left (it could not finish anything) [I]."""


def cap_seconds(estimate: float) -> float:
    """A step's time cap: 1.5 x its estimate, at least 30 s more, at most one command's 10 minutes."""
    return float(min(600.0, max(estimate + 30.0, 1.5 * estimate)))


def estimate_seconds(kind: str, spec: Any, **kw: Any) -> float:
    """Estimated wall seconds of one step on the GPU ``spec`` (uvmlab.gpus.GpuSpec) [I: the constants above, not
    measured on a GPU]. ``kind``: facts, probe, memory, cudnn, link, run, streams, export, gcn."""
    if kind == "facts":
        return 20.0
    if kind == "probe":
        return STARTUP_S + 30.0
    if kind in ("memory", "cudnn"):
        log = 10.0 if kind == "cudnn" else 0.0
        return STARTUP_S + BUILD_S + kw["iterations"] * ITERATION_S + SNAPSHOT_S[kw["snapshot"]] + log
    if kind == "run":
        return RUN_STEP_S
    if kind == "link":
        sizes = sum(kw["sizes"]) * kw["repeats"]
        fill = sizes * 4 / HOST_FILL_BYTES_PER_S  # every kind but touch_fresh writes its buffer on the host first
        moved = sizes * 6 / spec.link_bytes_per_s
        return 10.0 + fill + moved + 0.01 * 6 * len(kw["sizes"]) * kw["repeats"]  # gates of 10 ms
    if kind == "streams":
        free, iters = kw["free"], kw["iterations"]
        t = 10.0
        for f in kw["factors"]:
            w = f * free
            per_kernel = w / 2 / HOST_FILL_BYTES_PER_S + w / 2 / spec.link_bytes_per_s + (2 + iters) * w / 2e12
            t += len(kw["kernels"]) * per_kernel
        return t
    if kind == "export":
        return 60.0
    if kind == "gcn":
        from uvmlab.measure.gpu.kit.sizing import GCN_EPOCH_S_PER_GB

        return STARTUP_S + 15.0 + kw["epochs"] * GCN_EPOCH_S_PER_GB * kw["footprint_bytes"] / 1e9
    raise InputError(f"unknown kit step kind {kind!r}")


def _memory_info(status: GpuStatus, opts: CollectOptions) -> tuple[str, str, int, int]:
    """(name, source, total, free) of the GPU to plan for."""
    if status.available and status.memory_bytes:
        free = status.free_bytes if status.free_bytes is not None else status.memory_bytes
        return status.name or "GPU", "detected", status.memory_bytes, free
    from uvmlab.gpus import get_gpu

    spec = get_gpu(opts.gpu)
    return spec.name, "assumed", spec.memory_bytes, spec.memory_bytes - spec.context_bytes


def _spec_for(status: GpuStatus, opts: CollectOptions) -> Any:
    """The GpuSpec the estimates use: the detected GPU's when uvmlab knows it, else ``--gpu``'s."""
    from uvmlab.gpus import GPUS, get_gpu, known_gpu

    name = known_gpu(status.name) if status.available else None
    return GPUS[name] if name else get_gpu(opts.gpu)


SETTLES = {
    "facts": (
        "which runtime (gVisor or Firecracker), kernel, driver, HMM/ATS attributes, UVM module parameters, tools "
        "present, and whether the worker's imports work",
        "all of it: no profiler needed",
    ),
    "probe": (
        "whether the shim interposes PyTorch's allocations (pointer type managed), whether the balloon holds, "
        "whether touched managed memory lowers cudaMemGetInfo free and freed memory comes back, the non-UVM "
        "growth after the balloon, the hint calls' codes on managed and device memory against the stub's",
        "all of it: CUDA calls and cudaMemGetInfo only",
    ),
    "memory": (
        "per-layer memory snapshot (segments, blocks, Python frames), PyTorch's and NVML's peaks: the ImageNet CNN "
        "gap of the memory estimator (docs/estimate.md)",
        "all of it",
    ),
    "cudnn": (
        "which cuDNN engine each convolution runs and its workspace (API log + C++ frames of the allocations)",
        "all of it",
    ),
    "link": (
        "host-device link rate by transfer size and the per-block fault service cost (device-timed events)",
        "fault counts and batch sizes per pass need nsys (not on the lent machine): elsewhere",
    ),
    "run": (
        "the GPU run path end to end at factor 0.75 (no eviction): balloon after the warm-up, capacity probe, "
        "effective factor, the same cuDNN engines in baseline and run, slowdown vs native",
        "fault and migration counts of the run need nsys: elsewhere",
    ),
    "streams": (
        "the cold first launch (HtoD migration of the host-written input, first-touch zero-fill of the output) and "
        "the resident speed of uvmbench's page-strided kernels, below the free memory (no eviction)",
        "per-pass fault records and their order (rand vs seq arrival) need nsys: elsewhere",
    ),
    "export": ("the streams' nsys export", "needs nsys"),
    "gcn": (
        "the GCN's epoch time under UVM (no eviction) and natively on this GPU: whether the RTX 5090 profile's "
        "constants transfer",
        "fault counts need nsys: elsewhere",
    ),
}
"""What each kind of step settles on the lent machine, and what needs nsys elsewhere (docs/gpu.md's table)."""


def plan_collect(
    opts: CollectOptions, out: Path | str, *, status: GpuStatus | None = None, nsys_available: bool | None = None
) -> KitPlan:
    """The kit's steps for ``opts`` into ``out`` (reads, never writes; nothing is started)."""
    from uvmlab.measure.gpu import shim as shim_mod
    from uvmlab.measure.gpu.cudart import CUDART_ENV
    from uvmlab.measure.gpu.kit.cudnn_log import DEST_ENV, LOG_ENV

    status = gpu_status() if status is None else status
    out = Path(out)
    raw = out / "raw"
    name, source, total, free = _memory_info(status, opts)
    spec = _spec_for(status, opts)
    notes: list[str] = []
    if source == "assumed":
        notes.append(
            f"no GPU here ({status.reason}); this plan assumes the {name} with {format_bytes(free)} free "
            "(on the GPU each step measures the free memory itself and sizes its managed memory from it)"
        )
    if nsys_available is None:
        nsys_available = shutil.which(opts.nsys_path) is not None
    use_nsys = nsys_available if opts.nsys is None else opts.nsys
    py = (opts.python, "-m")
    base = {"CUDA_DEVICE_ORDER": DEVICE_ORDER, "PYTHONUNBUFFERED": "1"}
    cudart_env = {CUDART_ENV: opts.cudart} if opts.cudart else {}
    steps: list[KitStep] = []

    def staged(d: Path) -> str:
        return str(d) + STAGING_SUFFIX

    def add(
        name_: str,
        what: str,
        argv: tuple[str, ...],
        env: dict[str, str],
        out_dir: Path,
        desc: str,
        kind: str,
        seconds: float,
    ) -> None:
        settles, nsys_note = SETTLES[kind]
        steps.append(
            KitStep(
                Step(name_, argv, {**base, **env}, str(out), desc),
                what,
                round(seconds, 1),
                str(out_dir),
                cap_seconds(seconds),
                settles=settles,
                needs_nsys=nsys_note,
            )
        )

    if "facts" in opts.what:
        d = raw / "facts"
        argv = (*py, "uvmlab.measure.gpu.kit.facts_step", staged(d))
        add(
            "facts",
            "facts",
            argv,
            cudart_env,
            d,
            "the machine: runtime, driver, attributes, tools",
            "facts",
            estimate_seconds("facts", spec),
        )
    if "probe" in opts.what:
        d = raw / "probe"
        library = str(shim_mod.shim_path())
        env = {
            **shim_mod.shim_env(library, mode="managed", balloon_defer=True, alloc_log=staged(d) + "/probe.alloc.bin"),
            **cudart_env,
        }
        argv = (*py, "uvmlab.measure.gpu.kit.probe_step", staged(d))
        add(
            "probe",
            "probe",
            argv,
            env,
            d,
            "the shim and UVM on this runtime (interposition, balloon, residency)",
            "probe",
            estimate_seconds("probe", spec),
        )
    if "memory" in opts.what:
        for c in opts.cases:
            d = raw / "memory" / c.name
            argv = (*py, "uvmlab.measure.gpu.kit.memory_step", staged(d), "--case", c.to_json(), "--snapshot", "python")
            add(
                f"memory-{c.name}",
                "memory",
                argv,
                {},
                d,
                f"{c.iterations} iterations of {c.name}",
                "memory",
                estimate_seconds("memory", spec, iterations=c.iterations, snapshot="python"),
            )
    if "cudnn" in opts.what:
        seen: set[str] = set()
        for c in opts.cases:
            if not is_convolutional(c.workload):
                continue
            one = MemoryCase(c.workload, c.batch_size, "sgd", c.cudnn_benchmark, 1, c.options)
            if one.name in seen:
                continue
            seen.add(one.name)
            d = raw / "cudnn" / one.name
            env = {**LOG_ENV, DEST_ENV: staged(d) + "/cudnn.log", **SYMBOLIZE_ENV}
            argv = (*py, "uvmlab.measure.gpu.kit.memory_step", staged(d), "--case", one.to_json(), "--snapshot", "all")
            add(
                f"cudnn-{one.name}",
                "cudnn",
                argv,
                env,
                d,
                f"one iteration of {one.name}, cuDNN API log on",
                "cudnn",
                estimate_seconds("cudnn", spec, iterations=1, snapshot="all"),
            )
    if "link" in opts.what:
        from uvmlab.measure.gpu.microbench import DEFAULT_SIZES

        d = raw / "link"
        argv = (*py, "uvmlab.measure.gpu.kit.link_step", staged(d))
        if opts.link_sizes:
            argv = (*argv, "--sizes", ",".join(str(s) for s in opts.link_sizes))
        if opts.allow_oversubscription:
            argv = (*argv, "--factors", ",".join(f"{f:g}" for f in OVERSUB_LINK_FACTORS))
        else:
            notes.append(
                "link: the oversubscribed touch rows need --allow-oversubscription (prefetch and touch rows run)"
            )
        sizes = opts.link_sizes or DEFAULT_SIZES
        add(
            "link",
            "link",
            argv,
            cudart_env,
            d,
            "prefetch bandwidth by size and page-touch costs (microbenchmarks)",
            "link",
            estimate_seconds("link", spec, sizes=sizes, repeats=3),
        )
    if "run" in opts.what:
        workload, batch = opts.run_workload
        d = raw / "run" / f"{re.sub(r'[^A-Za-z0-9]+', '-', workload)}_b{batch}_x{RUN_FACTOR:g}"
        argv = (
            *py,
            "uvmlab.measure.gpu.kit.run_step",
            staged(d),
            "--workload",
            workload,
            "--batch-size",
            str(batch),
            "--oversub",
            f"{RUN_FACTOR:g}",
        )
        add(
            "run",
            "run",
            argv,
            {},
            d,
            f"uvmlab run {workload} --oversub {RUN_FACTOR:g} --baseline, sized from the measured free memory",
            "run",
            estimate_seconds("run", spec),
        )
    if "uvm" in opts.what:
        d = raw / "uvm" / "streams"
        argv: tuple[str, ...] = (
            *py,
            "uvmlab.measure.gpu.kit.uvm_step",
            staged(d),
            "--factors",
            ",".join(f"{f:g}" for f in opts.factors),
            "--kernels",
            ",".join(opts.kernels),
            "--iterations",
            str(opts.stream_iterations),
        )
        if use_nsys:
            argv = (opts.nsys_path, "profile", *NSYS_PROFILE_FLAGS, "-o", staged(d) + "/streams", *argv)
        add(
            "uvm-streams",
            "uvm",
            argv,
            {},
            d,
            "uvmbench streams (seq, rand) at the factors of the free memory",
            "streams",
            estimate_seconds(
                "streams",
                spec,
                free=free,
                factors=opts.factors,
                kernels=opts.kernels,
                iterations=opts.stream_iterations,
            ),
        )
        if use_nsys:
            e = raw / "uvm" / "streams-export"
            export = ("export", "--type", "sqlite", "--force-overwrite", "true", "-o", staged(e) + "/streams.sqlite")
            add(
                "uvm-export",
                "uvm",
                (opts.nsys_path, *export, str(d / "streams.nsys-rep")),
                {},
                e,
                "SQLite export of the streams' report",
                "export",
                estimate_seconds("export", spec),
            )
        else:
            notes.append(
                f"{opts.nsys_path} is not on PATH: the streams run without nsys (no fault or migration records)"
            )
        if opts.gcn:
            from uvmlab.measure.gpu.kit.sizing import managed_limit

            library = str(shim_mod.shim_path())
            for f in opts.factors if opts.gcn_factors is None else opts.gcn_factors:
                footprint = min(int(f * free), managed_limit(free))
                for variant in ("uvm", "native"):
                    gd = raw / "uvm" / "gcn" / f"{variant}-f{f:g}"
                    secs = estimate_seconds("gcn", spec, epochs=opts.gcn_epochs, footprint_bytes=footprint)
                    cap = cap_seconds(secs)
                    common = (
                        "--fraction-of-free",
                        f"{f:g}",
                        "--max-seconds",
                        f"{cap:g}",
                        "--epochs",
                        str(opts.gcn_epochs),
                        "--chunk-edges",
                        str(opts.gcn_chunk_edges),
                    )
                    env: dict[str, str] = {}
                    if variant == "uvm":
                        shim = shim_mod.shim_env(library, mode="managed", alloc_log=staged(gd) + "/gcn.alloc.bin")
                        env = {**shim, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
                    argv = (*py, "uvmlab.measure.gpu.kit.gcn", staged(gd), *common, "--variant", variant)
                    desc = (
                        f"GCN at factor {f:g} of the free memory "
                        + ("under UVM (every tensor its own managed range)" if variant == "uvm" else "natively")
                        + "; node count from the measured free memory, the sizing margin and the time cap"
                    )
                    add(f"gcn-{variant}-f{f:g}", "uvm", argv, env, gd, desc, "gcn", secs)
    if opts.caps:
        from dataclasses import replace as _replace

        steps = [_replace(k, cap_s=float(opts.caps.get(k.step.name, k.cap_s))) for k in steps]
    ranked = _ranked(steps)
    chosen, left = select_steps(ranked, opts.budget_s)
    if left:
        notes.append(
            f"the budget of {opts.budget_s:g} s leaves out {len(left)} step(s) (value order, estimates): "
            + ", ".join(f"{k.step.name} ~{k.seconds:.0f} s" for k in left[:6])
            + (" ..." if len(left) > 6 else "")
            + "; --budget SECONDS takes more, --resume continues a collection"
        )
    return KitPlan(
        out,
        tuple(chosen),
        name,
        source,
        total,
        free,
        tuple(opts.factors),
        use_nsys,
        tuple(notes),
        opts.budget_s,
        tuple(left),
        spec.name,
    )


def _ranked(steps: list[KitStep]) -> list[KitStep]:
    """The steps with their value rank (:data:`FIRST_RUN_ORDER` first, then plan order), in that order."""
    from dataclasses import replace

    order = {n: i for i, n in enumerate(FIRST_RUN_ORDER)}
    ranked = [replace(k, value=order.get(k.step.name, len(order) + i)) for i, k in enumerate(steps)]
    return sorted(ranked, key=lambda k: k.value)


def select_steps(ranked: list[KitStep], budget_s: float | None) -> tuple[list[KitStep], list[KitStep]]:
    """(chosen, left out): the steps in value order whose estimates fit ``budget_s`` (None: all). A step that does
    not fit is left out and cheaper later ones are still taken; an export step only with its streams."""
    if budget_s is None:
        return list(ranked), []
    chosen: list[KitStep] = []
    left: list[KitStep] = []
    used = 0.0
    names: set[str] = set()
    for k in ranked:
        needs_streams = k.step.name == "uvm-export" and "uvm-streams" not in names
        if used + k.seconds <= budget_s and not needs_streams:
            chosen.append(k)
            names.add(k.step.name)
            used += k.seconds
        else:
            left.append(k)
    return chosen, left


def format_kit_plan(plan: KitPlan) -> str:
    """The dry run's text: the GPU, the memory rule, the budget table (estimate, cap, what each step settles), every
    step with its paste-able command."""
    from uvmlab.measure.gpu.kit.sizing import MARGIN_BYTES, MARGIN_FRACTION, WORST_UNDERESTIMATE

    lines = [
        f"GPU: {plan.gpu_name} ({plan.gpu_source}), {format_bytes(plan.total_bytes)} total, "
        f"{format_bytes(plan.free_bytes)} free; estimates on the {plan.spec_name} spec [not measured]",
        f"managed memory: each step measures the free memory F when it starts and holds at most F - max("
        f"{MARGIN_FRACTION:.0%} of F, {format_bytes(MARGIN_BYTES)}); an estimated footprint counts as estimate / "
        f"{1 - WORST_UNDERESTIMATE:.3f} (the estimator's worst known miss, -{WORST_UNDERESTIMATE:.1%})",
        f"factors of the free memory: {', '.join(f'{f:g}' for f in plan.factors)} (above {MAX_SAFE_FACTOR:g} only "
        "with --allow-oversubscription)",
        f"nsys: {'yes (streams profiled with the UM flags)' if plan.nsys else 'no'}",
        f"output: {plan.out} (validate with: uvmlab validate {shlex.quote(str(plan.out))})",
    ]
    for n in plan.notes:
        lines.append(f"note: {n}")
    budget = f"{plan.budget_s:g} s" if plan.budget_s is not None else "none"
    lines.append(f"budget: {budget}; steps in value order (estimate and time cap in seconds):")
    lines.append(f"  {'#':>2}  {'step':<46} {'est':>5} {'cap':>5}  settles")
    for i, ks in enumerate(plan.steps, 1):
        lines.append(f"  {i:>2}  {ks.step.name:<46} {ks.seconds:>5.0f} {ks.cap_s:>5.0f}  {ks.settles}")
        lines.append(f"  {'':>2}  {'':<46} {'':>5} {'':>5}  settled without nsys: {ks.needs_nsys}")
    for ks in plan.steps:
        lines.append(f"{ks.step.name} [{ks.what}, ~{ks.seconds:.0f} s, cap {ks.cap_s:.0f} s]: {ks.step.description}")
        lines.append(f"  {shell_command(ks.step)}")
    by = {w: sum(s.seconds for s in plan.steps if s.what == w) for w in WHAT}
    parts = ", ".join(f"{w} {by[w]:.0f} s" for w in WHAT if by[w])
    fits = "" if plan.budget_s is None else f" (budget {plan.budget_s:g} s)"
    lines.append(f"{len(plan.steps)} steps, estimates sum to {plan.seconds:.0f} s{fits}: {parts} [rough estimate]")
    return "\n".join(lines) + "\n"
