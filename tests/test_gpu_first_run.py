"""Issue 43: what the first run on a lent GPU needs, checked here against the stub CUDA runtime (tests/stubs).

The REAL worker (``python -m uvmlab.measure.gpu.worker``) runs in a child process with the real shim preloaded in
front of the stub runtime: its training loop on the CPU (``--device cpu``), its runtime side (device attributes, the
deferred balloon, the probes, the hints' streams and prefetches) against the stub (``--cudart``), and an
environment without the ``nvtx`` package, as on the lent machine. Before, only a fake worker ran here, so the real
worker's ``import nvtx`` (absent there) was never exercised.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cuda_stub import build_cudart
from uvmlab.measure.gpu import shim

STUBS = Path(__file__).parent / "stubs"
REPO = Path(__file__).resolve().parents[1]
MiB, GiB = 1 << 20, 1 << 30
TINY_GPT2 = {"seq_len": 16, "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 16}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None or shim.find_compiler() is None:
        pytest.skip("gcc/g++ not found: the shim and the stub runtime are C/C++")
    d = tmp_path_factory.mktemp("first_run")
    cudart = build_cudart(d)
    # the same stub under another soname and symbol version, preloaded after the shim: torch's own libcudart.so.13
    # (driverless here) still loads and serves torch, while the shim and the worker's runtime side find the stub
    cudart99 = build_cudart(d, "libcudart.so.99")
    no_nvtx = d / "no_nvtx" / "nvtx"
    no_nvtx.mkdir(parents=True)
    (no_nvtx / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'nvtx'\", name='nvtx')\n")
    lib = shim.build_shim(cache_dir=d / "cache")
    return {"dir": d, "shim": lib, "cudart": cudart, "cudart99": cudart99, "no_nvtx": no_nvtx.parent}


def _clean_env(built: dict[str, Path], tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_", "LD_", "CUDNN_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(built["no_nvtx"]), str(REPO), env.get("PYTHONPATH", "")])
    env["FAKE_CUDART_LOG"] = str(tmp_path / "cudart.log")
    env.update(extra)
    return env


def _rundir(tmp_path: Path) -> Path:
    from uvmlab.config import RunConfig, WorkloadConfig

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    cfg = RunConfig(WorkloadConfig("gpt2", batch_size=2, iterations=2, options=TINY_GPT2), oversub=2.0, mode="gpu")
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    return run


# ---- blocker 1 and defect 6: the real worker, without nvtx, balloon after the warm-up -----------------------------
def test_the_real_worker_runs_against_the_stub_without_nvtx_and_takes_the_balloon_after_the_warm_up(
    built: dict[str, Path], tmp_path: Path
) -> None:
    """Blocker 1: the worker imported ``nvtx`` unconditionally (ModuleNotFoundError on the lent machine): it now
    falls back to torch.cuda.nvtx. Defect 6: the shim took the balloon at the first cudaMalloc, before lazy module
    loading and library handles; with UVMLAB_BALLOON_DEFER the worker takes it after one warm-up iteration,
    prefetching live managed memory to the host first, and records the free memory before and after it.
    Defect 5 on the real path: prefetch-next-kernel's prefetches go on a side stream of the runtime."""
    run = _rundir(tmp_path)
    total, context, leave = 4 * GiB, 1 * GiB, 600 * MiB
    # a managed range of the process, resident on the GPU before the balloon (as the job's cached segments are)
    env = _clean_env(
        built,
        tmp_path,
        LD_PRELOAD=f"{built['shim']}:{built['cudart99']}",
        UVMLAB_SHIM_MODE="managed",
        UVMLAB_BALLOON_DEFER="1",
        UVMLAB_BALLOON_LEAVE_BYTES=str(leave),
        UVMLAB_ALLOC_LOG=str(run / "logs" / "run.alloc.bin"),
        UVMLAB_WARMUP_ITERATIONS="1",
        UVMLAB_HINTS="prefetch-next-kernel",
        FAKE_CUDART_TOTAL_BYTES=str(total),
        FAKE_CUDART_CONTEXT_BYTES=str(context),
        FAKE_CUDART_PAGEABLE_ACCESS="1",  # the CPU tensors' addresses are system memory to the stub
    )
    argv = [sys.executable, "-m", "uvmlab.measure.gpu.worker", str(run), "--role", "run", "--device", "cpu",
            "--cudart", str(built["cudart99"])]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((run / "logs" / "run.worker.json").read_text())
    assert doc["nvtx_ranges"] == "torch.cuda.nvtx" and doc["outcome"] == "ok"
    assert len(doc["warmup_iterations"]) == 1 and len(doc["iterations"]) == 2
    b = doc["balloon_after_warmup"]
    free = total - context
    assert b["taken"] and b["free_before_bytes"] == free
    assert b["balloon_bytes"] == (free - leave) // (2 * MiB) * (2 * MiB) and b["free_after_bytes"] == leave
    assert doc["machine"]["device_attributes"]["concurrent_managed_access"] == 1
    assert doc["machine"]["virtualization"]["runtime"] in ("gvisor", "firecracker", "vm", "none detected")
    probe = doc["capacity_probe"][-1]
    assert probe["free_bytes"] == leave and probe["settled"] and probe["balloon_bytes"] == b["balloon_bytes"]
    calls = (tmp_path / "cudart.log").read_text().splitlines()
    side = next(c for c in calls if c.startswith("cudaStreamCreateWithFlags")).split()[1].split("=")[1]
    prefetches = [c for c in calls if c.startswith("cudaMemPrefetchAsync")]
    assert prefetches and all(f"stream={side}" in c and c.endswith("-> 0") for c in prefetches)
    assert any(c.startswith("cudaStreamWaitEvent stream=(nil)") for c in calls)  # compute waits for the prefetch
    balloon = [i for i, c in enumerate(calls) if c.startswith("cudaMalloc ptr=")]
    first_prefetch = calls.index(prefetches[0])
    assert balloon and balloon[0] > first_prefetch  # the warm-up iteration ran before the balloon


