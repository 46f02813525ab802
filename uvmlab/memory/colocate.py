"""Collocation (CARMA, seeds/002): do several training jobs fit on one GPU together, and if not, what would UVM
oversubscription cost them?

Verdict (CARMA section 2.4 / 3.1): the jobs fit when

    sum over jobs of (simulated peak reserved bytes + one CUDA context) + margin <= GPU memory

with CARMA's 2 GiB safety margin against fragmentation-induced OOMs (``DEFAULT_MARGIN_BYTES``) and one CUDA
context per job (each process has its own), by the rule ``uvmlab estimate`` uses
(``uvmlab.memory.estimate.job_context``:
the modelled context and modules of uvmlab.memory.devicemem, by GPU and whether the job runs convolutions; a GpuSpec
with
an explicit ``context_bytes`` keeps it).

UVM cost (when they do not fit): every job's allocator segments become managed ranges (``cudaMallocManaged``
instead of ``cudaMalloc``, the seed study's setup) on ONE simulated GPU (``uvmlab.sim.uvm.driver.UvmSim``) whose
capacity is the GPU memory minus the jobs' contexts. The jobs' kernels are interleaved round-robin, one kernel
per job per turn (a model of time-slicing between processes: real GPUs switch between contexts by time slice,
not per kernel; documented in docs/colocate.md); each job's allocations and frees happen in its own order between
its kernels. As in ``uvmlab run`` (uvmlab.sim.uvm.replay), setup/data kernels that only write inputs and
parameters are the retained host-to-device copies (``UvmSim.memcpy_htod``). Each job is also simulated alone on
the whole GPU. Per job we report faults, migrations and the predicted UVM slowdown
``(compute + stall colocated) / (compute + stall alone)``, where compute is the native kernel time
(``uvmlab.sim.uvm.timing.kernel_time_ns``) and stall the fault-servicing time the simulator charges; "alone" is also
under UVM, so first-touch faults cancel. ``slowdown_vs_native = (compute + stall colocated) / compute`` compares
with every page resident (the seed study's baseline). The time the jobs wait for each other's kernels
(time-slicing) is part of neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.config import WorkloadConfig, compute_dtype
from uvmlab.errors import InputError
from uvmlab.gpus import GpuSpec
from uvmlab.memory.estimate import CARMA_PLACEMENT_MARGIN_MB
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.units import MiB

DEFAULT_MARGIN_BYTES = CARMA_PLACEMENT_MARGIN_MB * MiB
"""CARMA's safety margin added to the memory requirements (seeds/002 section 3.1: 'We add a 2GB safety margin'): the
placement margin ``uvmlab estimate --format carma`` names (uvmlab.memory.estimate.CARMA_PLACEMENT_MARGIN_MB)."""


def parse_job(text: str, base: WorkloadConfig | None = None) -> WorkloadConfig:
    """``NAME[:BATCH][,KEY=VALUE...]`` -> WorkloadConfig; other fields from ``base``.

    Examples: ``gpt2:8``, ``resnet50:32``, ``my_model.py:4``, ``resnet50:8,image_size=64`` (per-job workload
    options, JSON values, merged over the shared ``--option`` ones).
    """
    from uvmlab.files.inputs import parse_options, short
    from uvmlab.numbers import parse_int

    head, *pairs = text.split(",")
    name, sep, batch = head.rpartition(":")
    if not sep or not batch.isdigit():
        name, batch = head, ""
    if not name:
        raise InputError(f"job {short(text)}: give a workload name, optionally with a batch size, e.g. gpt2:8")
    kw: dict[str, Any] = {} if base is None else base.to_dict()
    kw.pop("workload", None)
    if batch:
        kw["batch_size"] = parse_int(batch, f"job {short(head)}: the batch size", lo=1)
    if pairs:
        kw["options"] = {**kw.get("options", {}), **parse_options(tuple(pairs))}
    return WorkloadConfig(workload=name, **kw)


@dataclass
class Job:
    """One job: its config, its CUDA-level trace and its allocator placement."""

    name: str
    cfg: WorkloadConfig | None
    trace: Trace
    placement: Any
    notes: list[str] = field(default_factory=list)

    @property
    def peak_reserved_bytes(self) -> int:
        return int(self.placement.peak_reserved_bytes)


def prepare_job(
    name: str, trace: Trace, gpu: GpuSpec, allocator: str = "pca", cfg: WorkloadConfig | None = None
) -> Job:
    """Orchestrate ``trace`` for CUDA (workspaces) and place it with ``allocator``."""
    from uvmlab.sim.allocator.placement import place
    from uvmlab.trace.orchestrate import to_cuda

    trace = to_cuda(trace, gpu)
    return Job(name, cfg, trace, place(trace, allocator), [])


@dataclass
class _Stream:
    """A job's events in order: ('map', rid, size) / ('unmap', rid) / ('kernel', kid, accesses, flops, bytes) /
    ('copy', kid, written accesses)."""

    events: list[tuple]
    pos: int = 0


def _job_stream(job: Job, range_base: int) -> _Stream:
    # the retained-copy rule of `uvmlab run` (one definition: uvmlab.sim.uvm.replay)
    from uvmlab.sim.uvm.replay import copy_kernels

    p = job.placement
    ranges = p.ranges
    blocks = p.blocks.set_index("alloc_id")
    rng_addr = dict(zip(ranges["range_id"].astype(int), ranges["address"].astype(int), strict=True))
    ev: list[tuple[int, int, tuple]] = []
    end = int(job.trace.kernels["seq"].max()) + 1 if len(job.trace.kernels) else 0
    for r in ranges.itertuples(index=False):
        rid = range_base + int(r.range_id)
        ev.append((int(r.alloc_seq), 0, ("map", rid, int(r.size_bytes))))
        free_seq = int(r.free_seq)
        if free_seq != NEVER_FREED and free_seq >= 0:
            ev.append((free_seq, 2, ("unmap", rid)))
        end = max(end, int(r.alloc_seq) + 1)
    acc = job.trace.accesses
    acc = acc[acc["alloc_id"].isin(blocks.index)]
    b = blocks.loc[acc["alloc_id"].to_numpy()]
    range_ids = b["range_id"].to_numpy(np.int64)
    offsets = b["address"].to_numpy(np.int64) - np.array([rng_addr[int(x)] for x in range_ids], dtype=np.int64)
    offsets = offsets + acc["offset_bytes"].to_numpy(np.int64)
    per_kernel: dict[int, list[tuple[int, int, int, bool]]] = {}
    for kid, rid, off, size, w in zip(
        acc["kernel_id"].to_numpy(),
        range_ids,
        offsets,
        acc["size_bytes"].to_numpy(),
        acc["is_write"].to_numpy(),
        strict=True,
    ):
        per_kernel.setdefault(int(kid), []).append((range_base + int(rid), int(off), int(size), bool(w)))
    copies = set(copy_kernels(job.trace).tolist())
    for k in job.trace.kernels.itertuples(index=False):
        kid = int(k.kernel_id)
        accs = per_kernel.get(kid, [])
        if kid in copies:  # a retained cudaMemcpy HtoD (uvmlab.sim.uvm.replay): only its writes, as copies
            ev.append((int(k.seq), 1, ("copy", kid, [a for a in accs if a[3]])))
            continue
        nbytes = sum(a[2] for a in accs)
        ev.append((int(k.seq), 1, ("kernel", kid, accs, float(k.flops), nbytes)))
    ev.sort(key=lambda e: (e[0], e[1]))
    return _Stream([e[2] for e in ev])


def simulate_together(
    jobs: list[Job],
    capacity_bytes: int,
    gpu: GpuSpec,
    knobs: Any = None,
    costs: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Run the jobs' kernels round-robin (one kernel per job per turn) on one UvmSim; per-job counters."""
    from uvmlab.sim.uvm.driver import UvmCounters, UvmSim
    from uvmlab.sim.uvm.timing import CostParams, kernel_time_ns

    sim = UvmSim(capacity_bytes, knobs, costs, gpu)
    cost = (costs or CostParams()).for_gpu(gpu)
    streams = [_job_stream(j, (i + 1) * 10**9) for i, j in enumerate(jobs)]
    totals = [UvmCounters() for _ in jobs]
    flops: list[list[float]] = [[] for _ in jobs]
    nbytes: list[list[int]] = [[] for _ in jobs]
    total_kernels = sum(sum(1 for e in s.events if e[0] == "kernel") for s in streams)
    done = 0
    active = list(range(len(jobs)))
    while active:
        for j in list(active):
            s = streams[j]
            ran = False
            while s.pos < len(s.events) and not ran:
                e = s.events[s.pos]
                s.pos += 1
                if e[0] == "map":
                    sim.map_range(e[1], e[2])
                elif e[0] == "unmap":
                    sim.unmap_range(e[1])
                elif e[0] == "copy":
                    for rid, off, size, _w in e[2]:
                        totals[j].add(sim.memcpy_htod(rid, off, size))
                else:
                    totals[j].add(sim.access(e[2]))
                    flops[j].append(e[3])
                    nbytes[j].append(e[4])
                    ran = True
                    done += 1
            if s.pos >= len(s.events):
                active.remove(j)
        if progress:
            progress(done, total_kernels)
    sim.check_invariants()
    rows = []
    for j, job in enumerate(jobs):
        dtype = compute_dtype(job.cfg.dtype if job.cfg is not None else "fp32", job.trace.header)
        compute = float(kernel_time_ns(np.array(flops[j]), np.array(nbytes[j]), gpu, cost, dtype).sum())
        rows.append(
            {"job_index": j, "job": job.name, "compute_ns": compute, "kernels": len(flops[j]), **totals[j].as_dict()}
        )
    return pd.DataFrame(rows)


