"""Fit a UVM cost profile from end-to-end timings of real workloads (``uvmlab calibrate --uvm-profile``).

Protocol (docs/uvm-sim.md "Cost profiles"): fit on a declared subset, validate on all the rest; the seed study is
never fitted. For the RTX 5090 (driver 575) profile:

0. ``index_memory_efficiency`` (the DRAM share at which gathers and scatters move their rows, class ``index`` of
   uvmlab.sim.uvm.kernel_class) on the **native GCN 5M epoch** (no UVM): GCN's native time is mostly its index ops
   (``x[src]``, ``index_select``, ``index_add_``: random rows, atomics), the class no public source gives a rate
   for; every other class keeps its sourced constant (GDDR streams, GEMMs, the launch floor). The native time is
   the rest plus the index part, inversely proportional to the efficiency, so one simulation gives it.
1. ``fault_scale`` s multiplies every fault-path constant of ``CostParams`` (batch turnaround, per-entry cost,
   per-block service, fresh-block cost, eviction fixed cost; their Titan V / literature defaults keep their
   ratios). Fitted on **GCN 5M without user prefetch** (no oversubscription: the epoch is native time plus the
   faults and zero-fill of ~233k freshly allocated 2 MiB blocks). The epoch time is linear in s, so two
   simulations give it exactly. ``cpu_fault_ns`` is not scaled (GCN takes no CPU fault, so its epoch says nothing
   of them; scaled, it came out 4.95 us): it keeps ``CostParams``' 30 us [I], which the CPU faults of the real
   exports bracket (24.5 us on an RTX 4060 laptop, 41.7 us on an A100 host: scorecard check ``nsys-cpu-faults``).
2. ``sector_memory_efficiency`` (DRAM efficiency of lone 32 B sectors, one per 4 KiB page: uvmbench's
   page-strided kernels) fitted on **uvmbench seq_stream in device mode at 0.5x** (no UVM: the time is the
   native kernel's, inversely proportional to the efficiency).
3. ``link_bytes_per_s`` (2 MiB host<->device bandwidth, HtoD and DtoH serialised) fitted on **uvmbench
   seq_stream at 1.25x** with s fixed: the transfer part of the time is proportional to 1 / bandwidth.
4. ``prefetch_first_block_ns`` (the API path's cost for a never-populated block: ``cudaMemPrefetchAsync`` ->
   ``uvm_migrate.c`` populate, CE zeroing, mapping) fitted on **GCN 5M with user prefetch** (every tensor
   prefetched at allocation, nothing evicted: the epoch is native time plus allocator calls plus one API populate
   per fresh 2 MiB block); linear in the parameter, so two simulations give it exactly.
5. ``cpu_unmap_chunk_ns`` and ``cpu_chunk_map_ns`` (per CPU chunk: unmapped and copied as a GPU fault takes its
   pages; DMA-mapped when the GPU first touches its block): GCN and uvmbench's timed launches never migrate a page
   the CPU maps, so they come from the one-thread kernel of the A100 nsys export beside this folder
   (:data:`SERIAL_EXPORT`, ``fit_serial_refaults``; driver 525, a chunk per page) [I: another host, GPU and
   driver, the only one measured].
6. ``collapse_page_ns`` (a write fault on a page the GPU maps read-only in a read-mostly range) on **rq4
   seq_stream read-mostly** (:func:`fit_collapse`).
7. ``remote_read_bytes_per_s`` (GPU reads of host memory through a remote mapping) on **rq4 seq_stream
   accessed-by** (reads of lone sectors remote, writes local) and ``remote_partial_write_ns`` (a lone remote write)
   on **rq4 seq_stream preferred-location CPU** (reads and writes remote): in both the steady launch is the link
   time, linear in 1 / rate and in the per-write cost, so one probe simulation each gives them (:func:`fit_remote`).

Everything else (GCN 7M-15M with and without user prefetch, seq_stream 1.0x / 1.5x, rand_stream 1.0x-1.5x, the
other native uvmbench points and the rq4 hint modes, the Titan V logs, the seed study) is validation
(uvmlab/validate/uvm_checks.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_frame, read_json_file, short
from uvmlab.gpus import GPUS
from uvmlab.measure.calibrate import SERIAL_COSTS_WHAT
from uvmlab.sim.uvm.timing import PARAMS_SCHEMA_VERSION, CostParams

FAULT_PATH = (
    "batch_turnaround_ns",
    "fault_entry_ns",
    "block_service_ns",
    "block_first_gpu_ns",
    "evict_fixed_ns",
)
GCN_DIR = "noob512-uvm_rtx5090_pytorch_gcn"
BENCH_CSV = "gpu_ext_rtx5090_microbench/t0rq3_results.csv"
PREFETCH_PROBE_NS = 10_000.0
"""Probe value of ``prefetch_first_block_ns`` for the two-point linear fit (any positive value gives the same fit)."""
REMOTE_PROBE_BYTES_PER_S = 1e9
"""Probe remote read rate of :func:`fit_remote` (slow enough that the reads set the launch's time)."""
PARTIAL_WRITE_PROBE_NS = 100.0
"""Probe ``remote_partial_write_ns`` of :func:`fit_remote` (large enough that the writes set the launch's time)."""
SECTOR_FIT = ("device", 0.5)
"""The uvmbench point ``sector_memory_efficiency`` is fitted on: seq_stream, this mode and size factor (t0rq3)."""
BENCH_SCALE = 16
"""Memory scale-down of the simulated uvmbench runs (``--sim-option sim_scale``, docs/uvm-sim.md)."""
GCN_CHUNK_EDGES = 2_000_000
"""benchmark_gnn_uvm.py's ``--chunk_size`` default (workloads/files/gcn.py)."""
RQ4_CSV = "gpu_ext_rtx5090_microbench/rq4_memadvise_results.csv"
RQ4_FACTOR = 0.25
"""rq4_memadvise.py's ``SIZE_FACTOR`` (gpu_ext 3f4cc2d)."""
SERIAL_EXPORT = "csc746_a100_um_migrations_nsys2022.2.1.sqlite"
"""The nsys export (real-data/nsys, beside real-data/uvm) whose one-thread kernel gives the open-driver profile its
``cpu_unmap_chunk_ns`` (:func:`uvmlab.measure.calibrate.fit_serial_refaults`; [I]: an A100 host, the only one
measured)."""
RTX5090_TOTAL_BYTES = 33_669_316_608
"""``cudaMemGetInfo`` total of the RTX 5090 in gpu_ext's CSVs (``working_set_bytes`` at size_factor 1.0)."""


def scaled(base: CostParams, s: float) -> CostParams:
    """``base`` with every fault-path constant multiplied by ``s``."""
    return replace(base, **{f: getattr(base, f) * s for f in FAULT_PATH})


def gcn_measured(uvm_dir: Path, nodes: int, prefetch: bool = False, uvm: bool = True) -> float:
    """Measured mean epoch time (s) of the GCN at ``nodes`` (real-data JSON)."""
    sub = "with-user-prefetch" if prefetch else "without-user-prefetch"
    kind = ("result_uvm_baseline" if uvm else "result_no_uvm") + ("" if prefetch else "1")
    p = uvm_dir / GCN_DIR / sub / kind / f"{nodes}.json"
    doc = read_json_file(p, MAX_DATA_FILE_BYTES, "a GCN timing (JSON)")
    try:
        return float(doc["avg_epoch_time_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"cannot read GCN timing {p}: {short(exc)}") from None


def bench_measured(uvm_dir: Path, kernel: str, factor: float, mode: str = "uvm", csv: str = BENCH_CSV) -> float:
    """Measured median time (ms) of uvmbench ``kernel`` in ``mode`` at ``factor`` (default: the t0rq3 CSV)."""

    df = read_csv_frame(uvm_dir / csv, MAX_DATA_FILE_BYTES, "a uvmbench timings CSV")
    row = df[(df["kernel"] == kernel) & (df["mode"] == mode) & ((df["size_factor"] - factor).abs() < 1e-6)]
    if row.empty:
        raise InputError(f"{csv} has no {mode} row for {kernel} at {factor}")
    return float(row["median_ms"].iloc[0])


def gcn_epoch_s(
    nodes: int,
    costs: CostParams | None,
    prefetch: bool = False,
    sim_options: dict[str, Any] | None = None,
    gpu: str = "RTX5090",
    total_bytes: int | None = RTX5090_TOTAL_BYTES,
    chunk_edges: int = GCN_CHUNK_EDGES,
) -> tuple[float, float, int]:
    """Simulated (UVM epoch s, native epoch s, peak allocated bytes) of ``workloads/files/gcn.py`` at ``nodes``
    (the mean of the epochs after the warm-up; native: the all-resident time, ``native_pca_time_ns``).

    ``prefetch``: the file's ``prefetch=true`` (the script's own prefetching allocator); ``sim_options``: simulator
    knobs (e.g. ``prefetch_on_alloc``, the advisor's policy of the same name); ``costs``: None for the GPU's
    profile."""
    from uvmlab.uvm.simulate import card_bytes, shipped_config, simulate

    opts = {"nodes": int(nodes), "prefetch": bool(prefetch), "chunk_edges": int(chunk_edges)}
    cfg = shipped_config("gcn", opts, gpu, total_bytes, sim_options=sim_options)
    prep, _, result = simulate(cfg, costs=costs, available_bytes=card_bytes(cfg))
    return (
        result["iteration_time_ns"] / 1e9,
        result["native_pca_time_ns"] / 1e9,
        int(prep.placement.peak_allocated_bytes),
    )


def gcn_native_split(nodes: int, costs: CostParams, gpu: str = "RTX5090") -> tuple[float, float]:
    """Simulated (native epoch s, of which class ``index`` s) of ``workloads/files/gcn.py`` at ``nodes``: the means
    over the epochs after the warm-up of the kernels' all-resident times (uvmlab.sim.uvm.kernel_class)."""
    from uvmlab.uvm.simulate import card_bytes, shipped_config, simulate

    opts = {"nodes": int(nodes), "prefetch": False, "chunk_edges": GCN_CHUNK_EDGES}
    cfg = shipped_config("gcn", opts, gpu, RTX5090_TOTAL_BYTES)
    _, res, _ = simulate(cfg, costs=costs, available_bytes=card_bytes(cfg))
    k = res.kernels[res.kernels["iteration"] >= 1]
    epochs = max(1, k["iteration"].nunique())
    index = k.loc[k["kernel_class"] == "index", "native_ns"].sum()
    return float(k["native_ns"].sum()) / epochs / 1e9, float(index) / epochs / 1e9


def bench_ms(
    kernel: str,
    factor: float,
    costs: CostParams | None,
    mode: str = "uvm",
    gpu: str = "RTX5090",
    total_bytes: int = RTX5090_TOTAL_BYTES,
    iterations: int = 3,
    scale: int = BENCH_SCALE,
) -> float:
    """Simulated uvmbench median (ms) of the timed launches of ``workloads/files/uvmbench.py`` (``costs``: None for
    the GPU's profile), replayed at 1 / ``scale`` of the memory (``--sim-option sim_scale``)."""
    opts = {"kernel": kernel, "mode": mode, "size_factor": float(factor), "total_bytes": int(total_bytes)}
    return _median_ms(_bench_run("uvmbench", opts, costs, gpu, total_bytes, iterations, scale)[0])


def torch_bench_ms(factor: float, costs: CostParams | None, gpu: str = "RTX5090", iterations: int = 3) -> float:
    """Simulated median (ms) of the timed launches of ``workloads/files/uvmbench_torch.py`` (seq_stream written in
    torch, with no kernel declaration), at the scale of :func:`bench_ms`."""
    opts = {"size_factor": float(factor), "total_bytes": RTX5090_TOTAL_BYTES}
    return _median_ms(_bench_run("uvmbench_torch", opts, costs, gpu, RTX5090_TOTAL_BYTES, iterations)[0])


def bench_result(
    kernel: str,
    factor: float,
    costs: CostParams | None = None,
    mode: str = "uvm",
    gpu: str = "RTX5090",
    total_bytes: int = RTX5090_TOTAL_BYTES,
    iterations: int = 3,
) -> dict[str, Any]:
    """result.json of the run :func:`bench_ms` times (its ``regime``, counts, times)."""
    opts = {"kernel": kernel, "mode": mode, "size_factor": float(factor), "total_bytes": int(total_bytes)}
    return _bench_run("uvmbench", opts, costs, gpu, total_bytes, iterations)[1]


def _median_ms(res: Any) -> float:
    """The median time (ms) of a replay's iterations (the timed launches)."""
    import numpy as np

    return float(np.median(res.iterations["duration_ns"].to_numpy())) / 1e6


def _bench_run(
    workload: str,
    opts: dict[str, Any],
    costs: CostParams | None,
    gpu: str,
    total_bytes: int,
    iterations: int,
    scale: int = BENCH_SCALE,
) -> tuple[Any, dict[str, Any]]:
    """(ReplayResult, result.json) of a shipped uvmbench file at 1 / ``scale`` of the memory."""
    from uvmlab.uvm.simulate import card_bytes, shipped_config, simulate

    sim = {"sim_scale": scale}
    cfg = shipped_config(workload, opts, gpu, total_bytes, iterations=iterations, sim_options=sim)
    _, res, result = simulate(cfg, costs=costs, available_bytes=card_bytes(cfg))
    return res, result


def fit_rtx5090(uvm_dir: Path, base: CostParams | None = None) -> tuple[CostParams, dict[str, Any]]:
    """The RTX 5090 profile by the protocol of the module docstring; returns (costs, details)."""
    base = base or CostParams()
    gpu = GPUS["RTX5090"]
    native_meas = gcn_measured(uvm_dir, 5_000_000, uvm=False)
    probe_eff = base.for_gpu(gpu).memory_efficiency
    native_sim, index_sim = gcn_native_split(5_000_000, replace(scaled(base, 0.0), index_memory_efficiency=probe_eff))
    rest = native_sim - index_sim
    if native_meas <= rest or index_sim <= 0:
        raise InputError(
            f"GCN 5M native measured {native_meas:.3f} s is not above the simulated time of its other kernels "
            f"({rest:.3f} s): the index efficiency cannot be fitted"
        )
    index_eff = min(1.0, probe_eff * index_sim / (native_meas - rest))
    base = replace(base, index_memory_efficiency=index_eff)
    t_gcn = gcn_measured(uvm_dir, 5_000_000)
    t0, _, _ = gcn_epoch_s(5_000_000, scaled(base, 0.0))
    t1, _, _ = gcn_epoch_s(5_000_000, scaled(base, 1.0))
    s = max(0.0, (t_gcn - t0) / (t1 - t0))
    fitted = scaled(base, s)
    t_dev = bench_measured(uvm_dir, "seq_stream", SECTOR_FIT[1], mode=SECTOR_FIT[0])
    mem_eff = fitted.for_gpu(gpu).memory_efficiency
    probe = replace(fitted, sector_memory_efficiency=mem_eff)
    t_dev_sim = bench_ms("seq_stream", SECTOR_FIT[1], probe, mode=SECTOR_FIT[0])
    sector_eff = mem_eff * t_dev_sim / t_dev  # native time is inversely proportional to it
    fitted = replace(fitted, sector_memory_efficiency=sector_eff)
    t_seq = bench_measured(uvm_dir, "seq_stream", 1.25)
    link0 = base.link_bytes_per_s or gpu.link_bytes_per_s
    a = bench_ms("seq_stream", 1.25, replace(fitted, link_bytes_per_s=link0))
    b = bench_ms("seq_stream", 1.25, replace(fitted, link_bytes_per_s=link0 / 2))
    per_inv = b - a  # ms added by doubling 1 / bandwidth
    rest = a - per_inv
    if t_seq <= rest:
        raise InputError(f"seq_stream 1.25x measured {t_seq} ms is below the fault-path time alone ({rest:.0f} ms)")
    link = link0 * per_inv / (t_seq - rest)
    costs = replace(fitted, link_bytes_per_s=link)
    t_pre = gcn_measured(uvm_dir, 5_000_000, prefetch=True)
    p0, _, _ = gcn_epoch_s(5_000_000, replace(costs, prefetch_first_block_ns=0.0), prefetch=True)
    p1, _, _ = gcn_epoch_s(5_000_000, replace(costs, prefetch_first_block_ns=PREFETCH_PROBE_NS), prefetch=True)
    first = max(0.0, (t_pre - p0) / (p1 - p0) * PREFETCH_PROBE_NS)
    costs = replace(costs, prefetch_first_block_ns=first)
    collapse, collapse_info = fit_collapse(uvm_dir, costs)
    costs = replace(costs, collapse_page_ns=collapse)
    remote, remote_info = fit_remote(uvm_dir, costs)
    costs = replace(costs, **remote)
    serial, serial_info = open_driver_serial_costs(uvm_dir)
    costs = replace(costs, **serial)
    details = {
        "fault_scale": s,
        "index_memory_efficiency": {
            "measured_native_s": native_meas,
            "sim_native_s_at_probe": native_sim,
            "sim_index_s_at_probe": index_sim,
            "probe_efficiency": probe_eff,
            "index_memory_efficiency": index_eff,
        },
        "gcn_5M": {"measured_s": t_gcn, "sim_s_at_scale0": t0, "sim_s_at_scale1": t1},
        "seq_stream_device_0.5": {
            "measured_ms": t_dev,
            "sim_ms_at_memory_efficiency": t_dev_sim,
            "sector_memory_efficiency": sector_eff,
        },
        "seq_stream_1.25": {"measured_ms": t_seq, "fault_path_ms": rest, "transfer_ms_at_gpu_link": per_inv},
        "gcn_5M_with_user_prefetch": {
            "measured_s": t_pre,
            "sim_s_at_0": p0,
            f"sim_s_at_{PREFETCH_PROBE_NS:.0f}ns": p1,
            "prefetch_first_block_ns": first,
        },
        "rq4_read_mostly_collapse": collapse_info,
        "rq4_remote": remote_info,
        "serial_refaults": serial_info,
        "serial_refault_costs": serial,
    }
    return costs, details


def open_driver_serial_costs(uvm_dir: Path) -> tuple[dict[str, float], dict[str, Any]]:
    """``cpu_unmap_chunk_ns`` and ``cpu_chunk_map_ns`` for the open-driver profile from :data:`SERIAL_EXPORT` beside
    ``uvm_dir`` (``uvmlab.measure.calibrate.serial_refault_costs``); none, with the reason, when it is absent (then
    the defaults stay)."""
    from uvmlab.measure.calibrate import serial_refault_costs
    from uvmlab.measure.nsys.read import open_export

    path = uvm_dir.parent / "nsys" / SERIAL_EXPORT
    if not path.is_file():
        return {}, {"reason": f"{path} is absent: cpu_unmap_chunk_ns and cpu_chunk_map_ns keep their defaults"}
    with open_export(path) as ex:
        return serial_refault_costs(ex)


def collapse_fault_ns(costs: CostParams) -> float:
    """The simulator's fault-path time per page, besides ``collapse_page_ns``, of a GPU write to read duplicates
    (one 2 MiB block, duplicated by a read, then written; ``collapse_page_ns`` = 0)."""
    from uvmlab.gpus import GPUS
    from uvmlab.sim.uvm.driver import UvmSim
    from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK, VA_BLOCK_BYTES

    sim = UvmSim(4 * VA_BLOCK_BYTES, costs=replace(costs, collapse_page_ns=0.0), gpu=GPUS["RTX5090"])
    sim.map_range(0, VA_BLOCK_BYTES)
    sim.host_write(0, 0, VA_BLOCK_BYTES)
    sim.advise(0, 0, VA_BLOCK_BYTES, "set_read_mostly")
    sim.access([(0, 0, VA_BLOCK_BYTES, False)])
    return sim.access([(0, 0, VA_BLOCK_BYTES, True)]).stall_ns / PAGES_PER_BLOCK


def fit_collapse(uvm_dir: Path, costs: CostParams) -> tuple[float, dict[str, Any]]:
    """``collapse_page_ns`` on rq4 (declared fit point): seq_stream with both arrays read-mostly minus plain UVM, per
    page of the written array, minus the simulator's own write-fault time per page. rq4 pays this on every timed
    launch, as the model does (each write fault's prefetch region revokes the write of the pages written before
    it: uvmlab.sim.uvm.advice, "Read-only sole copies"), so the value is the price of one write fault on a page the
    GPU maps read-only (docs/uvm-sim.md "cudaMemAdvise"). 0 when the rq4 file is absent."""
    if not (uvm_dir / RQ4_CSV).is_file():
        return 0.0, {"reason": f"{RQ4_CSV} absent"}
    rm = bench_measured(uvm_dir, "seq_stream", RQ4_FACTOR, mode="uvm_advise_read", csv=RQ4_CSV)
    plain = bench_measured(uvm_dir, "seq_stream", RQ4_FACTOR, mode="uvm", csv=RQ4_CSV)
    pages = int(RTX5090_TOTAL_BYTES * RQ4_FACTOR) // 2 // 4096
    per_page = (rm - plain) * 1e6 / pages  # ns
    fault = collapse_fault_ns(costs)
    return max(0.0, per_page - fault), {
        "measured_ms": rm,
        "plain_ms": plain,
        "written_pages": pages,
        "per_page_ns": per_page,
        "model_write_fault_ns_per_page": fault,
    }


def fit_remote(uvm_dir: Path, costs: CostParams) -> tuple[dict[str, float], dict[str, Any]]:
    """``remote_read_bytes_per_s`` on rq4 seq_stream accessed-by, then ``remote_partial_write_ns`` on rq4 seq_stream
    preferred-location CPU (declared fit points; the module docstring, step 7). Each steady launch is its remote
    link time (no fault after the warm-ups), proportional to 1 / the read rate and to the per-write cost, so one
    probe each gives the value; the probe must be the part that sets the time (checked). None when the rq4 file
    is absent (the defaults stay)."""
    if not (uvm_dir / RQ4_CSV).is_file():
        return {}, {"reason": f"{RQ4_CSV} absent"}
    native = bench_ms("seq_stream", RQ4_FACTOR, costs, mode="uvm")
    t_read = bench_measured(uvm_dir, "seq_stream", RQ4_FACTOR, mode="uvm_advise_access", csv=RQ4_CSV)
    probe = replace(costs, remote_read_bytes_per_s=REMOTE_PROBE_BYTES_PER_S, remote_partial_write_ns=0.0)
    s_read = bench_ms("seq_stream", RQ4_FACTOR, probe, mode="uvm_advise_access")
    if not native < t_read < s_read:
        raise InputError(
            f"rq4 accessed-by: {t_read} ms measured is not between the native {native:.3f} ms and the probe"
        )
    read_rate = REMOTE_PROBE_BYTES_PER_S * s_read / t_read
    t_write = bench_measured(uvm_dir, "seq_stream", RQ4_FACTOR, mode="uvm_advise_pref_cpu", csv=RQ4_CSV)
    probe = replace(costs, remote_read_bytes_per_s=read_rate, remote_partial_write_ns=PARTIAL_WRITE_PROBE_NS)
    s_write = bench_ms("seq_stream", RQ4_FACTOR, probe, mode="uvm_advise_pref_cpu")
    if not t_read < t_write < s_write:
        raise InputError(f"rq4 preferred CPU: {t_write} ms measured is not between the reads' time and the probe")
    partial = PARTIAL_WRITE_PROBE_NS * t_write / s_write
    return {"remote_read_bytes_per_s": read_rate, "remote_partial_write_ns": partial}, {
        "accessed_by_measured_ms": t_read,
        f"accessed_by_sim_ms_at_{REMOTE_PROBE_BYTES_PER_S:.0e}_bytes_per_s": s_read,
        "preferred_cpu_measured_ms": t_write,
        f"preferred_cpu_sim_ms_at_{PARTIAL_WRITE_PROBE_NS:.0f}ns": s_write,
        "native_ms": native,
    }


def write_profile(path: Path, costs: CostParams, details: dict[str, Any]) -> Path:
    """Write the RTX 5090 profile JSON (a CostParams parameter file with provenance)."""
    doc = {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "gpu": "RTX5090",
        "driver": "575.57.08 (open modules), CUDA 12.9",
        "driver_version": "575.57.08",
        "link": GPUS["RTX5090"].link,
        "source": "uvmlab.measure.profile_fit.fit_rtx5090 on real-data/uvm",
        "fitted_on": [
            f"{GCN_DIR}/without-user-prefetch/result_no_uvm1/5000000.json avg_epoch_time_s -> index_memory_efficiency",
            f"{GCN_DIR}/without-user-prefetch/result_uvm_baseline1/5000000.json avg_epoch_time_s -> fault_scale",
            f"{BENCH_CSV} seq_stream device 0.5 median_ms -> sector_memory_efficiency",
            f"{BENCH_CSV} seq_stream uvm 1.25 median_ms -> link_bytes_per_s",
            f"{GCN_DIR}/with-user-prefetch/result_uvm_baseline/5000000.json avg_epoch_time_s"
            " -> prefetch_first_block_ns",
            f"{RQ4_CSV} seq_stream uvm_advise_read and uvm 0.25 median_ms -> collapse_page_ns",
            f"{RQ4_CSV} seq_stream uvm_advise_access 0.25 median_ms -> remote_read_bytes_per_s",
            f"{RQ4_CSV} seq_stream uvm_advise_pref_cpu 0.25 median_ms -> remote_partial_write_ns",
            *(
                f"[I] nsys/{SERIAL_EXPORT} (an A100 host): {SERIAL_COSTS_WHAT[name]} -> {name}"
                for name in details["serial_refault_costs"]
            ),
        ],
        "validated_on": [
            "GCN native 1M, 3M, 7M; GCN UVM 7M, 8M, 10M, 12M, 15M (without user prefetch); "
            "GCN with user prefetch 7M, 8M, 10M, 12M, 15M and its speedup over plain UVM",
            "uvmbench seq_stream 1.0x, 1.5x; rand_stream 1.0x, 1.25x, 1.5x; pointer_chase 1.25x, 1.5x",
            "uvmbench native (t0rq3 device 0.75x, uvm 0.5x/0.75x, rand_stream device and uvm 0.5x/0.75x) and the "
            "rq4 modes at 0.25x",
        ],
        "fit": details,
        "params": costs.to_dict(),
    }
    atomic_write_json(path, doc)
    return path


def derive_profile(
    path: Path, gpu_name: str, base_doc: dict[str, Any], nsys_export: Path, base_gpu_defaults: CostParams
) -> Path:
    """A profile for a GPU with only an nsys export: the fault-path constants of ``base_doc`` (the newest driver
    we have timings for), its own link bandwidth, host CPU-fault cost and CPU unmapping per page fitted on the
    export's UM migrations (``uvmlab.measure.calibrate``: ``fit_link_bandwidth``; ``fit_cpu_fault_ns`` where the
    export has CPU faults; ``fit_serial_refaults`` where its kernels run one thread), and the default kernel
    efficiencies (the base profile's were fitted on another GPU's kernels)."""
    from uvmlab.measure.calibrate import fit_cpu_fault_ns, fit_link_bandwidth, serial_refault_costs
    from uvmlab.measure.nsys.read import open_export

    with open_export(nsys_export) as ex:
        link, info = fit_link_bandwidth(ex)
        cpu_fault, cpu_info = fit_cpu_fault_ns(ex)
        serial, serial_info = serial_refault_costs(ex)
    if link is None:
        raise InputError(f"{nsys_export}: no link bandwidth fit ({info.get('reason')})")
    params = dict(base_doc["params"])
    from uvmlab.sim.uvm.profile import GPU_FIELDS

    params.update({f: getattr(base_gpu_defaults, f) for f in GPU_FIELDS if f != "link_bytes_per_s"})
    params.update(link_bytes_per_s=link, zero_fill_bytes_per_s=None)
    if cpu_fault is not None:
        params["cpu_fault_ns"] = cpu_fault
    params.update(serial)
    doc = {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "gpu": gpu_name,
        "driver": f"fault path from the {base_doc['gpu']} profile ({base_doc['driver']})",
        "driver_version": base_doc.get("driver_version", ""),
        "link": GPUS[gpu_name].link,
        "source": "uvmlab.measure.profile_fit.derive_profile",
        "fitted_on": [
            f"{nsys_export.name}: {info['migrations']} UM migrations -> link_bytes_per_s",
            *(
                [f"{nsys_export.name}: {cpu_info['gaps']} gaps between CPU faults -> cpu_fault_ns"]
                if cpu_fault is not None
                else []
            ),
            *(f"{nsys_export.name}: {SERIAL_COSTS_WHAT[name]} -> {name}" for name in serial),
            *[
                f"(from {base_doc['gpu']}) {x}"
                for x in base_doc["fitted_on"]
                if any(k in x.rsplit("->", 1)[-1] for k in ("fault_scale", "prefetch_first_block", "collapse"))
            ],
        ],
        "validated_on": ["seed study grid (seeds/003): validation only, never fitted"],
        "fit": {"link": info, "cpu_fault": cpu_info, "serial_refaults": serial_info},
        "params": params,
    }
    atomic_write_json(path, doc)
    return path
