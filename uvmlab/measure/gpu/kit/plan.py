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

Safety: a factor above :data:`MAX_SAFE_FACTOR` (0.9) of the free memory asks a shared GPU for memory it may not have
(the driver then evicts, and another tenant's job may stall or fail); it is refused unless
``allow_oversubscription`` is set. The default factors never ask for more managed memory than the card has free.
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

WHAT = ("memory", "cudnn", "uvm", "link")
MAX_SAFE_FACTOR = 0.9
"""Largest factor of the free memory asked without ``--allow-oversubscription`` [I]: 10 % of the free memory stays
for the context's growth, the process's other allocations and other tenants."""
DEFAULT_FACTORS = (0.25, 0.5, 0.9)
OVERSUB_LINK_FACTORS = (1.5, 2.0, 4.0)
"""uvmlab.measure.gpu.microbench.DEFAULT_FACTORS: its oversubscribed rows (behind a balloon), with the flag only."""
CONV_WORKLOADS = ("resnet50", "resnet101", "alexnet")
"""Built-in workloads with convolutions; named ``torchvision:``/``timm:`` models count as convolutional too."""
STEP_SECONDS = {"memory": 60.0, "cudnn": 120.0, "streams": 300.0, "gcn": 240.0, "link": 150.0, "export": 120.0}
"""Rough wall seconds per step on a datacenter GPU [I: an estimate for the plan and docs/gpu.md, not measured]."""


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

    def __post_init__(self) -> None:
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
    """One step of the kit: the command (a GPU-run Step), the data set it feeds, a rough duration."""

    step: Step
    what: str
    seconds: float
    output: str


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


def _memory_info(status: GpuStatus, opts: CollectOptions) -> tuple[str, str, int, int]:
    """(name, source, total, free) of the GPU to plan for."""
    if status.available and status.memory_bytes:
        free = status.free_bytes if status.free_bytes is not None else status.memory_bytes
        return status.name or "GPU", "detected", status.memory_bytes, free
    from uvmlab.gpus import get_gpu

    spec = get_gpu(opts.gpu)
    return spec.name, "assumed", spec.memory_bytes, spec.memory_bytes - spec.context_bytes


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
    notes: list[str] = []
    if source == "assumed":
        notes.append(
            f"no GPU here ({status.reason}); this plan assumes the {name} with {format_bytes(free)} free "
            "(on the GPU the steps measure the free memory themselves)"
        )
    if nsys_available is None:
        nsys_available = shutil.which(opts.nsys_path) is not None
    use_nsys = nsys_available if opts.nsys is None else opts.nsys
    py = (opts.python, "-m")
    base = {"CUDA_DEVICE_ORDER": DEVICE_ORDER, "PYTHONUNBUFFERED": "1"}
    steps: list[KitStep] = []

    def add(name_: str, what: str, argv: tuple[str, ...], env: dict[str, str], out_dir: Path, desc: str, kind: str):
        steps.append(
            KitStep(Step(name_, argv, {**base, **env}, str(out), desc), what, STEP_SECONDS[kind], str(out_dir))
        )

    if "memory" in opts.what:
        for c in opts.cases:
            d = raw / "memory" / c.name
            argv = (*py, "uvmlab.measure.gpu.kit.memory_step", str(d), "--case", c.to_json(), "--snapshot", "python")
            add(f"memory-{c.name}", "memory", argv, {}, d, f"{c.iterations} iterations of {c.name}", "memory")
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
            env = {**LOG_ENV, DEST_ENV: str(d / "cudnn.log")}
            argv = (*py, "uvmlab.measure.gpu.kit.memory_step", str(d), "--case", one.to_json(), "--snapshot", "all")
            add(f"cudnn-{one.name}", "cudnn", argv, env, d, f"one iteration of {one.name}, cuDNN API log on", "cudnn")
    if "uvm" in opts.what:
        d = raw / "uvm"
        argv: tuple[str, ...] = (
            *py,
            "uvmlab.measure.gpu.kit.uvm_step",
            str(d),
            "--factors",
            ",".join(f"{f:g}" for f in opts.factors),
            "--kernels",
            ",".join(opts.kernels),
            "--iterations",
            str(opts.stream_iterations),
        )
        if use_nsys:
            argv = (opts.nsys_path, "profile", *NSYS_PROFILE_FLAGS, "-o", str(d / "streams"), *argv)
        add(
            "uvm-streams",
            "uvm",
            argv,
            {},
            d,
            "uvmbench streams (seq, rand) at the factors of the free memory",
            "streams",
        )
        if use_nsys:
            export = ("export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(d / "streams.sqlite"))
            add("uvm-export", "uvm", (opts.nsys_path, *export, str(d / "streams.nsys-rep")), {}, d,
                "SQLite export of the streams' report", "export")  # fmt: skip
        else:
            notes.append(
                f"{opts.nsys_path} is not on PATH: the streams run without nsys (no fault or migration records)"
            )
        if opts.gcn:
            library = str(shim_mod.shim_path())
            for f in opts.factors if opts.gcn_factors is None else opts.gcn_factors:
                nodes = gcn_nodes_for(int(f * free), opts.gcn_chunk_edges)
                if nodes is None:
                    notes.append(f"GCN at factor {f:g}: even 1,000 nodes need more than {format_bytes(f * free)}")
                    continue
                common = ("--nodes", str(nodes), "--epochs", str(opts.gcn_epochs), "--chunk-edges",
                          str(opts.gcn_chunk_edges))  # fmt: skip
                gd = d / "gcn" / "uvm"
                shim = shim_mod.shim_env(library, mode="managed", alloc_log=gd / f"{nodes}.alloc.bin")
                env = {**shim, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
                argv = (*py, "uvmlab.measure.gpu.kit.gcn", str(gd), *common, "--variant", "uvm")
                desc = f"GCN {nodes:,} nodes under UVM (every tensor its own managed range), factor {f:g}"
                add(f"gcn-uvm-{nodes}", "uvm", argv, env, gd, desc, "gcn")
                nd = d / "gcn" / "native"
                argv = (*py, "uvmlab.measure.gpu.kit.gcn", str(nd), *common, "--variant", "native")
                add(f"gcn-native-{nodes}", "uvm", argv, {}, nd, f"GCN {nodes:,} nodes natively", "gcn")
    if "link" in opts.what:
        d = raw / "link"
        argv = (*py, "uvmlab.measure.gpu.kit.link_step", str(d))
        if opts.link_sizes:
            argv = (*argv, "--sizes", ",".join(str(s) for s in opts.link_sizes))
        if opts.allow_oversubscription:
            argv = (*argv, "--factors", ",".join(f"{f:g}" for f in OVERSUB_LINK_FACTORS))
        else:
            notes.append(
                "link: the oversubscribed touch rows need --allow-oversubscription (prefetch and touch rows run)"
            )
        env = {CUDART_ENV: opts.cudart} if opts.cudart else {}
        add("link", "link", argv, env, d, "prefetch bandwidth by size and page-touch costs (microbenchmarks)", "link")
    return KitPlan(out, tuple(steps), name, source, total, free, tuple(opts.factors), use_nsys, tuple(notes))


def format_kit_plan(plan: KitPlan) -> str:
    """The dry run's text: the GPU, the memory rule, every step with its paste-able command, the time it takes."""
    lines = [
        f"GPU: {plan.gpu_name} ({plan.gpu_source}), {format_bytes(plan.total_bytes)} total, "
        f"{format_bytes(plan.free_bytes)} free",
        f"factors of the free memory: {', '.join(f'{f:g}' for f in plan.factors)} (above {MAX_SAFE_FACTOR:g} only "
        "with --allow-oversubscription); each step measures the free memory itself when it starts",
        f"nsys: {'yes (streams profiled with the UM flags)' if plan.nsys else 'no'}",
        f"output: {plan.out} (validate with: uvmlab validate {shlex.quote(str(plan.out))})",
    ]
    for n in plan.notes:
        lines.append(f"note: {n}")
    for i, ks in enumerate(plan.steps, 1):
        lines.append(f"step {i} [{ks.what}, ~{ks.seconds / 60:.0f} min]: {ks.step.name}: {ks.step.description}")
        lines.append(f"  {shell_command(ks.step)}")
    by = {w: sum(s.seconds for s in plan.steps if s.what == w) for w in WHAT}
    parts = ", ".join(f"{w} {by[w] / 60:.0f} min" for w in WHAT if by[w])
    lines.append(f"{len(plan.steps)} steps, about {plan.seconds / 60:.0f} min in all ({parts}) [rough estimate]")
    return "\n".join(lines) + "\n"