def test_the_deferred_balloon_evicts_live_managed_memory_first(built: dict[str, Path], tmp_path: Path) -> None:
    """With managed pages resident when the balloon is taken, free memory counts them as used: the balloon would be
    short by what UVM can evict. uvmlab_balloon_take prefetches every live managed range to the host first."""
    code = f"""
import ctypes
stub = ctypes.CDLL({str(built["cudart"])!r}, mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
p = ctypes.c_void_p()
assert g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(512 << 20)) == 0  # managed under the shim; no balloon yet
assert g.uvmlab_balloon_bytes() == 0
stub.fake_cudart_gpu_touch(p, ctypes.c_size_t(512 << 20))  # a kernel touched it: resident
evicted = ctypes.c_size_t()
g.uvmlab_balloon_take.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
print(g.uvmlab_balloon_take(ctypes.byref(evicted)), evicted.value >> 20, g.uvmlab_balloon_bytes() >> 20)
"""
    env = _clean_env(
        built,
        tmp_path,
        LD_PRELOAD=str(built["shim"]),
        UVMLAB_BALLOON_DEFER="1",
        UVMLAB_BALLOON_LEAVE_BYTES=str(256 * MiB),
        FAKE_CUDART_TOTAL_BYTES=str(2 * GiB),
        FAKE_CUDART_CONTEXT_BYTES=str(256 * MiB),
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # free 1792 MiB once the 512 MiB went back to the host: balloon 1792 - 256 = 1536 MiB (not 1024)
    assert proc.stdout.split() == ["0", "512", "1536"]
    calls = (tmp_path / "cudart.log").read_text().splitlines()
    order = [c.split()[0] for c in calls if not c.startswith(("cudaGetDevice", "fake_cudart"))]
    i = order.index("cudaMemPrefetchAsync")
    assert order[i : i + 4] == ["cudaMemPrefetchAsync", "cudaDeviceSynchronize", "cudaMemGetInfo", "cudaMalloc"]


# ---- defect 4: the same cuDNN workspace limit in both runs, engines recorded --------------------------------------
def test_the_shim_reports_the_same_free_memory_to_both_runs_and_the_probe_reads_the_real_one(
    built: dict[str, Path], tmp_path: Path
) -> None:
    """Defect 4: PyTorch caps cuDNN workspaces by cudaMemGetInfo's free memory (CUDACachingAllocator cacheInfo),
    which is a few GiB under the balloon and ~139 GiB in the baseline: the runs chose different algorithms. With
    UVMLAB_REPORT_FREE_BYTES the interposed cudaMemGetInfo answers that figure in both (passthrough and managed),
    while uvmlab_real_mem_get_info (the worker's probes) still reads the real one."""
    code = """
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
f, t, rf, rt = (ctypes.c_size_t() for _ in range(4))
g.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t)); g.uvmlab_real_mem_get_info(ctypes.byref(rf), ctypes.byref(rt))
print(f.value >> 20, t.value >> 20, rf.value >> 20)
"""
    out = {}
    for mode in ("passthrough", "managed"):
        env = _clean_env(
            built,
            tmp_path,
            LD_PRELOAD=str(built["shim"]),
            UVMLAB_SHIM_MODE=mode,
            UVMLAB_REPORT_FREE_BYTES=str(3 * GiB),
            FAKE_CUDART_TOTAL_BYTES=str(16 * GiB),
            FAKE_CUDART_CONTEXT_BYTES=str((4 if mode == "managed" else 1) * GiB),  # a balloon or not: free differs
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(built["cudart"])], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        out[mode] = proc.stdout.split()
    assert out == {"passthrough": ["3072", "16384", "15360"], "managed": ["3072", "16384", "12288"]}


def test_a_paired_plan_gives_both_steps_the_same_limit_and_compares_their_engines(tmp_path: Path) -> None:
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.measure.gpu.collect import cudnn_engines
    from uvmlab.measure.gpu.plan import GpuRunOptions, plan_run

    cfg = RunConfig(WorkloadConfig("resnet50", batch_size=4), oversub=2.0, mode="gpu")
    plan = plan_run(cfg, GpuRunOptions(footprint=8 * GiB, baseline=True, shim_library="/x.so"), "/RUN")
    base, run = plan.step("baseline").env, plan.step("run").env
    c = plan.balloon.available_bytes
    assert base["UVMLAB_REPORT_FREE_BYTES"] == run["UVMLAB_REPORT_FREE_BYTES"] == str(c)
    assert base["CUDNN_LOGDEST_DBG"].endswith("baseline.cudnn.log") and run["CUDNN_LOGDEST_DBG"].endswith(
        "run.cudnn.log"
    )
    assert run["UVMLAB_BALLOON_DEFER"] == "1" and base["UVMLAB_WARMUP_ITERATIONS"] == run["UVMLAB_WARMUP_ITERATIONS"]
    alone = plan_run(cfg, GpuRunOptions(footprint=8 * GiB, shim_library="/x.so"), "/RUN").step("run").env
    assert "UVMLAB_REPORT_FREE_BYTES" not in alone  # nothing to compare with: the run sees the real figure

    def log(engines: list[int]) -> str:
        return "".join(
            "I! CuDNN (v91200 46) function cudnnBackendExecute() called:\n"
            "i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:\n"
            "i!         engineConfig: type=CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:\n"
            "i!             engine: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:\n"
            f"i!                 globalIndex: type=int64_t; val={e};\n"
            "i! Time: 2026-01-01T00:00:00.000000 (0d+0h+0m+1s since start)\n"
            "i! Process=1; Thread=1; GPU=0; Handle=0x1; StreamId=0x0.\n\n"
            for e in engines
        )

    (tmp_path / "baseline.cudnn.log").write_text(log([28, 7, 28]))
    (tmp_path / "run.cudnn.log").write_text(log([28, 7, 28]))
    assert cudnn_engines(tmp_path)["same"] is True
    (tmp_path / "run.cudnn.log").write_text(log([28, 1, 28]))
    got = cudnn_engines(tmp_path)
    assert got["same"] is False and got["first_difference"] == 1 and got["run"]["distinct"] == ["engine 1", "engine 28"]


# ---- defect 7: capacity bounded when managed bytes are still live -------------------------------------------------
def test_live_managed_bytes_bound_the_capacity_instead_of_counting_as_resident() -> None:
    """Defect 7: capacity = free + every live managed byte assumed all of them on the GPU. Now free + live is an
    upper bound and free a lower one; the factor is a range, and ``ok`` is None when the requested factor is
    inside it (the message says it is bounded). Free memory read until it settles; unsettled reads are said."""
    from uvmlab.measure.gpu.balloon import plan_balloon
    from uvmlab.measure.gpu.collect import effective_factor

    plan = plan_balloon(8 * GiB, 2.0, 80 * GiB, 512 * MiB)  # C = 4 GiB
    probe = {"free_bytes": 3 * GiB, "live_managed_bytes": 1 * GiB, "settled": True, "free_reads": [3 * GiB] * 2}
    eff = effective_factor({"capacity_probe": [probe]}, plan, 0.05, footprint_bytes=8 * GiB)
    assert eff["measured_available_lower_bytes"] == 3 * GiB and eff["measured_available_bytes"] == 4 * GiB
    assert eff["achieved_oversub_bounds"] == [2.0, 8 / 3] and eff["ok"] is None
    assert "between 2.000 and 2.667" in eff["message"]
    off = effective_factor(
        {"capacity_probe": [{**probe, "free_bytes": 1 * GiB}]}, plan, 0.05, footprint_bytes=8 * GiB
    )  # between 4.0 and 8.0: off on the same side whatever is resident
    assert off["ok"] is False
    unsettled = {"free_bytes": 4 * GiB, "live_managed_bytes": 0, "settled": False, "free_reads": [1, 2, 3, 4, 5]}
    eff = effective_factor({"capacity_probe": [unsettled]}, plan, 0.05, footprint_bytes=8 * GiB)
    assert eff["ok"] is True and "still changing over 5 reads" in eff["message"]


def test_free_memory_is_read_until_it_settles() -> None:
    from uvmlab.measure.gpu.worker import settled_free

    reads = iter([(1, 9), (2, 9), (3, 9), (3, 9), (4, 9)])
    got = settled_free(lambda: next(reads), reads=5, interval_s=0, sleep=lambda s: None)
    assert got == {"free_bytes": 3, "total_bytes": 9, "free_reads": [1, 2, 3, 3], "settled": True}
    rising = iter([(i, 9) for i in range(10)])
    assert settled_free(lambda: next(rising), reads=3, interval_s=0, sleep=lambda s: None)["settled"] is False


# ---- blocker 1, doctor: it imports what the worker imports ---------------------------------------------------------
def test_doctor_fails_clearly_when_the_worker_cannot_import_what_it_needs(tmp_path: Path) -> None:
    """Blocker 1: doctor said "ready" on a machine where every --mode gpu run would die at an import. It now runs
    the worker's own import check in a child process and exits 1 with one sentence naming the module."""
    broken = tmp_path / "site" / "torch"  # the CLI itself never imports torch; the worker does
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('torch is broken here (test)')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMLAB_") or k == "UVMLAB_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(broken.parent), str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "doctor", "--format", "json"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the GPU worker cannot import torch" in proc.stderr and "torch is broken here" in proc.stderr
    rows = {r["item"]: r for r in json.loads(proc.stdout)["checks"]}
    assert rows["worker imports"]["ok"] is False
    ok = subprocess.run(
        [sys.executable, "-m", "uvmlab.measure.gpu.worker", "--check-imports"],
        env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True


# ---- low items ---------------------------------------------------------------------------------------------------
def test_the_balloon_is_taken_in_pieces_when_one_cudamalloc_cannot_get_it(built: dict[str, Path], tmp_path: Path):
    """A balloon cudaMalloc that failed was not retried: a fragmented card (no single range that large) gave no
    balloon at all. It is now taken in pieces, halved down to 2 MiB, each logged."""
    from uvmlab.measure.gpu.shim import read_alloc_log

    code = f"""
import ctypes
ctypes.CDLL({str(built["cudart"])!r}, mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
p = ctypes.c_void_p()
assert g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096)) == 0
print(g.uvmlab_balloon_bytes() >> 20)
"""
    env = _clean_env(
        built,
        tmp_path,
        LD_PRELOAD=str(built["shim"]),
        UVMLAB_BALLOON_LEAVE_BYTES=str(256 * MiB),
        UVMLAB_ALLOC_LOG=str(tmp_path / "alloc.bin"),
        FAKE_CUDART_TOTAL_BYTES=str(2 * GiB),
        FAKE_CUDART_CONTEXT_BYTES=str(256 * MiB),
        FAKE_CUDART_MAX_CHUNK_BYTES=str(600 * MiB),
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1536"]  # 1792 free - 256 to leave, in pieces of at most 600 MiB
    log = read_alloc_log(tmp_path / "alloc.bin")
    pieces = log[log["op"] == "balloon_alloc"]
    assert pieces["result"].iloc[0] == 2 and (pieces["result"] == 0).sum() >= 3  # cudaErrorMemoryAllocation first


def test_live_managed_bytes_stay_exact_under_concurrent_free_and_malloc(built: dict[str, Path], tmp_path: Path):
    """The live-bytes map was updated after the real free: another thread could get the same address back in
    between, and its entry was lost (the counter drifted). The stub delays each free after releasing the memory,
    which makes that window wide; two threads churn one size each."""
    code = f"""
import ctypes, threading
ctypes.CDLL({str(built["cudart"])!r}, mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
g.uvmlab_live_managed_bytes.restype = ctypes.c_size_t
held = []
def churn(size):
    for _ in range(300):
        p = ctypes.c_void_p()
        assert g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
        assert g.cudaFree(p) == 0
    p = ctypes.c_void_p()
    assert g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    held.append(size)
ts = [threading.Thread(target=churn, args=(4096,)) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(g.uvmlab_live_managed_bytes(), sum(held))
"""
    env = _clean_env(built, tmp_path, LD_PRELOAD=str(built["shim"]), FAKE_CUDART_FREE_DELAY_US="50")
    env.pop("FAKE_CUDART_LOG")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    live, expected = proc.stdout.split()
    assert live == expected == str(4 * 4096)


def test_fork_while_other_threads_allocate_neither_deadlocks_nor_corrupts(built: dict[str, Path], tmp_path: Path):
    """The fork handler re-constructed the mutexes in the child, leaving whatever another thread was changing half
    done, and the child's exit freed the parent's balloon; every lock is now held across fork and the child drops
    the balloon list. A child forked while threads allocate (a DataLoader worker, a subprocess) reads the counters,
    flushes the log and exits through the shim's exit handler. [It does not call CUDA: a forked child may not.]"""
    code = f"""
import ctypes, os, sys, threading
ctypes.CDLL({str(built["cudart"])!r}, mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
g.uvmlab_live_managed_bytes.restype = ctypes.c_size_t
stop = False
def churn():
    while not stop:
        p = ctypes.c_void_p()
        g.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(8192)); g.cudaFree(p)
ts = [threading.Thread(target=churn) for _ in range(3)]
[t.start() for t in ts]
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        g.uvmlab_live_managed_bytes()
        g.uvmlab_flush_log()
        sys.exit(0)  # exit(): the shim's atexit handler runs (log flush, balloon release)
    assert os.waitpid(pid, 0)[1] == 0
stop = True
[t.join() for t in ts]
print("ok")
"""
    env = _clean_env(built, tmp_path, LD_PRELOAD=str(built["shim"]), UVMLAB_ALLOC_LOG=str(tmp_path / "a.%p.bin"))
    env.pop("FAKE_CUDART_LOG")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_runtime_is_matched_by_its_file_name_only() -> None:
    """find_cudart matched any path containing "libcudart.so" (a folder libcudart.so.d, a libcudart.so.bak)."""
    from uvmlab.measure.gpu.cudart import is_library, loaded_cudart

    maps = "\n".join(
        f"7f00-7f01 r-xp 00000000 08:01 1 {p}"
        for p in ("/opt/libcudart.so.d/libfoo.so", "/x/libcudart.so.bak", "/x/mylibcudart.so.13",
                  "/w/libcudart.so.13.0.96")
    )  # fmt: skip
    assert loaded_cudart(maps) == "/w/libcudart.so.13.0.96"
    assert not is_library("/x/libcudart.so_wrapper.so", "libcudart.so") and is_library(
        "/a/libcudart.so", "libcudart.so"
    )
    assert loaded_cudart(maps.rsplit("\n", 1)[0]) is None


def test_host_memory_is_what_is_available_and_the_machine_is_recorded() -> None:
    from uvmlab.measure.gpu.machine import GVISOR_VERSION_MARK, meminfo, virtualization
    from uvmlab.measure.gpu.plan import host_memory_bytes

    assert host_memory_bytes() == meminfo()["MemAvailable"] <= meminfo()["MemTotal"]
    assert virtualization("4.4.0", f"Linux version 4.4.0 {GVISOR_VERSION_MARK}", "", "")["runtime"] == "gvisor"
    assert virtualization("6.18.44-fc-v236-gpu", "Linux version 6.18.44", "", "")["runtime"] == "firecracker"
    assert virtualization("6.1.0", "Linux version 6.1.0", "", "flags\t: fpu hypervisor")["runtime"] == "vm"
    assert virtualization("6.1.0", "Linux version 6.1.0", "", "flags\t: fpu")["runtime"] == "none detected"


def test_the_h200_spec_has_the_capacity_a_real_h200_reports() -> None:
    """nvidia-smi on the lent H200 shows 143,771 MiB (KINDS.md, 2026-10-27); the spec had 141 GiB = 144,384 MiB."""
    from uvmlab.gpus import GPUS

    assert GPUS["H200"].memory_bytes == 143_771 * MiB


def test_a_stub_free_is_real_cuda_semantics_for_the_shim(built: dict[str, Path]) -> None:
    """cudaFree of a pointer the runtime never gave out is cudaErrorInvalidValue through the shim too, and the
    shim's live bytes are untouched by it."""
    lib = ctypes.CDLL(str(built["cudart"]))
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    assert lib.cudaFree(0x5000) == 1
