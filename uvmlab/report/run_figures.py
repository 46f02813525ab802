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

MAX_ITERATIONS_SHOWN = 5
"""Figure 5 of the study shows the first five iterations."""


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def memory_per_kernel_figure(kernels: pd.DataFrame, memory: pd.DataFrame | None = None, title: str = ""):  # type: ignore[no-untyped-def]
    """Figure 5 style: per-kernel memory vs kernel index (+ memory over time when ``memory`` is given)."""
    plt = _plt()
    k = kernels[kernels["iteration"] < MAX_ITERATIONS_SHOWN].reset_index(drop=True)
    nrows = 2 if memory is not None and len(memory) else 1
    fig, axes = plt.subplots(nrows, 1, figsize=(10, 3.4 * nrows), squeeze=False)
    ax = axes[0][0]
    ax.plot(k.index, k["kernel_bytes"] / MiB, lw=0.6, color="tab:blue")
    first = k.groupby("iteration").head(1)
    for idx, it in zip(first.index, first["iteration"], strict=True):
        if it >= 1:
            ax.axvline(idx, color="red", ls=":", lw=1)
    ax.set_xlabel("kernel invocation index")
    ax.set_ylabel("memory used by the kernel (MiB)")
    ax.set_title(title or "Memory per kernel")
    if nrows == 2 and memory is not None:
        m = memory.iloc[: len(k)]  # one memory row per kernel (the simulator's memory table), same kernels as above
        ax2 = axes[1][0]
        t_s = m["time_ns"] / 1e9
        ax2.plot(t_s, m["allocated_bytes"] / MiB, label="allocated (live tensors)", lw=0.8)
        ax2.plot(t_s, m["reserved_bytes"] / MiB, label="reserved (managed ranges)", lw=0.8)
        if m["resident_bytes"].notna().any():
            ax2.plot(t_s, m["resident_bytes"] / MiB, label="resident on the GPU", lw=0.8)
        ax2.set_xlabel("time (s)")
        ax2.set_ylabel("memory (MiB)")
        ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def faults_migrations_figure(iterations: pd.DataFrame, title: str = ""):  # type: ignore[no-untyped-def]
    """Per-iteration faults (read / write, stacked) and migrated bytes (HtoD / DtoH)."""
    plt = _plt()
    it = iterations
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    x = it["iteration"].to_numpy()
    a1.bar(x, it["read_fault_count"], label="read faults", color="tab:orange")
    a1.bar(x, it["write_fault_count"], bottom=it["read_fault_count"], label="write faults", color="tab:blue")
    a1.set_xlabel("iteration")
    a1.set_ylabel("GPU page faults (4 KiB pages)")
    a1.legend(fontsize=8)
    w = 0.4
    a2.bar(x - w / 2, it["htod_bytes"] / MiB, width=w, label="HtoD", color="tab:green")
    a2.bar(x + w / 2, it["dtoh_bytes"] / MiB, width=w, label="DtoH", color="tab:red")
    a2.set_xlabel("iteration")
    a2.set_ylabel("UM migrations (MiB)")
    a2.legend(fontsize=8)
    from matplotlib.ticker import StrMethodFormatter

    for ax in (a1, a2):
        ax.set_xticks(x)  # whole iterations only
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
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
    """Write both figures into ``rundir/figures``; return their paths."""
    plt = _plt()
    paths = []
    for name, fig in (
        ("memory_per_kernel", memory_per_kernel_figure(kernels, memory, title)),
        ("faults_migrations", faults_migrations_figure(iterations, title)),
    ):
        paths.append(rundir.write_figure(name, fig))
        plt.close(fig)
    return paths
