"""Figures of one run directory (simulated or measured: they read the shared uvmlab.stats.schema columns).

* ``memory_per_kernel``: the seed study's Figure 5: memory each kernel touches (``kernel_bytes``) against kernel
  index, iteration boundaries as red dotted lines, first five iterations; below it allocated / reserved / resident
  bytes over time.
* ``faults_migrations``: per iteration, read and write faults, and HtoD / DtoH migrated bytes; a run without
  iterations (an nsys export without NVTX iteration ranges): faults and migrations over time, by kind.

A run with neither per-kernel memory nor memory events (an nsys export without CUDA_GPU_MEMORY_USAGE_EVENTS) gets
faults and migrated bytes per kernel in ``memory_per_kernel`` instead: never a blank figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from uvmlab.files.rundir import RunDir
from uvmlab.units import MiB

RUN_FIGURES = ("memory_per_kernel", "faults_migrations")
"""The figures every run directory has (file names without the format's suffix)."""
MAX_ITERATIONS_SHOWN = 5
"""Figure 5 of the study shows the first five iterations."""


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _iteration_starts(ax, positions, label: str = "iteration start") -> None:  # type: ignore[no-untyped-def]
    """Red dotted lines at iteration starts; one legend entry."""
    for i, x in enumerate(positions):
        ax.axvline(x, color="red", ls=":", lw=1, label=label if i == 0 else None)


def memory_per_kernel_figure(kernels: pd.DataFrame, memory: pd.DataFrame | None = None, title: str = ""):  # type: ignore[no-untyped-def]
    """Figure 5 style: per-kernel memory vs kernel index (+ memory over time when ``memory`` is given).

    Iteration starts (from iteration 1) are red dotted lines named in the legend of both panels. Reserved bytes
    are drawn wide and light, allocated bytes dashed on top: with PCA off the two are almost equal (one managed
    range per tensor) and allocated stays visible. A panel whose column was not collected (a measured run has no
    ``kernel_bytes``) is left out.
    """
    plt = _plt()
    k = kernels[kernels["iteration"] < MAX_ITERATIONS_SHOWN].reset_index(drop=True)
    has_kernel_bytes = len(k) > 0 and pd.to_numeric(k["kernel_bytes"], errors="coerce").notna().any()
    has_memory = memory is not None and len(memory) > 0
    panels = int(has_kernel_bytes) + int(has_memory)
    fig, axes = plt.subplots(max(1, panels), 1, figsize=(12, 3.4 * max(1, panels)), squeeze=False)
    axes_iter = iter(axes[:, 0])
    first = k.groupby("iteration").head(1)
    starts = first[first["iteration"] >= 1]
    if has_kernel_bytes:
        ax = next(axes_iter)
        ax.plot(k.index, pd.to_numeric(k["kernel_bytes"], errors="coerce") / MiB, lw=0.6, color="tab:blue",
                label="memory used by the kernel")  # fmt: skip
        _iteration_starts(ax, starts.index)
        ax.set_xlabel("kernel invocation index")
        ax.set_ylabel("memory used by the kernel (MiB)")
        ax.set_title(title or "Memory per kernel")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if has_memory and memory is not None:
        ax2 = next(axes_iter)
        # simulated: one memory row per kernel, the same kernels as above; measured: every alloc/free event
        m = memory.iloc[: len(k)] if "kernel_id" in memory.columns and has_kernel_bytes else memory
        t_s = m["time_ns"] / 1e9
        res = pd.to_numeric(m["reserved_bytes"], errors="coerce")
        alloc = pd.to_numeric(m["allocated_bytes"], errors="coerce")
        step = {"drawstyle": "steps-post"}  # each row holds until the next event
        ax2.plot(t_s, res / MiB, label="reserved (allocator's managed ranges)", lw=2.4, alpha=0.45,
                 color="tab:orange", **step)  # fmt: skip
        if alloc.notna().any():
            ax2.plot(t_s, alloc / MiB, label="allocated (live tensors)", lw=1.0, ls="--", color="tab:blue",
                     zorder=3, **step)  # fmt: skip
        if m["resident_bytes"].notna().any():
            ax2.plot(t_s, m["resident_bytes"] / MiB, label="resident on the GPU", lw=0.8, color="tab:green", **step)
        if len(starts) and "start_ns" in starts.columns:
            _iteration_starts(ax2, starts["start_ns"].to_numpy(dtype=float) / 1e9)
        ax2.set_xlabel("time (s)")
        ax2.set_ylabel("memory (MiB)")
        if not has_kernel_bytes:
            ax2.set_title(title or "Memory over time")
        ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if panels == 0:
        plt.close(fig)
        return per_kernel_events_figure(kernels, title)
    fig.tight_layout()
    return fig


def per_kernel_events_figure(kernels: pd.DataFrame, title: str = ""):  # type: ignore[no-untyped-def]
    """What a run without per-kernel memory or memory events (an nsys export without
    CUDA_GPU_MEMORY_USAGE_EVENTS) has per kernel: GPU page faults (read / write, stacked) and migrated MiB (HtoD /
    DtoH) against the kernel invocation index. Columns not collected say so; no kernels at all, too."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 6.4))
    fig.suptitle(title or "Per kernel", fontsize=10)
    a1.set_title("no memory per kernel in this run: its faults and migrations per kernel instead", fontsize=9)
    a1.set_xlabel("kernel invocation index")
    a2.set_xlabel("kernel invocation index")
    a1.set_ylabel("GPU page faults (count)")
    a2.set_ylabel("UM migrations (MiB)")
    if not len(kernels):
        for ax in (a1, a2):
            _empty(ax, "no kernels in this run (and no memory per kernel or memory events)")
        fig.tight_layout()
        return fig
    from matplotlib.ticker import MaxNLocator

    x = range(len(kernels))
    for ax in (a1, a2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole kernels only
    for ax, cols, labels, colors, scale in (
        (a1, ("read_fault_count", "write_fault_count"), ("read faults", "write faults"), ("tab:orange", "tab:blue"), 1),
        (a2, ("htod_bytes", "dtoh_bytes"), ("HtoD", "DtoH"), ("tab:green", "tab:red"), MiB),
    ):  # fmt: skip
        values = [pd.to_numeric(kernels[c], errors="coerce") for c in cols]
        if pd.concat(values).isna().all():
            _empty(ax, f"{' / '.join(cols)} not collected")
            continue
        bottom = None
        for v, label, color in zip(values, labels, colors, strict=True):
            v = v.fillna(0).to_numpy(dtype=float) / scale
            ax.bar(x, v, bottom=bottom, width=1.0, label=label, color=color)
            bottom = v if bottom is None else bottom + v
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def _empty(ax, text: str) -> None:  # type: ignore[no-untyped-def]
    import textwrap

    text = "\n".join(textwrap.fill(line, 60) for line in text.split("\n"))  # long reasons stay in the panel
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


DIRECTION_NAMES = {"htod": "HtoD", "dtoh": "DtoH"}
MAX_TIME_BINS = 60
"""Bars of a figure over time: the bin is the smallest 1-2-5 step giving at most this many."""


def _time_bin_ns(span_ns: float) -> int:
    """The smallest of 1, 2, 5 x 10**k ns that splits ``span_ns`` into at most MAX_TIME_BINS bins."""
    k = 0
    while True:
        for m in (1, 2, 5):
            if m * 10**k * MAX_TIME_BINS >= span_ns:
                return m * 10**k
        k += 1


def _duration_text(ns: int) -> str:
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if ns >= size:
            return f"{ns / size:g} {unit}"
    return f"{ns} ns"


def faults_migrations_over_time_figure(  # type: ignore[no-untyped-def]
    faults: pd.DataFrame | None, migrations: pd.DataFrame | None, title: str = "", missing: dict | None = None
):
    """Faults and migrations over time, by kind: what a run without iterations (an nsys export without NVTX
    iteration ranges) has. Bars per time bin: page faults by processor and access type (GPU read / write /
    atomic / prefetch, CPU), migrated MiB by direction and cause. A source the export did not collect says so
    (``missing``: uvmlab.measure.nsys collection reasons by source)."""
    plt = _plt()
    missing = missing or {}
    f = faults if faults is not None else pd.DataFrame(columns=["start_ns", "processor", "access", "fault_count"])
    m = migrations if migrations is not None else pd.DataFrame(columns=["start_ns", "bytes", "direction", "cause"])
    starts = pd.concat([pd.to_numeric(f["start_ns"]), pd.to_numeric(m["start_ns"])]).dropna()
    t0 = float(starts.min()) if len(starts) else 0.0
    span = float(starts.max()) - t0 if len(starts) else 0.0
    bin_ns = _time_bin_ns(max(span, 1.0))
    edges = t0 + bin_ns * np.arange(int(span // bin_ns) + 2)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    x = (edges[:-1] - t0) / 1e9
    width = bin_ns / 1e9
    for ax, df, key, weight, scale, source, what in (
        (a1, f, lambda r: f"{r.processor.upper()} {r.access}" if r.processor == "gpu" else "CPU", "fault_count", 1,
         "gpu_faults", "page faults"),
        (a2, m, lambda r: f"{DIRECTION_NAMES.get(r.direction, r.direction)} {r.cause}", "bytes", MiB, "migrations",
         "UM migrations"),
    ):  # fmt: skip
        ax.set_xlabel("time since the first fault or migration (s)")
        if not len(df):
            why = missing.get(source)
            _empty(ax, f"{what}: not in this export ({why})" if why else f"no {what} in this export")
            continue
        kinds = [key(r) for r in df.itertuples(index=False)]
        bottom = np.zeros(len(x))
        for kind in sorted(set(kinds)):
            sel = np.array([k == kind for k in kinds])
            counts, _ = np.histogram(pd.to_numeric(df["start_ns"])[sel], bins=edges, weights=df[weight][sel])
            ax.bar(x, counts / scale, width=width, bottom=bottom, align="edge", label=kind)
            bottom += counts / scale
        ax.legend(fontsize=8)
    a1.set_ylabel(f"page faults per {_duration_text(bin_ns)} (count)")
    a2.set_ylabel(f"migrated per {_duration_text(bin_ns)} (MiB)")
    fig.suptitle(title or "Faults and migrations over time", fontsize=10)
    fig.tight_layout()
    return fig


def faults_migrations_figure(  # type: ignore[no-untyped-def]
    iterations: pd.DataFrame,
    title: str = "",
    faults: pd.DataFrame | None = None,
    migrations: pd.DataFrame | None = None,
    missing: dict | None = None,
):
    """Per-iteration faults (read / write, stacked) and migrated bytes (HtoD / DtoH).

    A run without iterations (an nsys export without NVTX iteration ranges) given its fault or migration records
    draws them over time instead (:func:`faults_migrations_over_time_figure`). A panel whose columns were not
    collected (null) says so instead of drawing zeros.
    """
    if not len(iterations) and any(df is not None and len(df) for df in (faults, migrations)):
        return faults_migrations_over_time_figure(faults, migrations, title, missing)
    plt = _plt()
    from matplotlib.ticker import StrMethodFormatter

    it = iterations
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    x = it["iteration"].to_numpy()
    for ax, cols in ((a1, ("read_fault_count", "write_fault_count")), (a2, ("htod_bytes", "dtoh_bytes"))):
        ax.set_xlabel("iteration")
        if not len(it):
            _empty(ax, "no iterations in this run\n(nsys: no NVTX ranges matching the iteration pattern)")
        elif pd.concat([pd.to_numeric(it[c], errors="coerce") for c in cols]).isna().all():
            _empty(ax, f"{' / '.join(cols)} not collected")
        else:
            ax.set_xticks(x)  # whole iterations only
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    a1.set_ylabel("GPU page faults (count)")
    a2.set_ylabel("UM migrations (MiB)")
    if len(it):
        read = pd.to_numeric(it["read_fault_count"], errors="coerce").fillna(0)
        write = pd.to_numeric(it["write_fault_count"], errors="coerce").fillna(0)
        a1.bar(x, read, label="read faults", color="tab:orange")
        a1.bar(x, write, bottom=read, label="write faults", color="tab:blue")
        a1.legend(fontsize=8)
        w = 0.4
        htod = pd.to_numeric(it["htod_bytes"], errors="coerce").fillna(0) / MiB
        dtoh = pd.to_numeric(it["dtoh_bytes"], errors="coerce").fillna(0) / MiB
        a2.bar(x - w / 2, htod, width=w, label="HtoD", color="tab:green")
        a2.bar(x + w / 2, dtoh, width=w, label="DtoH", color="tab:red")
        a2.legend(fontsize=8)
    fig.suptitle(title or "Faults and migrations per iteration", fontsize=10)
    fig.tight_layout()
    return fig


def write_run_figures(
    rundir: RunDir,
    kernels: pd.DataFrame,
    iterations: pd.DataFrame,
    memory: pd.DataFrame | None = None,
    title: str = "",
    faults: pd.DataFrame | None = None,
    migrations: pd.DataFrame | None = None,
    missing: dict | None = None,
) -> list:
    """Write both figures into ``rundir/figures`` (format ``rundir.figure_format``); return their paths.

    ``faults`` / ``migrations`` (a measured run's records) and ``missing`` (why a source was not collected) let a
    run without iterations draw faults and migrations over time."""
    plt = _plt()
    paths = []
    for name, fig in (
        ("memory_per_kernel", memory_per_kernel_figure(kernels, memory, title)),
        ("faults_migrations", faults_migrations_figure(iterations, title, faults, migrations, missing)),
    ):
        paths.append(rundir.write_figure(name, fig))
        plt.close(fig)
    return paths
