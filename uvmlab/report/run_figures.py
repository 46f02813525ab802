"""Figures of one run directory (simulated or measured: they read the shared uvmlab.stats.schema columns).

* ``memory_per_kernel``: the seed study's Figure 5: memory each kernel touches (``kernel_bytes``) against kernel
  index, iteration boundaries as red dotted lines, first five iterations; below it allocated / reserved / resident
  bytes over time.
* ``faults_migrations``: per iteration, read and write faults, and HtoD / DtoH migrated bytes.
"""

from __future__ import annotations

import pandas as pd

from uvmlab.rundir import RunDir
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
        axes[0][0].text(0.5, 0.5, "no per-kernel or memory data collected", ha="center", va="center")
        axes[0][0].set_axis_off()
    fig.tight_layout()
    return fig


def _empty(ax, text: str) -> None:  # type: ignore[no-untyped-def]
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def faults_migrations_figure(iterations: pd.DataFrame, title: str = ""):  # type: ignore[no-untyped-def]
    """Per-iteration faults (read / write, stacked) and migrated bytes (HtoD / DtoH).

    A panel whose columns were not collected (null), or a run without iterations (an nsys export without NVTX
    iteration ranges), says so instead of drawing zeros.
    """
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
) -> list:
    """Write both figures into ``rundir/figures`` (format ``rundir.figure_format``); return their paths."""
    plt = _plt()
    paths = []
    for name, fig in (
        ("memory_per_kernel", memory_per_kernel_figure(kernels, memory, title)),
        ("faults_migrations", faults_migrations_figure(iterations, title)),
    ):
        paths.append(rundir.write_figure(name, fig))
        plt.close(fig)
    return paths
