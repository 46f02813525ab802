"""Scorecard check: native time of a streaming kernel on the RTX 5090 (real-data/uvm/gpu_ext_rtx5090_microbench).

uvmbench (eunomia-bpf/gpu_ext ``microbench/memory/main.cu``, real-data/uvm README section 2) times ``seq_stream``
in ``device`` mode (cudaMalloc, no UVM) over a working set of 0.25x (rq1_results.csv) and 0.5x (rq2_results.csv)
of the GPU's memory. The kernel (``seq_stream_kernel`` in ``microbench/memory/kernels/synthetic.cuh`` of the same
repository) splits the working set into an input and an output array of equal size, reads every input element
and writes every output element once per iteration (element-level in these runs: no stride), so
``bytes_accessed`` (= the working set) is its DRAM traffic; t0rq3 instead touches one element per 4 KiB page.
uvmlab's native kernel time of a streaming kernel is class ``memory`` of :mod:`uvmlab.sim.uvm.kernel_class`: bytes /
(DRAM bandwidth x ``memory_efficiency``), the RTX 5090's bandwidth from :mod:`uvmlab.gpus` and the efficiency of its
memory kind (GDDR: ``uvmlab.sim.uvm.timing.STREAM_EFFICIENCY``). The 0.25x point (rq1) is that constant's source
(fitted, no band); the 0.5x point (rq2) validates it, band 1.5. The GPU is inferred from the 31.36 GiB total (the
README), not stated.

Not covered here: ``rand_stream`` and ``pointer_chase`` (the roofline has no random-access or latency term),
the ``uvm`` / ``uvm_prefetch`` rows, and the page-strided t0rq3 / rq4 runs (the UVM-timing checks of uvm_checks.py:
``uvm/uvmbench-rtx5090-modes`` scores their native time and the rq4 cudaMemAdvise modes).
"""

from __future__ import annotations

from pathlib import Path

from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_rows
from uvmlab.validate.points import Point, check

DATASET = "uvm/gpu_ext_rtx5090_microbench"
FILES = ("rq1_results.csv", "rq2_results.csv")
FITTED_FILE = "rq1_results.csv"
"""The GDDR stream efficiency (``uvmlab.sim.uvm.timing.STREAM_EFFICIENCY``) is this file's point."""
GPU = "RTX5090"
BAND = 1.5


@check("rtx5090-stream-native", needs=DATASET, fast=True)
def check_stream_native(data_dir: Path) -> list[Point]:
    """seq_stream device-mode median time against the native roofline."""
    import numpy as np

    from uvmlab.gpus import get_gpu
    from uvmlab.sim.uvm.kernel_class import KernelWork, native_times
    from uvmlab.sim.uvm.timing import CostParams

    gpu = get_gpu(GPU)
    costs = CostParams().for_gpu(gpu)
    points = []
    for name in FILES:
        path = data_dir / DATASET / name
        if not path.exists():
            continue
        for row in read_csv_rows(path, MAX_DATA_FILE_BYTES, "a microbenchmark timings CSV")[1]:
            if (row["kernel"], row["mode"]) != ("seq_stream", "device"):
                continue
            nbytes = float(row["bytes_accessed"])
            work = KernelWork(
                names=["seq_stream_kernel"],
                flops=np.zeros(1),
                nbytes=np.array([nbytes]),
                dtypes=["fp32"],
                occupancy=np.ones(1),
                sector=np.zeros(1, dtype=bool),
                index=np.zeros(1, dtype=bool),
                threads=np.zeros(1, dtype=np.int64),
                native_ns=np.full(1, np.nan),
                efficiency=np.full(1, np.nan),
                api=[""],
            )
            predicted_ms = float(native_times(work, gpu, costs)[0][0]) / 1e6
            fitted = name == FITTED_FILE
            points.append(
                Point(
                    DATASET,
                    f"{path.stem}: seq_stream, device, {row['size_factor']}x",
                    "native kernel time (median)",
                    "ms",
                    float(row["median_ms"]),
                    predicted_ms,
                    fitted=fitted,
                    note=f"class memory: {nbytes / 1e9:.2f} GB at {gpu.hbm_bytes_per_s / 1e9:.0f} GB/s x "
                    f"memory_efficiency {costs.memory_efficiency} ({gpu.memory_kind})",
                    band=None if fitted else BAND,
                )
            )
    return points
