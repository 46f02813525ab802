"""CLI: ``uvmlab snapshot show`` (read a PyTorch memory snapshot safely) and ``uvmlab estimate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import PathParam, format_option, out_option, workload_config, workload_options
from uvmlab.config import ALLOCATORS, WorkloadConfig
from uvmlab.console import note, plain, print_csv, print_table, say, scalar_rows
from uvmlab.files.atomic import to_json
from uvmlab.gpus import MAX_MEMORY_BYTES
from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS
from uvmlab.units import MiB, format_bytes


@click.group("snapshot")
def snapshot_group() -> None:
    """Read PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles) safely."""


@snapshot_group.command("show")
@click.argument("file", type=PathParam("input", folder=False, dir_okay=False, path_type=str))
@format_option()
def snapshot_show(file: str, fmt: str) -> None:
    """Summarize FILE: format generation, segments, reserved/allocated bytes and trace events per device.

    \b
    Terms:
      format G1..G6   the snapshot layout generation (which keys PyTorch wrote; G4 = PyTorch 2.5+ with
                      external_annotations); the line names the PyTorch versions and the evidence
      segments        cudaMalloc'd ranges the caching allocator holds (reserved memory)
      blocks          pieces of segments: allocated to a tensor, or free and cached
      events          entries of the allocation trace (alloc, free_requested, segment_alloc, ...)
      peak reserved   the highest reserved bytes the trace reaches (replayed from the snapshot's state)

    The pickle is loaded with a restricted unpickler that refuses every global, so nothing in the file runs.
    """
    from uvmlab.trace.snapshot import GENERATIONS, read_snapshot

    snap = read_snapshot(file)
    rows = snap.summary()
    if fmt == "json":
        payload = {
            "path": snap.path,
            "format_generation": snap.format_generation,
            "format_evidence": snap.format_evidence,
            "allocator_settings": snap.allocator_settings,
            "devices": rows,
        }
        click.echo(to_json(payload), nl=False)
        return
    columns = ["device", "segments", "blocks", "reserved", "allocated", "peak reserved (trace)", "events", "actions"]
    if fmt == "csv":
        keys = ["device", "segments", "blocks", "reserved_bytes", "allocated_bytes", "peak_reserved_in_trace_bytes"]
        print_csv(
            (
                "devices",
                [*keys, "events", "actions"],
                [
                    [*(r[k] for k in keys), r["events"], " ".join(f"{k}:{v}" for k, v in r["actions"].items())]
                    for r in rows
                ],
            )
        )
        return
    conf = None if snap.allocator_settings is None else snap.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF")
    gen = snap.format_generation
    say(
        f"{snap.path}\nformat {gen}, the snapshot's layout generation: {GENERATIONS.get(gen, 'unknown')} "
        f"(recognized by: {snap.format_evidence})\nPYTORCH_CUDA_ALLOC_CONF: {conf!r}\n"
    )
    print_table(
        "Snapshot per device",
        columns,
        [
            [
                r["device"],
                r["segments"],
                r["blocks"],
                format_bytes(r["reserved_bytes"]),
                format_bytes(r["allocated_bytes"]),
                format_bytes(r["peak_reserved_in_trace_bytes"]),
                r["events"],
                " ".join(f"{k}:{v}" for k, v in r["actions"].items()),
            ]
            for r in rows
        ],
    )


@click.command("estimate")
@click.argument("workload", type=PathParam("input", maybe_name=True, path_type=str))
@workload_options()
@click.option("--gpu", "gpu_name", default="A100-80GB", show_default=True, help="GPU model (see uvmlab.gpus).")
@click.option("--gpu-memory", default=None, metavar="SIZE", help="Override the GPU's memory, e.g. 80GiB.")
@click.option("--allocator", type=click.Choice(ALLOCATORS), default="pca", show_default=True)
@click.option("--alloc-conf", default="", metavar="STR", help="PYTORCH_CUDA_ALLOC_CONF to simulate.")
@click.option(
    "--margin-mb",
    type=click.IntRange(min=0, max=MAX_MEMORY_BYTES // MiB),
    default=None,
    help="Margin added to required_mb, in MiB (at most 64 TiB, the simulated device range) [default: the coverage "
    "rule of uvmlab.memory.intervals, docs/estimate.md].",
)
@click.option("--module-loading", type=click.Choice(["lazy", "eager"]), default="lazy", show_default=True,
              help="CUDA module loading of the run (lazy: CUDA_MODULE_LOADING=LAZY, PyTorch's default since 1.13 "
              "with CUDA >= 11.7; eager: older stacks), for the context model.")  # fmt: skip
@click.option("--cudnn-benchmark-trials", "--cudnn-benchmark", "cudnn_benchmark", is_flag=True,
              help="Simulate torch.backends.cudnn.benchmark=True: before the first call of each distinct convolution "
              "PyTorch times every candidate engine with one workspace as large as the largest candidate's, which the "
              "caching allocator keeps (docs/estimate.md).")  # fmt: skip
@click.option("--cudnn-workspace-model", type=click.Choice(WORKSPACE_MODELS), default="envelope", show_default=True,
              help="Per-call cuDNN convolution workspace size: the largest operand capped at 256 MiB (envelope), "
              "or the buffers of one cuDNN algorithm family (docs/estimate.md).")  # fmt: skip
@click.option("--cudnn-workspace-range", is_flag=True, help="Also estimate under every workspace model and "
              "report the range of the device peak: what only cuDNN's engine choice could settle.")  # fmt: skip
@click.option("--stack", "stack_file", default=None, metavar="STACK.json",
              type=PathParam("input", folder=False, dir_okay=False),
              help="Fixed costs fitted to your stack (uvmlab calibrate --memory); sets module loading.")  # fmt: skip
@out_option("Write a run directory here.", dest="out_dir", default=None, metavar="DIR")
@click.option("--force", is_flag=True, help="Overwrite a complete run directory (-o) or snapshot (--snapshot).")
@format_option(
    "table, json (the estimate as JSON only), csv (quantity,value rows) or carma (only the required MiB CARMA's "
    "task files take).",
    extra=("carma",),
)
@click.option("--snapshot", "snapshot_out", default=None, type=PathParam("output", folder=False, path_type=str),
              metavar="OUT.pickle", help="Write the simulated run as a PyTorch memory snapshot (open it at "
              "pytorch.org/memory_viz).")  # fmt: skip
@click.option("--max-seq-len", "fit_seq", is_flag=True, help="Find the longest sequence that fits the GPU (a multiple "
              "of --seq-len-step) and estimate at it (docs/estimate.md).")  # fmt: skip
@click.option("--seq-len-step", type=int, default=64, show_default=True, metavar="N",
              help="Granularity of --max-seq-len in tokens.")  # fmt: skip
def estimate_cmd(
    workload: str,
    gpu_name: str,
    gpu_memory: str | None,
    allocator: str,
    alloc_conf: str,
    margin_mb: int | None,
    module_loading: str,
    cudnn_benchmark: bool,
    cudnn_workspace_model: str,
    cudnn_workspace_range: bool,
    stack_file: str | None,
    out_dir: str | None,
    force: bool,
    fmt: str,
    snapshot_out: str | None,
    fit_seq: bool,
    seq_len_step: int,
    **kw: Any,
) -> None:
    """Estimate the peak GPU memory of training WORKLOAD on a GPU, on this CPU (no GPU needed).

    Captures the workload on the meta device (cached), adds what only CUDA allocates (cuBLAS/cuDNN workspaces),
    simulates the caching allocator (or none) and reports peak reserved/allocated memory, whether it fits
    the GPU (capacity minus the CUDA context), and required_mb (MiB) for a scheduler. --format carma prints
    only the required_mb line CARMA's task files take (CARMA calls these MiB "MB"). Example:

        uvmlab estimate gpt2 --gpu A100-80GB --format json
    """
    from uvmlab.files.rundir import RunDir
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.estimate import (
        CARMA_PLACEMENT_MARGIN_MB,
        estimate,
        snapshot_dicts,
        workspace_range,
        write_estimate,
    )
    from uvmlab.trace.orchestrate import OrchestrationRules

    cfg = workload_config(workload, **kw)
    gpu = get_gpu(gpu_name, gpu_memory)
    stack = None
    if stack_file is not None:
        from uvmlab.memory.stack import load_stack

        stack = load_stack(stack_file)
        module_loading = stack.module_loading
    rundir = None
    if snapshot_out is not None:
        from uvmlab.files.outputs import check_output_file

        check_output_file(snapshot_out, [Path(workload)] if Path(workload).exists() else [], force, "--snapshot")
    if out_dir is not None:
        rundir = RunDir(out_dir)
        rundir.prepare(force=force)
    from uvmlab.console import progress_bar

    with progress_bar() as bar:
        task = bar.add_task("estimating", total=None)

        def capture_progress(done: int, total: int) -> None:
            bar.update(task, description=plain(f"capturing {workload} (first time; cached afterwards)"), completed=done,
                       total=total)  # fmt: skip

        common: dict[str, Any] = {
            "allocator": allocator,
            "alloc_conf": alloc_conf,
            "margin_bytes": None if margin_mb is None else margin_mb * MiB,
            "rules": OrchestrationRules(cudnn_benchmark=cudnn_benchmark, cudnn_workspace_model=cudnn_workspace_model),
            "module_loading": module_loading,
            "stack": stack,
        }
        seq_fit = None
        if fit_seq:
            from uvmlab.memory.fit_seq import max_seq_len

            seq_fit = max_seq_len(cfg, gpu, seq_len_step, lambda msg: bar.update(task, description=plain(msg)),
                                  capture_progress=capture_progress, **common)  # fmt: skip
            est = seq_fit.estimate
            if est is None:
                _no_length_fits(seq_fit, cfg, gpu, fmt)
                return
            cfg = WorkloadConfig(**{**cfg.to_dict(), "options": {**cfg.options, "seq_len": seq_fit.max_seq_len}})
        else:
            est = estimate(
                cfg,
                gpu,
                **common,
                progress=lambda msg: bar.update(task, description=plain(msg)),
                capture_progress=capture_progress,
            )
        if cudnn_workspace_range:
            bar.update(task, description="estimating under every cuDNN workspace model")
            est.cudnn_workspace_range = workspace_range(est, cfg, gpu, **common)
    result = est.to_json()
    if seq_fit is not None:
        result["max_seq_len"] = seq_fit.to_json()
    if snapshot_out is not None:
        from uvmlab.trace.snapshot import write_snapshot

        segments, traces = snapshot_dicts(est)
        write_snapshot(snapshot_out, segments, traces, allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": alloc_conf})
        note(f"Wrote snapshot {snapshot_out} (open at https://pytorch.org/memory_viz)")
    if rundir is not None:
        config = {"workload": cfg.to_dict(), "gpu": gpu.name, "gpu_memory_bytes": gpu.memory_bytes,
                  "module_loading": module_loading, "cudnn_benchmark": cudnn_benchmark,
                  "cudnn_workspace_model": cudnn_workspace_model}  # fmt: skip
        if est.trace is not None:  # the batch actually used (the workload's default when none was given)
            config["used"] = {"batch_size": est.trace.header.get("batch_size")}
        with rundir:  # releases the writer's lock
            write_estimate(est, rundir, {**config, "allocator": allocator, "alloc_conf": alloc_conf})
        note(rundir.summary_line())
    if fmt == "json":
        click.echo(to_json(result), nl=False)
        return
    if fmt == "carma":
        note(
            f"required_mb = peak reserved {format_bytes(est.peak_reserved_bytes)} + CUDA context and modules "
            f"{format_bytes(est.context_bytes)} + margin {format_bytes(est.margin_bytes)} ({est.margin_rule}); "
            f"CARMA adds its own {CARMA_PLACEMENT_MARGIN_MB} MiB at placement (uvmlab colocate: the same rule per job)"
        )
        click.echo(est.carma_text(), nl=False)
        return
    verdict = (
        "fits" if not est.oom else f"OUT OF MEMORY at event {est.oom_seq} ({est.oom_phase}, it {est.oom_iteration})"
    )
    if fmt == "csv":
        print_csv(("estimate", ("key", "value"), scalar_rows(result)))
        return
    print_table(
        f"{cfg.workload} on {gpu.name}, {allocator} allocator",
        ["quantity", "value"],
        [
            *_seq_rows(seq_fit),
            ["peak reserved", format_bytes(est.peak_reserved_bytes)],
            ["peak reached in", f"{est.peak_reserved_phase}, iteration {est.peak_reserved_iteration}"],
            ["peak allocated", format_bytes(est.peak_allocated_bytes)],
            ["peak live tensors (requested)", format_bytes(est.peak_live_bytes)],
            *[[f"  at alloc. peak: {cat}", format_bytes(n)] for cat, n in sorted(est.live_at_allocated_peak.items())],
            ["CUDA context + modules", f"{format_bytes(est.context_bytes)} ({module_loading} module loading)"],
            [
                "device peak (nvidia-smi)",
                f"{format_bytes(est.device_peak_bytes)} ({est.to_json()['device_peak_mb']:,} MiB)",
            ],
            *_interval_rows(est),
            *_range_rows(est),
            ["usable on GPU", format_bytes(est.usable_bytes)],
            ["verdict", verdict],
            ["margin", f"{format_bytes(est.margin_bytes)} ({est.margin_rule})"],
            ["required (required_mb, for a scheduler)", f"{est.required_mb:,} MiB"],
            ["time", f"{est.seconds['total']:.2f} s"],
        ],
    )


COMMANDS = [snapshot_group, estimate_cmd]


def _seq_rows(seq_fit: Any) -> list[list[str]]:
    """The ``--max-seq-len`` rows: the answer and the lengths tried."""
    if seq_fit is None:
        return []
    tried = ", ".join(f"{p['seq_len']:,} {'fits' if p['fits'] else 'no'}" for p in seq_fit.probes)
    return [
        ["longest seq_len that fits", f"{seq_fit.max_seq_len:,} tokens (multiples of {seq_fit.step})"],
        ["  lengths tried", tried],
    ]


def _no_length_fits(seq_fit: Any, cfg: Any, gpu: Any, fmt: str) -> None:
    """``--max-seq-len`` when not even one step fits."""
    if fmt == "json":
        click.echo(to_json({"max_seq_len": seq_fit.to_json(), "fits": False}), nl=False)
        return
    say(f"{cfg.workload} does not fit {gpu.name} even at seq_len {seq_fit.step} (--seq-len-step)\n")


def _interval_rows(est: Any) -> list[list[str]]:
    """The validation-residual interval of the device peak (uvmlab.memory.intervals)."""
    iv = est.interval
    if iv is None:
        return []
    stack = ", with stack calibration" if iv["stack_calibrated"] else ""
    return [
        [
            "  10th-90th percentile",
            f"{format_bytes(iv['p10_bytes'])} to {format_bytes(iv['p90_bytes'])} ({iv['family']} family{stack}; "
            f"{iv['validation_rows']} validation rows)",
        ]
    ]


def _range_rows(est: Any) -> list[list[str]]:
    """Table rows for ``--cudnn-workspace-range``; without it, a pointer to it when cuDNN convolutions run."""
    from uvmlab.memory.estimate import has_cudnn_convolutions

    rng = est.cudnn_workspace_range
    if rng is None:
        if not has_cudnn_convolutions(est):
            return []
        return [["  cuDNN convolutions", "workspaces depend on cuDNN's engine choice: --cudnn-workspace-range"]]
    if len(rng) == 1:
        return [["  over cuDNN workspace models", "no cuDNN convolution: one figure"]]
    lo, hi = min(rng, key=rng.__getitem__), max(rng, key=rng.__getitem__)
    return [
        [
            "  over cuDNN workspace models",
            f"{format_bytes(rng[lo])} ({lo}) to {format_bytes(rng[hi])} ({hi}); "
            + ", ".join(f"{m} {format_bytes(v)}" for m, v in rng.items()),
        ]
    ]
