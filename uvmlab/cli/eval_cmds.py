"""CLI: ``uvmlab evaluate`` (xMem metrics), ``uvmlab fragmentation`` (STWeaver), ``uvmlab colocate`` (CARMA)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import PathParam, format_option, job_path, out_option, workload_config, workload_options
from uvmlab.console import err, note, plain, print_csv, print_table, say
from uvmlab.files.atomic import to_json
from uvmlab.units import format_bytes, parse_bytes

ESTIMATOR_NAMES = ("uvmlab-pca", "uvmlab-nocache", "shape-inference", "dnnmem")
PEER_NAMES = ("xmem", "dnnmem-reported", "schedtune")
"""Peers' own published estimates, when the ground truth carries them (xMem's sample)."""
MAX_PER_RUN_ROWS = 40


def _output_rundir(output: str | None, force: bool) -> Any:
    """The prepared (locked, owned) RunDir of ``-o`` before any work starts, or None without ``-o`` (an input as
    ``-o`` was refused with the command's other paths: uvmlab.cli.options.check_command_paths)."""
    if not output:
        return None
    from uvmlab.files.rundir import RunDir

    return RunDir.for_writing(output, force)


def _frame_table(title: str, df: Any) -> tuple[str, list[str], list[list[Any]]]:
    """(title, columns, rows) of a whole DataFrame, for print_csv."""
    cols = [str(c) for c in df.columns]
    return title, cols, df.astype(object).to_numpy().tolist()


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


@click.command("evaluate")
@click.argument("ground_truth", type=PathParam("input", exists=False, path_type=str))
@out_option(
    "Write tables/figure here.",
    dest="output",
    type=PathParam("output", folder=True, file_okay=False, path_type=str),
)
@click.option(
    "--estimator",
    "estimators",
    multiple=True,
    type=click.Choice((*ESTIMATOR_NAMES, *PEER_NAMES)),
    help="Estimators to evaluate (repeatable) [default: all four; whole-device ground truth (GPUMemNet, xMem's "
    "sample): uvmlab-pca and the peers the ground truth records].",
)
@click.option(
    "--gpu-memory",
    default="80GiB",
    show_default=True,
    help="Device memory M_max for a folder of snapshots (their GPU is unrecorded).",
)
@click.option(
    "--max-warm",
    type=float,
    default=0.05,
    show_default=True,
    help="Snapshot folders: admit traces that began with at most this share of their peak already reserved.",
)
@click.option("--force", is_flag=True, help="Replace a complete result in -o (only files uvmlab wrote).")
@click.option(
    "--allow-code",
    is_flag=True,
    help="Let the CSV's source column name Python workload files (their code runs); only for CSVs you trust.",
)
@format_option()
def evaluate_cmd(
    ground_truth: str,
    output: str | None,
    estimators: tuple[str, ...],
    gpu_memory: str,
    max_warm: float,
    force: bool,
    allow_code: bool,
    fmt: str,
) -> None:
    """Score peak-memory estimators against GROUND_TRUTH with xMem's metrics (MRE, PEF, MCP).

    GROUND_TRUTH is a CSV of measured runs (columns: id, source, config, gpu_memory, measured_peak_bytes, oom;
    see docs/evaluation.md; a source naming a Python workload file is refused without --allow-code) or a folder
    of PyTorch memory snapshots (every snapshot whose trace covers the run
    is a ground-truth run: its peak reserved bytes, its own alloc/free stream as the estimators' input).
    Prints MRE, PEF (two-round rule), MCP per estimator; -o DIR also writes tables and the PEF-vs-MRE figure.
    """
    from uvmlab.evaluate.ground_truth import load_ground_truth
    from uvmlab.evaluate.harness import evaluate, write_evaluation

    src = Path(ground_truth)
    rd = _output_rundir(output, force)
    cases, skipped = load_ground_truth(src, parse_bytes(gpu_memory), max_warm, allow_code=allow_code)
    names: tuple[str, ...] = estimators or ESTIMATOR_NAMES
    if not estimators:
        if any(c.target == "device" for c in cases):  # whole-device ground truth: only uvmlab models the context
            names = ("uvmlab-pca",)
        names = (*names, *[p for p in PEER_NAMES if any(p in c.recorded for c in cases)])
    with err.status("estimating...") as status:
        ev = evaluate(cases, names, progress=lambda msg: status.update(plain(f"estimating {msg}")))
    if output:
        write_evaluation(ev, rd, {"ground_truth": str(src), "estimators": list(names), "n_cases": len(cases)})
    if fmt == "json":
        payload = {
            "summary": ev.summary.to_dict("records"),
            "per_run": ev.per_run.to_dict("records"),
            "failures": [{"case_id": c, "estimator": e, "reason": r} for c, e, r in ev.failures],
            "skipped": [{"source": s, "reason": r} for s, r in skipped],
        }
        click.echo(to_json(payload), nl=False)
        return
    if fmt == "csv":  # the summary (one row per estimator) and every (run, estimator) row, raw numbers
        print_csv([_frame_table("summary", ev.summary), _frame_table("per_run", ev.per_run)])
        return
    if not ev.summary.empty:
        print_table(
            f"Estimators on {len(cases)} ground-truth runs (xMem metrics)",
            ["estimator", "runs", "MRE", "PEF", "round-1 fail", "MCP", "quadrant", "s/estimate"],
            [
                [
                    r["estimator"],
                    r["n"],
                    _pct(r["mre"]),
                    _pct(r["pef"]),
                    _pct(r["pef_round1"]),
                    format_bytes(r["mcp_bytes"]),
                    r["quadrant"],
                    r["mean_runtime_s"],
                ]
                for r in ev.summary.to_dict("records")
            ],
        )
        print_table(
            "Per run",
            ["run", "estimator", "estimate", "measured", "OOM", "error", "C2"],
            [
                [
                    r["case_id"],
                    r["estimator"],
                    format_bytes(r["estimate_bytes"]),
                    "OOM" if r["oom"] else format_bytes(r["measured_peak_bytes"]),
                    "yes" if r["oom"] else "no",
                    _pct(r["error_mre"]),
                    "pass" if r["c2"] else "FAIL",
                ]
                for r in ev.per_run.to_dict("records")
            ],
            max_rows=MAX_PER_RUN_ROWS,
        )
    for c, e, r in ev.failures:
        note(f"{e} on {c}: not estimated ({r})")
    if skipped:
        note(f"{len(skipped)} runs or snapshot devices are not ground truth (e.g. {skipped[0][0]}: {skipped[0][1]})")
    if output:
        note(f"Wrote {output}")


@click.command("fragmentation")
@click.argument("source", type=PathParam("input", maybe_name=True, path_type=str))
@workload_options(iterations_default=3)
@click.option("--device", type=int, default=None, help="Snapshot device [default: the one with most events].")
@click.option("--gpu", default="A100-80GB", show_default=True, help="GPU whose CUDA rules shape a workload's trace.")
@click.option(
    "--grouping",
    type=click.Choice(["best", "homophase", "none"]),
    default="best",
    show_default=True,
    help="Planner grouping (HomoPhase groups, one group per request, or the smaller of both).",
)
@out_option(
    "Write tables/figure here.",
    dest="output",
    type=PathParam("output", folder=True, file_okay=False, path_type=str),
)
@click.option("--force", is_flag=True, help="Replace a complete result in -o (only files uvmlab wrote).")
@format_option()
def fragmentation_cmd(
    source: str, device: int | None, gpu: str, grouping: str, output: str | None, force: bool, fmt: str, **kw
) -> None:
    """Memory efficiency and fragmentation (STWeaver) of SOURCE: PCA vs an offline plan vs the lower bound.

    SOURCE is a workload (traced on the meta device, cached), a PyTorch snapshot pickle, or a trace directory.
    Efficiency = peak live tensor bytes / peak reserved bytes; fragmentation ratio = 1 - efficiency.
    """
    from uvmlab.evaluate.fragmentation import STWEAVER_REPORTED, characterize_source, write_fragmentation

    cfg = workload_config(source, **kw)
    rd = _output_rundir(output, force)
    with err.status(plain(f"tracing, simulating and planning {source}...")):
        frag = characterize_source(source, cfg, device, grouping, gpu)
    if output:
        write_fragmentation(frag, rd, {"source": source, "device": device, "grouping": grouping, "gpu": gpu})
    if fmt == "json":
        payload = {
            "name": frag.name,
            "allocators": frag.table.to_dict("records"),
            "fragmentation_reduction": frag.reduction(),
            "plan": {"grouping": frag.plan.grouping, "groups": frag.plan.n_groups, "fusions": frag.plan.n_fusions},
            "notes": frag.notes,
        }
        click.echo(to_json(payload), nl=False)
        return
    if fmt == "csv":
        cols = list(frag.table.columns)
        print_csv(("allocators", cols, frag.table[cols].astype(object).to_numpy().tolist()))
        return
    print_table(
        f"Fragmentation of {frag.name}",
        ["allocator", "peak reserved", "peak live", "efficiency", "fragmentation"],
        [
            [
                r["allocator"],
                format_bytes(r["peak_reserved_bytes"]),
                format_bytes(r["peak_allocated_bytes"]),
                _pct(r["efficiency"]),
                _pct(r["fragmentation_ratio"]),
            ]
            for r in frag.table.to_dict("records")
        ],
    )
    say(
        f"planned vs PCA: fragmentation reduced by {_pct(frag.reduction())} "
        f"(STWeaver reports {_pct(STWEAVER_REPORTED['mean_fragmentation_reduction'])} on average)"
    )
    say(f"the planned row's offline plan: {_plan_words(frag.plan)}")
    for n in frag.notes:
        note(n)
    if output:
        note(f"Wrote {output}")


def _plan_words(plan: object) -> str:
    """The plan in words: grouping 'none' is one group per request (still a plan), not the absence of a plan."""
    grouping = getattr(plan, "grouping", "?")
    how = {
        "homophase": "HomoPhase grouping (requests of one phase share a group)",
        "none": "no grouping (one group per request)",
    }.get(grouping, f"{grouping} grouping")
    groups, fusions = getattr(plan, "n_groups", 0), getattr(plan, "n_fusions", 0)
    return f"{how}, {groups:,} groups, {fusions:,} fusions of groups"


@click.command("colocate")
@click.argument("jobs", nargs=-1, required=True, type=PathParam("input", maybe_name=True, path_of=job_path))
@click.option("--gpu", default="A100-80GB", show_default=True, help="GPU model (see uvmlab.gpus).")
@click.option("--gpu-memory", default=None, help="Override the GPU's memory, e.g. 24GiB.")
@click.option(
    "--margin",
    default="2GiB",
    show_default=True,
    help="CARMA's placement margin, added once to the jobs' needs (CARMA uses 2 GB; each job's need already holds "
    "uvmlab estimate's required_mb margin).",
)
@click.option(
    "--simulate",
    type=click.Choice(["auto", "yes", "no"]),
    default="auto",
    show_default=True,
    help="Simulate UVM oversubscription: auto = only when the jobs do not fit.",
)
@workload_options(iterations_default=2)
@out_option("Write tables here.", dest="output", type=PathParam("output", folder=True, file_okay=False, path_type=str))
@click.option("--force", is_flag=True, help="Replace a complete result in -o (only files uvmlab wrote).")
@format_option()
def colocate_cmd(
    jobs: tuple[str, ...],
    gpu: str,
    gpu_memory: str | None,
    margin: str,
    simulate: str,
    output: str | None,
    force: bool,
    fmt: str,
    **kw,
) -> None:
    """Do JOBS fit together on one GPU (CARMA)? If not, what would UVM oversubscription cost each job?

    Each JOB is a workload name with an optional batch size and per-job options: gpt2:8 resnet50:32
    resnet50:8,image_size=64 (--option values apply to every job). Fit when the sum of the jobs' needs (each
    job's required_mb of uvmlab estimate --format carma: simulated peak reserved bytes, its CUDA context and the
    estimate's margin) and CARMA's placement margin (--margin) is at most the GPU memory. Otherwise
    the jobs run interleaved (round-robin by kernel) on one simulated UVM GPU: faults, migrations, slowdown.
    """
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.colocate import colocate_workloads, write_colocation
    from uvmlab.stats.schema import RESULT_LABELS

    spec = get_gpu(gpu, gpu_memory)
    base = workload_config("jobs", **kw)
    rd = _output_rundir(output, force)
    with err.status("tracing and placing jobs...") as status:
        res = colocate_workloads(
            jobs, spec, base, parse_bytes(margin), simulate, progress=lambda m: status.update(plain(m))
        )
    if output:
        write_colocation(res, rd, {"jobs": list(jobs), "gpu": spec.name, "margin": margin})
    if fmt == "json":
        click.echo(to_json(res.to_dict()), nl=False)
        return
    if fmt == "csv":  # one row per job: the verdict columns, and the UVM ones when simulated
        df = res.verdict if res.uvm is None else res.verdict.merge(res.uvm, on="job", how="left")
        print_csv(("jobs", list(df.columns), df.astype(object).to_numpy().tolist()))
        return
    print_table(
        f"Collocation on {spec.name} ({format_bytes(spec.memory_bytes)})",
        ["job", "peak reserved", "CUDA context", "estimate margin", "needs (required_mb)"],
        [
            [
                r["job"],
                format_bytes(r["peak_reserved_bytes"]),
                format_bytes(r["context_bytes"]),
                format_bytes(r["model_margin_bytes"]),
                f"{format_bytes(r['need_bytes'])} ({r['required_mb']:,} MiB)",
            ]
            for r in res.verdict.to_dict("records")
        ],
    )
    verdict = "FIT" if res.fits else "DO NOT FIT"
    say(
        f"{verdict}: {format_bytes(res.need_bytes)} needed (the jobs' required_mb, as uvmlab estimate --format carma "
        f"gives it, + CARMA's {format_bytes(res.margin_bytes)} placement margin) of {format_bytes(spec.memory_bytes)}"
    )
    if res.uvm is not None:
        print_table(
            f"UVM cost together (capacity {format_bytes(res.uvm_capacity_bytes)}, round-robin by kernel)",
            [
                "job",
                "faults",
                "faults alone",
                "HtoD",
                "DtoH",
                "evictions",
                "stall (ms)",
                "compute (ms)",
                "slowdown vs alone",
                RESULT_LABELS["slowdown_vs_native"],
            ],
            [
                [
                    r["job"],
                    int(r["fault_count"]),
                    int(r["fault_count_alone"]),
                    format_bytes(r["htod_bytes"]),
                    format_bytes(r["dtoh_bytes"]),
                    int(r["eviction_count"]),
                    r["stall_ns"] / 1e6,
                    r["compute_ns"] / 1e6,
                    f"{r['slowdown']:.2f}x",
                    f"{r['slowdown_vs_native']:.2f}x",
                ]
                for r in res.uvm.to_dict("records")
            ],
        )
    for n in res.notes:
        note(n)
    if output:
        note(f"Wrote {output}")


COMMANDS = [evaluate_cmd, fragmentation_cmd, colocate_cmd]