@dataclass
class Colocation:
    """The verdict table, whether the jobs fit, and (when simulated) the UVM cost per job."""

    gpu: GpuSpec
    margin_bytes: int
    verdict: pd.DataFrame
    fits: bool
    need_bytes: int
    uvm: pd.DataFrame | None = None
    uvm_capacity_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (result.json, ``--format json``)."""
        return {
            "gpu": self.gpu.name,
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "margin_bytes": self.margin_bytes,
            "fits": self.fits,
            "need_bytes": self.need_bytes,
            "jobs": self.verdict.to_dict("records"),
            "uvm_capacity_bytes": self.uvm_capacity_bytes,
            "uvm": None if self.uvm is None else self.uvm.to_dict("records"),
            "notes": self.notes,
        }


def colocate(
    jobs: list[Job],
    gpu: GpuSpec,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    simulate: str = "auto",
    knobs: Any = None,
    costs: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> Colocation:
    """Decide whether ``jobs`` fit on ``gpu`` together; simulate UVM when they do not (``simulate``: auto/yes/no)."""
    if len(jobs) < 1:
        raise InputError("colocate needs at least one job")
    names = [j.name for j in jobs]
    for i, j in enumerate(jobs):  # repeated names (gpt2:8 gpt2:8) get a #n suffix
        if names.count(j.name) > 1:
            j.name = f"{j.name}#{names[: i + 1].count(j.name)}"
    if simulate not in ("auto", "yes", "no"):
        raise InputError(f"simulate must be auto, yes or no, not {simulate!r}")
    if margin_bytes < 0:
        raise InputError("the safety margin cannot be negative")
    from uvmlab.memory.estimate import job_context, required_margin

    ctx = []  # per job: the context rule of uvmlab estimate
    for j in jobs:
        model = job_context(gpu, j.trace)
        ctx.append(gpu.context_bytes if model is None else model.total_bytes)
    rows = []
    for j, c in zip(jobs, ctx, strict=True):  # each job's need: uvmlab estimate's required_mb, by its one rule
        model_margin, rule = required_margin(j.peak_reserved_bytes + c, j.trace)
        need = j.peak_reserved_bytes + c + model_margin
        rows.append(
            {
                "job": j.name,
                "peak_reserved_bytes": j.peak_reserved_bytes,
                "context_bytes": c,
                "model_margin_bytes": model_margin,
                "need_bytes": need,
                "required_mb": -(-need // MiB),
                "margin_rule": rule,
            }
        )
    verdict = pd.DataFrame(rows)
    need = int(verdict["need_bytes"].sum()) + int(margin_bytes)
    fits = need <= gpu.memory_bytes
    result = Colocation(gpu, int(margin_bytes), verdict, fits, need)
    for j in jobs:
        result.notes.extend(f"{j.name}: {n}" for n in j.notes)
    if simulate == "no" or (simulate == "auto" and fits):
        return result
    capacity = gpu.memory_bytes - sum(ctx)
    if capacity <= 0:
        raise InputError(f"{len(jobs)} CUDA contexts ({sum(ctx)} B) leave no memory on {gpu.name}; use fewer jobs")
    together = simulate_together(jobs, capacity, gpu, knobs, costs, progress)
    alone = pd.concat(
        [
            simulate_together([j], gpu.memory_bytes - c, gpu, knobs, costs).assign(job_index=i)
            for i, (j, c) in enumerate(zip(jobs, ctx, strict=True))
        ],
        ignore_index=True,
    )
    uvm = together.merge(
        alone[["job_index", "stall_ns", "fault_count", "htod_bytes", "dtoh_bytes"]],
        on="job_index",
        suffixes=("", "_alone"),
    )
    uvm["slowdown"] = (uvm["compute_ns"] + uvm["stall_ns"]) / (uvm["compute_ns"] + uvm["stall_ns_alone"])
    uvm["slowdown_vs_native"] = (uvm["compute_ns"] + uvm["stall_ns"]) / uvm["compute_ns"]
    result.uvm = uvm
    result.uvm_capacity_bytes = capacity
    return result


def write_colocation(res: Colocation, out: Any, config: dict[str, Any], force: bool = False) -> Any:
    """Write config.json, tables (verdict, uvm) and result.json into ``out``."""
    from uvmlab.files.rundir import RunDir

    rd = RunDir.for_writing(out, force)  # refuses a foreign folder or a complete one without force; locks it
    rd.write_json(rd.config_json, config)
    rd.write_table("verdict", res.verdict)
    if res.uvm is not None:
        rd.write_table("uvm", res.uvm)
    rd.write_json(rd.result_json, res.to_dict())
    rd.release()
    return rd.path


def colocate_workloads(
    job_texts: list[str] | tuple[str, ...],
    gpu: GpuSpec,
    base: WorkloadConfig | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    simulate: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> Colocation:
    """Parse ``NAME[:BATCH][,KEY=VALUE...]`` jobs, trace (cached) and place each, then :func:`colocate`."""
    from uvmlab.trace.cache import get_trace

    say = progress or (lambda _msg: None)
    jobs = []
    for text in job_texts:
        cfg = parse_job(text, base)
        say(f"tracing {text}")
        jobs.append(prepare_job(text, get_trace(cfg), gpu, cfg=cfg))
    say("deciding / simulating UVM")
    return colocate(jobs, gpu, margin_bytes, simulate)
