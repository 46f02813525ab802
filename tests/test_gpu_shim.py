"""The LD_PRELOAD shim, in real child processes, in front of a stub CUDA runtime (tests/stubs/fake_cudart.c) that
records every call, and in front of the real PyTorch libraries (symbol binding only: no GPU here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.measure.gpu import shim

STUBS = Path(__file__).parent / "stubs"
GiB = 1 << 30
MiB = 1 << 20


def _cc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None or shim.find_compiler() is None:
        pytest.skip("gcc/g++ not found: the shim tests build C/C++ code")
    d = tmp_path_factory.mktemp("stubs")
    lib = shim.build_shim(cache_dir=d / "cache")
    cudart = d / "libcudart.so.13"
    _cc(
        "-O1",
        "-shared",
        "-fPIC",
        f"-Wl,--version-script={STUBS / 'libcudart.map'}",
        "-Wl,-soname,libcudart.so.13",
        "-o",
        str(cudart),
        str(STUBS / "fake_cudart.c"),
        "-lpthread",
    )
    client = d / "libfake_client.so"
    _cc(
        "-shared",
        "-fPIC",
        "-o",
        str(client),
        str(STUBS / "fake_client.c"),
        f"-L{d}",
        "-l:libcudart.so.13",
        "-Wl,-rpath,$ORIGIN",
    )
    main = d / "client_main"
    _cc("-o", str(main), str(STUBS / "client_main.c"), f"-L{d}", "-lfake_client", "-Wl,-rpath,$ORIGIN")
    return {"dir": d, "shim": lib, "cudart": cudart, "client": client, "main": main}


def _env(built: dict[str, Path], tmp_path: Path, preload: bool = True, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_CUDART_", "LD_"))}
    env["FAKE_CUDART_LOG"] = str(tmp_path / "cudart.log")
    env["UVMLAB_ALLOC_LOG"] = str(tmp_path / "alloc.bin")
    if preload:
        env["LD_PRELOAD"] = str(built["shim"])
    env.update(extra)
    return env


def _run_main(built: dict[str, Path], tmp_path: Path, *script: str, preload: bool = True, **extra: str):
    proc = subprocess.run(
        [str(built["main"]), *script], env=_env(built, tmp_path, preload, **extra), capture_output=True, text=True
    )
    calls = (tmp_path / "cudart.log").read_text().splitlines() if (tmp_path / "cudart.log").exists() else []
    return proc, calls


def _ptrs(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines()]


def test_client_references_versioned_symbols(built: dict[str, Path]) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found")
    client = subprocess.run(["readelf", "--dyn-syms", "-W", str(built["client"])], capture_output=True, text=True)
    assert re.search(r"UND cudaMalloc@libcudart\.so\.13", client.stdout)
    stub = subprocess.run(["readelf", "--dyn-syms", "-W", str(built["cudart"])], capture_output=True, text=True)
    assert "cudaMalloc@@libcudart.so.13" in stub.stdout
    exported = subprocess.run(["readelf", "--dyn-syms", "-W", str(built["shim"])], capture_output=True, text=True)
    assert re.search(r"FUNC\s+GLOBAL\s+DEFAULT\s+\d+ cudaMalloc$", exported.stdout, re.M)  # unversioned definition


def test_without_shim_cudamalloc_reaches_the_runtime(built: dict[str, Path], tmp_path: Path) -> None:
    proc, calls = _run_main(built, tmp_path, "m1048576", "f", preload=False)
    assert proc.returncode == 0
    assert calls[0].startswith("cudaMalloc ptr=") and "size=1048576" in calls[0]
    assert not any(c.startswith("cudaMallocManaged") for c in calls)


def test_cudamalloc_is_served_by_cudamallocmanaged_and_free_passes_through(built, tmp_path) -> None:
    proc, calls = _run_main(built, tmp_path, "m1048576", "m12345", "f", "f")
    assert proc.returncode == 0, proc.stderr
    p1, p2 = _ptrs(proc.stdout)[:2]
    assert calls == [
        f"cudaMallocManaged ptr={p1} size=1048576 flags=1 -> 0",
        f"cudaMallocManaged ptr={p2} size=12345 flags=1 -> 0",
        f"cudaFree ptr={p2} size=12345 kind=managed -> 0",
        f"cudaFree ptr={p1} size=1048576 kind=managed -> 0",
    ]


def test_size_zero_keeps_cudamalloc_semantics(built, tmp_path) -> None:
    proc, calls = _run_main(built, tmp_path, "m0")
    assert proc.stdout.split()[1] == "0"  # success, as cudaMalloc(0) is; cudaMallocManaged(0) would fail
    assert calls == ["cudaMalloc ptr=(nil) size=0 -> 0"]


def test_balloon_uses_real_cudamalloc_and_is_freed_at_exit(built, tmp_path) -> None:
    proc, calls = _run_main(built, tmp_path, "m4096", "f", UVMLAB_BALLOON_BYTES=str(GiB))
    assert proc.returncode == 0, proc.stderr
    m = re.fullmatch(r"cudaMalloc ptr=(\S+) size=1073741824 -> 0", calls[0])
    assert m, calls
    assert calls[1].startswith("cudaMallocManaged") and "size=4096" in calls[1]
    assert calls[-1] == f"cudaFree ptr={m.group(1)} size=1073741824 kind=device -> 0"
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert list(log["op"]) == ["balloon_alloc", "malloc", "free", "balloon_free"]
    assert log["size_bytes"].iloc[0] == GiB and log["arg"].iloc[0] == -1


def test_balloon_leave_measures_free_memory(built, tmp_path) -> None:
    total, context, leave = 16 * GiB, 256 * MiB, 3 * GiB + 5  # leave is not a 2 MiB multiple: rounding is tested
    proc, calls = _run_main(
        built,
        tmp_path,
        "m4096",
        UVMLAB_BALLOON_LEAVE_BYTES=str(leave),
        FAKE_CUDART_TOTAL_BYTES=str(total),
        FAKE_CUDART_CONTEXT_BYTES=str(context),
    )
    assert proc.returncode == 0, proc.stderr
    free = total - context
    expected = (free - leave) // (2 * MiB) * (2 * MiB)
    assert calls[0] == f"cudaMemGetInfo free={free} total={total} -> 0"
    assert re.fullmatch(rf"cudaMalloc ptr=\S+ size={expected} -> 0", calls[1]), calls[1]
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    row = log[log["op"] == "balloon_alloc"].iloc[0]
    assert row["arg"] == free and row["size_bytes"] == expected


def test_balloon_that_does_not_fit_warns_and_the_program_continues(built, tmp_path) -> None:
    proc, calls = _run_main(built, tmp_path, "m4096", UVMLAB_BALLOON_BYTES=str(64 * GiB))
    assert proc.returncode == 0
    assert "balloon could not be reserved (CUDA error 2)" in proc.stderr
    assert calls[0] == f"cudaMalloc ptr=(nil) size={64 * GiB} -> 2"
    assert calls[1].startswith("cudaMemGetInfo")  # could it fit in pieces? no: more than is free, not retried
    assert calls[2].startswith("cudaMallocManaged")
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert list(log["op"]) == ["balloon_alloc", "malloc"] and list(log["result"]) == [2, 0]


def test_allocation_log_records_every_call_and_parses_back(built, tmp_path) -> None:
    script = ["m1000", "m2000", "f", "m3000", "f", "f", "m0"]
    proc, _ = _run_main(built, tmp_path, *script)
    assert proc.returncode == 0
    printed = [line.split() for line in proc.stdout.splitlines()]
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert list(log["op"]) == ["malloc", "malloc", "free", "malloc", "free", "free", "malloc_device"]
    assert [int(s) for s in log["size_bytes"]] == [1000, 2000, 0, 3000, 0, 0, 0]
    as_hex = [f"{int(p):#x}" if p else "(nil)" for p in log["ptr"]]
    assert as_hex == [p[2] for p in printed]
    assert (log["result"] == 0).all() and (log["duration_ns"] >= 0).all()
    assert log["time_ns"].is_monotonic_increasing
    assert log["pid"].nunique() == 1
    assert shim.managed_footprint_bytes(log) == 3000 + 1000  # m1000 live while m3000 is allocated
    mono, real = shim.log_header_clocks(tmp_path / "alloc.bin")
    assert 0 < mono <= log["time_ns"].iloc[0] and real > 1_600_000_000 * 10**9


@pytest.mark.parametrize(
    ("version", "advise", "expected"),
    [
        (
            "13000",
            "preferred_location_gpu,accessed_by,read_mostly",
            ["advice=3 loc_type=1 loc_id=1", "advice=5 loc_type=1 loc_id=1", "advice=1 loc_type=1 loc_id=1"],
        ),
        ("13000", "preferred_location_cpu", ["advice=3 loc_type=2 loc_id=0"]),
        ("12080", "preferred_location_gpu,accessed_by", ["advice=3 device=1", "advice=5 device=1"]),
    ],
)
def test_advise_and_prefetch_policies_issue_the_calls(built, tmp_path, version, advise, expected) -> None:
    proc, calls = _run_main(
        built,
        tmp_path,
        "m4194304",
        UVMLAB_ADVISE=advise,
        UVMLAB_PREFETCH="on_alloc",
        FAKE_CUDART_DEVICE="1",
        FAKE_CUDART_DEVICE_COUNT="2",  # the stub refuses a device ordinal >= the count (cudaErrorInvalidDevice)
        FAKE_CUDART_VERSION=version,
    )
    assert proc.returncode == 0, proc.stderr
    ptr = _ptrs(proc.stdout)[0]
    assert calls[0] == f"cudaMallocManaged ptr={ptr} size=4194304 flags=1 -> 0"
    advised = [c for c in calls if c.startswith("cudaMemAdvise")]
    assert advised == [f"cudaMemAdvise ptr={ptr} size=4194304 {e} -> 0" for e in expected]
    prefetch = [c for c in calls if c.startswith("cudaMemPrefetchAsync")]
    where = "loc_type=1 loc_id=1 flags=0 stream=(nil)" if version == "13000" else "device=1 stream=(nil)"
    assert prefetch == [f"cudaMemPrefetchAsync ptr={ptr} size=4194304 {where} -> 0"]
    ops = list(shim.read_alloc_log(tmp_path / "alloc.bin")["op"])
    assert ops == ["malloc", *["advise"] * len(expected), "prefetch"]


def test_no_policy_means_no_advise_or_prefetch(built, tmp_path) -> None:
    _, calls = _run_main(built, tmp_path, "m4096")
    assert not any(c.startswith(("cudaMemAdvise", "cudaMemPrefetchAsync")) for c in calls)


@pytest.mark.parametrize("advise", ["none", ",", "none,,none", ""])
def test_advise_none_and_empty_items_ask_for_nothing(built, tmp_path, advise) -> None:
    proc, calls = _run_main(built, tmp_path, "m4096", UVMLAB_ADVISE=advise)
    assert proc.returncode == 0, proc.stderr
    assert calls[0].startswith("cudaMallocManaged") and not any(c.startswith("cudaMemAdvise") for c in calls)


def test_advise_none_beside_an_advice_keeps_the_advice(built, tmp_path) -> None:
    proc, calls = _run_main(
        built,
        tmp_path,
        "m4096",
        UVMLAB_ADVISE="none,read_mostly,",
        FAKE_CUDART_DEVICE="1",
        FAKE_CUDART_DEVICE_COUNT="2",
    )
    assert proc.returncode == 0, proc.stderr
    assert [c.split(" size=")[1] for c in calls if c.startswith("cudaMemAdvise")] == [
        "4096 advice=1 loc_type=1 loc_id=1 -> 0"
    ]


def test_passthrough_mode_keeps_cudamalloc(built, tmp_path) -> None:
    _, calls = _run_main(built, tmp_path, "m4096", "f", UVMLAB_SHIM_MODE="passthrough")
    assert calls[0].startswith("cudaMalloc ptr=") and "size=4096" in calls[0]
    assert calls[1].endswith("kind=device -> 0")
    assert list(shim.read_alloc_log(tmp_path / "alloc.bin")["op"]) == ["malloc_device", "free"]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("UVMLAB_ADVISE", "bogus"),
        ("UVMLAB_PREFETCH", "always"),
        ("UVMLAB_BALLOON_BYTES", "12GB"),
        ("UVMLAB_SHIM_MODE", "fast"),
    ],
)
def test_invalid_environment_stops_the_program_with_one_sentence(built, tmp_path, var, value) -> None:
    proc, calls = _run_main(built, tmp_path, "m4096", **{var: value})
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"uvmlab shim: {var}={value} is not valid")
    assert calls == []


_PY_CLIENT = """
import ctypes, sys, threading
client = ctypes.CDLL(sys.argv[1])  # RTLD_LOCAL: the stub runtime is NOT in the global scope
client.client_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
client.client_free.argtypes = [ctypes.c_void_p]
n_threads, n_each = int(sys.argv[2]), int(sys.argv[3])
def work():
    for i in range(n_each):
        p = ctypes.c_void_p()
        assert client.client_malloc(ctypes.byref(p), 4096 + i) == 0
        assert client.client_free(p) == 0
threads = [threading.Thread(target=work) for _ in range(n_threads)]
[t.start() for t in threads]; [t.join() for t in threads]
lib = ctypes.CDLL(None)
lib.uvmlab_shim_real_library.restype = ctypes.c_char_p
print(lib.uvmlab_shim_real_library().decode())
"""


def test_interposition_wins_for_a_locally_loaded_versioned_client_and_logging_is_thread_safe(built, tmp_path) -> None:
    threads, each = 8, 150
    proc = subprocess.run(
        [sys.executable, "-c", _PY_CLIENT, str(built["client"]), str(threads), str(each)],
        env=_env(built, tmp_path),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(built["cudart"])  # found among the loaded objects, not via RTLD_NEXT
    calls = (tmp_path / "cudart.log").read_text().splitlines()
    assert sum(c.startswith("cudaMallocManaged") for c in calls) == threads * each
    assert not any(c.startswith("cudaMalloc ") for c in calls)
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert len(log) == 2 * threads * each  # buffered across several flushes, none lost, none torn
    assert (log["op"] == "malloc").sum() == threads * each and (log["result"] == 0).all()
    assert sorted(log.loc[log["op"] == "malloc", "size_bytes"].astype(int)) == sorted(
        4096 + i for _ in range(threads) for i in range(each)
    )


_PLUGGABLE = """
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the runtime, as torch loads it
shim = ctypes.CDLL(sys.argv[2])                     # no LD_PRELOAD: the CUDAPluggableAllocator route
shim.uvmlab_malloc.restype = ctypes.c_void_p
shim.uvmlab_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
shim.uvmlab_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
p = shim.uvmlab_malloc(65536, 0, None)
print(hex(p))
shim.uvmlab_free(p, 65536, 0, None)
shim.uvmlab_flush_log()
"""


def test_pluggable_allocator_entry_points(built, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PLUGGABLE, str(built["cudart"]), str(built["shim"])],
        env=_env(built, tmp_path, preload=False, UVMLAB_ADVISE="accessed_by"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    ptr = proc.stdout.strip()
    calls = (tmp_path / "cudart.log").read_text().splitlines()
    assert calls == [
        f"cudaMallocManaged ptr={ptr} size=65536 flags=1 -> 0",
        f"cudaMemAdvise ptr={ptr} size=65536 advice=5 loc_type=1 loc_id=0 -> 0",
        f"cudaFree ptr={ptr} size=65536 kind=managed -> 0",
    ]
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert list(log["op"]) == ["pluggable_malloc", "advise", "pluggable_free"]


def test_pytorch_libc10_cuda_binds_cudamalloc_to_the_shim(built, tmp_path) -> None:
    """The real wheel: libc10_cuda.so's cudaMalloc@libcudart.so.13 binds to the shim; the shim finds the real
    libcudart and forwards to its cudaMallocManaged (which fails here for want of a driver, and that is logged)."""
    pytest.importorskip("torch")
    code = (
        "import torch, ctypes\n"
        "lib = ctypes.CDLL(None)\n"
        "lib.uvmlab_shim_real_library.restype = ctypes.c_char_p\n"
        "print(lib.uvmlab_shim_real_library().decode())\n"
        "p = ctypes.c_void_p()\n"
        "print(lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)))\n"
    )
    env = _env(built, tmp_path, LD_BIND_NOW="1", LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    real, rc = proc.stdout.split()
    assert "libcudart.so.13" in real and "nvidia" in real
    bindings = "".join(p.read_text(errors="replace") for p in tmp_path.glob("ld.*"))
    for sym in ("cudaMalloc", "cudaFree"):
        assert re.search(
            rf"libc10_cuda\.so \[0\] to {re.escape(str(built['shim']))} \[0\]: normal symbol `{sym}'", bindings
        ), f"{sym} of libc10_cuda.so is not bound to the shim"
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    assert list(log["op"]) == ["malloc"] and int(log["result"].iloc[0]) == int(rc) != 0


def test_read_alloc_log_rejects_foreign_and_truncated_files(built, tmp_path) -> None:
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"not a log at all" * 8)
    with pytest.raises(InputError, match="not a uvmlab shim allocation log"):
        shim.read_alloc_log(bad)
    with pytest.raises(InputError, match="not found"):
        shim.read_alloc_log(tmp_path / "missing.bin")
    _run_main(built, tmp_path, "m1000", "m2000")
    data = (tmp_path / "alloc.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:-10])  # the last record cut short: the whole ones are kept
    assert len(shim.read_alloc_log(cut)) == 1


def test_shim_env_validation(tmp_path) -> None:
    env = shim.shim_env(
        "/x/lib.so",
        advise=("accessed_by",),
        prefetch="on_alloc",
        balloon_leave_bytes=10,
        alloc_log=tmp_path / "a.bin",
        existing_preload="/y.so",
    )
    assert env["LD_PRELOAD"] == "/x/lib.so:/y.so" and env["UVMLAB_BALLOON_LEAVE_BYTES"] == "10"
    with pytest.raises(InputError, match="unknown advise policy"):
        shim.shim_env("/x", advise=("everything",))
    with pytest.raises(InputError, match="not both"):
        shim.shim_env("/x", balloon_bytes=1, balloon_leave_bytes=1)
    with pytest.raises(InputError, match="at most one preferred location"):
        shim.shim_env("/x", advise=("preferred_location_gpu", "preferred_location_cpu"))


def test_build_is_cached_and_keyed_by_source(built, tmp_path, monkeypatch) -> None:
    cache = built["shim"].parents[1]
    assert shim.build_shim(cache_dir=cache) == built["shim"]  # no rebuild: same path, same file
    mtime = built["shim"].stat().st_mtime_ns
    assert shim.build_shim(cache_dir=cache) == built["shim"] and built["shim"].stat().st_mtime_ns == mtime
    changed = tmp_path / "uvmlab_shim.cpp"
    changed.write_text(shim.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(shim, "SOURCE", changed)
    assert shim.shim_path(cache) != built["shim"]


def test_top_level_csrc_is_the_packaged_source_and_its_makefile_uses_the_same_flags() -> None:
    repo = Path(__file__).resolve().parents[1]
    assert (repo / "csrc" / "uvmlab_shim.cpp").resolve() == shim.SOURCE
    make = (repo / "csrc" / "Makefile").read_text()
    flags = re.search(r"^CXXFLAGS = (.*)$", make, re.M).group(1).split()
    libs = re.search(r"^LDLIBS = (.*)$", make, re.M).group(1).split()
    assert tuple(flags) == shim.CXX_FLAGS and tuple(libs) == shim.LINK_FLAGS


_FAKE_WORKER = """#!{python}
# Stands in for `python -m uvmlab.measure.gpu.worker RUNDIR --role ROLE` on a machine without a GPU: it allocates
# through
# the global cudaMalloc (the preloaded shim, in front of the stub runtime) and writes what the real worker writes,
# with PyTorch's answers: with PYTORCH_NO_CUDA_MEMORY_CACHING set its allocator counters read 0. Its capacity probe
# reads the stub's cudaMemGetInfo and the shim's counters after freeing everything, as the real worker does.
import ctypes, json, os, sys, time
from pathlib import Path
import pandas as pd
args = sys.argv[1:]
assert args[:2] == ["-m", "uvmlab.measure.gpu.worker"], args
rundir, role = Path(args[2]), args[args.index("--role") + 1]
ctypes.CDLL({cudart!r}, mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(None)
ptrs = []
for size in (700 << 20, 500 << 20):
    p = ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    ptrs.append(p)
if os.environ.get("UVMLAB_BALLOON_DEFER") == "1":  # the real worker: after its warm-up iteration
    lib.uvmlab_balloon_take.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    assert lib.uvmlab_balloon_take(None) == 0
growth = int(os.environ.get("FAKE_WORKER_GROWTH_BYTES", "0"))
if growth and role == "run":  # device memory taken outside UVM after the balloon (e.g. lazily loaded kernels)
    stub, g = ctypes.CDLL({cudart!r}), ctypes.c_void_p()  # the stub's own cudaMalloc, not the shim's
    assert stub.cudaMalloc(ctypes.byref(g), ctypes.c_size_t(growth)) == 0
hints = os.environ.get("UVMLAB_HINTS")
if hints:  # the worker's per-tensor hints (uvmlab.measure.gpu.hints), here on the job's two allocations
    from uvmlab.measure.gpu.hints import ADVISE_READ_MOSTLY, CudaRuntime
    rt = CudaRuntime(ctypes.CDLL({cudart!r}))
    for p, size in zip(ptrs, (700 << 20, 500 << 20)):
        rt.advise(p.value, size, ADVISE_READ_MOSTLY, 0)  # RuntimeError on a CUDA error, as in the worker
t_sample = time.monotonic_ns()
for p in ptrs:
    lib.cudaFree(p)
free, total = ctypes.c_size_t(), ctypes.c_size_t()
# the real figure, as the real worker reads it (the shim may report a fixed free figure to the job: a baseline pair)
assert lib.uvmlab_real_mem_get_info(ctypes.byref(free), ctypes.byref(total)) == 0
counters = {{}}
for name in ("uvmlab_live_managed_bytes", "uvmlab_balloon_bytes"):
    try:
        fn = lib[name]
    except AttributeError:  # a shim without the counter
        counters[name] = None
        continue
    fn.restype = ctypes.c_size_t
    counters[name] = int(fn())
probe = dict(when="after the job's memory was released", free_bytes=free.value, total_bytes=total.value,
             live_managed_bytes=counters["uvmlab_live_managed_bytes"], balloon_bytes=counters["uvmlab_balloon_bytes"])
uncached = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
torch_says = 0 if uncached else None
ms = {{"calibrate": 5, "baseline": 10, "run": 30}}[role]
its = [dict(iteration=i, start_ns=i * 10**9, end_ns=i * 10**9 + ms * 10**6, duration_ns=ms * 10**6) for i in range(3)]
(rundir / "logs").mkdir(parents=True, exist_ok=True)
doc = dict(role=role, outcome="ok", error=None, iterations=its, peak_allocated_bytes=torch_says,
           peak_reserved_bytes=torch_says, capacity_probe=[probe])
(rundir / "logs" / (role + ".worker.json")).write_text(json.dumps(doc))
pd.DataFrame(dict(time_ns=[t_sample], iteration=[0], phase=["end"], allocated_bytes=[torch_says],
                  reserved_bytes=[torch_says], nvml_used_bytes=[None])).to_parquet(
    rundir / "logs" / (role + ".samples.parquet"))
"""


def _stub_run(
    built,
    tmp_path,
    monkeypatch,
    *,
    pca: bool,
    context: int = 256 * MiB,
    strict: bool = False,
    base=True,
    growth: int = 128 * MiB,
    policy: str | None = None,
):
    """run_gpu through the stub runtime (a 16 GiB card whose context and other tenants take ``context``) with
    --footprint measure and --baseline (test_run_gpu_end_to_end_with_the_stub_runtime checks the whole result).
    The run step takes ``growth`` bytes of device memory outside UVM after the balloon (default: the reserve)."""
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.files.rundir import RunDir
    from uvmlab.measure.gpu import runner
    from uvmlab.measure.gpu.detect import GpuStatus

    total = 16 * GiB
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(runner, "gpu_status", lambda: GpuStatus(True, "", "Stub GPU", total, "0", "13.0", 0, 1))
    monkeypatch.setenv("UVMLAB_CACHE", str(built["dir"] / "cache"))  # the shim the fixture built
    for k in [k for k in os.environ if k.startswith(("UVMLAB_", "FAKE_CUDART_")) and k != "UVMLAB_CACHE"]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("FAKE_CUDART_TOTAL_BYTES", str(total))
    monkeypatch.setenv("FAKE_CUDART_CONTEXT_BYTES", str(context))
    monkeypatch.setenv("FAKE_WORKER_GROWTH_BYTES", str(growth))
    monkeypatch.setenv("FAKE_CUDART_LOG", str(tmp_path / "cudart_calls.log"))
    fake = tmp_path / "fake_python"
    fake.write_text(_FAKE_WORKER.format(python=sys.executable, cudart=str(built["cudart"])))
    fake.chmod(0o755)
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=2.0, pca=pca, mode="gpu")
    if policy:
        from uvmlab.advise.policies import get_policy

        cfg = get_policy(policy).apply(cfg)
    extra = {"strict_factor": True} if strict else {}
    opts = runner.GpuRunOptions(
        footprint="measure", baseline=base, python=str(fake), host_memory_bytes=64 * GiB, **extra
    )
    rd = RunDir(tmp_path / "run")
    rd.prepare()
    return rd, runner.run_gpu(cfg, opts, rd)


def test_pca_off_peak_memory_comes_from_the_shim_log(built, tmp_path, monkeypatch) -> None:
    """Defect 2: with PYTORCH_NO_CUDA_MEMORY_CACHING PyTorch's counters read 0, and result.json and the memory table
    said 0. The stub run with caching off: peaks and the memory table come from the shim's log."""
    rd, res = _stub_run(built, tmp_path, monkeypatch, pca=False)
    assert res["peak_allocated_bytes"] == res["peak_reserved_bytes"] == 1200 * MiB
    mem = rd.read_table("memory")
    assert list(mem["allocated_bytes"]) == list(mem["reserved_bytes"]) == [1200 * MiB]  # at the sample's time
    assert res["native_pca_time_ns"] is None and res["slowdown_vs_native"] == 3.0  # baseline ran with PCA off


def test_the_effective_factor_is_measured_and_a_short_one_is_loud(built, tmp_path, monkeypatch, capsys) -> None:
    """Issue 14 defect 4 and the effective factor; issue 26 defect 2. The balloon leaves C + R free and UVM fills
    all free memory before it evicts (block_alloc_gpu_chunk), so the run's capacity is C + R minus what the
    process takes outside UVM after the balloon: C when that is R (achieved = f), C + R when it is nothing
    (achieved = M / (C + R): here 1.648, a warning; the old arithmetic subtracted R and said 2.000, ok). On a card
    whose free memory is already below C + R no balloon is taken, the shim says so, and the result records both
    factors and warns (``--strict-factor``: an error, after result.json is written)."""
    _rd, res = _stub_run(built, tmp_path / "roomy", monkeypatch, pca=True)  # takes R = 128 MiB after the balloon
    eff = res["gpu_run"]["effective"]
    assert eff["measured_available_bytes"] == 600 * MiB and eff["achieved_oversub"] == 2.0 and eff["ok"] is True
    assert eff["non_uvm_after_balloon_bytes"] == 128 * MiB and eff["footprint_bytes"] == 1200 * MiB
    assert eff["message"] is None and res["native_pca_time_ns"] == 10e6 and res["slowdown_vs_native_pca"] == 3.0
    assert res["effective_oversub"] == 2.0

    _rd, res = _stub_run(built, tmp_path / "nogrowth", monkeypatch, pca=True, growth=0)
    eff = res["gpu_run"]["effective"]
    assert eff["measured_available_bytes"] == 728 * MiB and eff["non_uvm_after_balloon_bytes"] == 0
    assert eff["achieved_oversub"] == pytest.approx(1200 / 728) and eff["ok"] is False
    assert "measured factor is 1.648, not the requested 2" in capsys.readouterr().err

    busy = 16 * GiB - 640 * MiB  # e.g. another process on the GPU: free 640 MiB < leave 728 MiB, no balloon
    rd, res = _stub_run(built, tmp_path / "small", monkeypatch, pca=True, context=busy, base=False)
    eff = res["gpu_run"]["effective"]
    assert res["gpu_run"]["balloon_actual"]["balloon_bytes"] == 0
    assert eff["measured_available_bytes"] == 640 * MiB - 128 * MiB
    assert eff["achieved_oversub"] == pytest.approx(1200 / 512) and eff["ok"] is False
    assert "WARNING: the run's measured factor is 2.344, not the requested 2" in capsys.readouterr().err
    assert "no balloon" in (rd.logs / "run.err").read_text()

    from uvmlab.errors import UvmlabError

    with pytest.raises(UvmlabError, match=r"--strict-factor: WARNING: the run.s measured factor is 2\.344"):
        _stub_run(built, tmp_path / "strict", monkeypatch, pca=True, context=busy, strict=True, base=False)
    doc = json.loads((tmp_path / "strict" / "run" / "result.json").read_text())
    assert doc["gpu_run"]["effective"]["achieved_oversub"] == pytest.approx(1200 / 512) and doc["oversub"] == 2.0


@pytest.mark.parametrize("policy", ["read-mostly-parameters", "remote-optimizer-state", "prefetch-next-kernel"])
def test_hint_policies_with_a_baseline_run_on_managed_memory_only(built, tmp_path, monkeypatch, policy) -> None:
    """Issue 26 defect 4: the baseline step (device memory, shim in passthrough) got UVMLAB_HINTS too, and
    cudaMemAdvise on device memory is cudaErrorInvalidValue (the stub answers as the CUDA 13 header says), so the
    worker raised RuntimeError and --baseline failed. Hints now reach only the steps whose memory is managed."""
    rd, res = _stub_run(built, tmp_path, monkeypatch, pca=True, policy=policy)
    assert res["native_time_ns"] == 10e6  # the baseline ran
    calls = (tmp_path / "cudart_calls.log").read_text().splitlines()
    advised = [c for c in calls if c.startswith("cudaMemAdvise")]
    assert len(advised) == 4 and all(c.endswith("-> 0") for c in advised)  # calibrate and run, two ranges each
    env = json.loads(rd.config_json.read_text())
    assert env["policy"] == policy


def test_run_gpu_end_to_end_with_the_stub_runtime(built, tmp_path, monkeypatch) -> None:
    """The whole GPU pipeline minus the GPU: plan -> calibrate (real shim, real log) -> measured footprint ->
    re-plan -> baseline + run (balloon reserved by the shim in leave mode) -> collect -> result.json."""
    total, context = 16 * GiB, 256 * MiB  # _stub_run's card
    rd, res = _stub_run(built, tmp_path, monkeypatch, pca=True, context=context)

    footprint = 1200 * MiB  # both allocations live at once: the calibrate step's peak managed bytes
    capacity = 600 * MiB
    leave = capacity + 128 * MiB  # C + R (uvmlab.measure.gpu.balloon.DEFAULT_RESERVE_BYTES)
    free = total - context
    assert res["footprint_bytes"] == footprint and res["available_bytes"] == capacity
    assert res["gpu_run"]["footprint_source"].startswith("measured")
    assert res["gpu_run"]["balloon_actual"] == {
        "balloon_bytes": (free - leave) // (2 * MiB) * (2 * MiB),
        "free_before_bytes": free,
        "result": 0,
    }
    assert res["iteration_time_ns"] == 30e6 and res["native_time_ns"] == 10e6 and res["slowdown_vs_native"] == 3.0
    allocs = rd.read_table("shim_allocations")
    assert sorted(set(allocs["role"])) == ["baseline", "calibrate", "run"]
    by_role = {r: list(g["op"]) for r, g in allocs.groupby("role")}
    assert by_role["calibrate"] == ["malloc", "malloc", "free", "free"]
    assert by_role["baseline"] == ["malloc_device", "malloc_device", "free", "free"]  # passthrough: no UVM
    # the balloon after the job's first allocations (the worker's warm-up; issue 43 defect 6), its live managed
    # ranges prefetched to the host first
    assert by_role["run"] == [
        "malloc",
        "malloc",
        "prefetch",
        "prefetch",
        "balloon_alloc",
        "free",
        "free",
        "balloon_free",
    ]
    assert rd.is_complete() and json.loads(rd.config_json.read_text())["gpu_options"]["footprint"] == "measure"
    logs = [p for p in rd.logs.iterdir() if p.is_file()]  # what the steps wrote is uvmlab's: --force removes it
    assert logs and all(rd.owns(p) for p in logs), [p.name for p in logs if not rd.owns(p)]


_PARENT_AND_CHILD = """
import ctypes, subprocess, sys
client = ctypes.CDLL(sys.argv[1])
client.client_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p()
assert client.client_malloc(ctypes.byref(p), 4096) == 0  # inflates the balloon in this process
subprocess.run([sys.argv[2], "m8192"], check=True)       # inherits LD_PRELOAD and the balloon variables
"""


def test_a_child_process_does_not_reserve_a_second_balloon(built, tmp_path) -> None:
    claim = tmp_path / "run.balloon.claim"
    proc = subprocess.run(
        [sys.executable, "-c", _PARENT_AND_CHILD, str(built["client"]), str(built["main"])],
        env=_env(built, tmp_path, UVMLAB_BALLOON_BYTES=str(GiB), UVMLAB_BALLOON_CLAIM=str(claim)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "cudart.log").read_text().splitlines()
    assert sum(c.startswith("cudaMalloc ") and f"size={GiB}" in c for c in calls) == 1
    assert sum(c.startswith("cudaMallocManaged") for c in calls) == 2  # parent 4096 and child 8192
    log = shim.read_alloc_log(tmp_path / "alloc.bin")  # both processes append to the same log
    assert log["pid"].nunique() == 2 and (log["op"] == "balloon_alloc").sum() == 1
    owner = int(claim.read_text())
    assert owner == int(log.loc[log["op"] == "balloon_alloc", "pid"].iloc[0])  # the parent took it
    # issue 26 defect 6: the child's skipped balloon is said (it used to be, with UVMLAB_SHIM_VERBOSE=1 only)
    child = int(log.loc[log["pid"] != owner, "pid"].iloc[0])
    assert f"{claim} exists: another process of this step holds the balloon, so process {child} takes none" in (
        proc.stderr
    )


_GETENV_AFTER_BALLOON = """
import ctypes, sys
client = ctypes.CDLL(sys.argv[1])
client.client_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p()
assert client.client_malloc(ctypes.byref(p), 4096) == 0  # inflates the balloon
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
print(libc.getenv(b"UVMLAB_BALLOON_DONE"))
"""


def test_the_shim_never_changes_the_environment(built, tmp_path) -> None:
    """Defect 6: setenv in the shim raced with getenv in other threads; the balloon no longer touches environ."""
    proc = subprocess.run(
        [sys.executable, "-c", _GETENV_AFTER_BALLOON, str(built["client"])],
        env=_env(built, tmp_path, UVMLAB_BALLOON_BYTES=str(GiB)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"
    assert "setenv(" not in shim.SOURCE.read_text() and "putenv(" not in shim.SOURCE.read_text()


def test_an_inherited_balloon_marker_does_not_disable_the_balloon(built, tmp_path) -> None:
    """Defect 5 (shim side): a stray UVMLAB_BALLOON_DONE from a parent's environment used to skip the balloon."""
    proc, calls = _run_main(built, tmp_path, "m4096", UVMLAB_BALLOON_BYTES=str(GiB), UVMLAB_BALLOON_DONE="1234")
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == calls[0].split(" size=")[0] + f" size={GiB} -> 0" and calls[0].startswith("cudaMalloc ")


def test_no_room_for_a_balloon_is_said_and_logged(built, tmp_path) -> None:
    """Defect 4: free memory already at or below the amount to leave: the shim took no balloon and said nothing."""
    total, context = 4 * GiB, 256 * MiB
    free = total - context
    proc, calls = _run_main(
        built,
        tmp_path,
        "m4096",
        FAKE_CUDART_TOTAL_BYTES=str(total),
        FAKE_CUDART_CONTEXT_BYTES=str(context),
        UVMLAB_BALLOON_LEAVE_BYTES=str(free + MiB),
    )
    assert proc.returncode == 0
    assert not any(c.startswith("cudaMalloc ") for c in calls)  # nothing reserved
    assert "WARNING" in proc.stderr and "no balloon" in proc.stderr and str(free) in proc.stderr
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    b = log[log["op"] == "balloon_alloc"]
    assert len(b) == 1 and int(b["size_bytes"].iloc[0]) == 0 and int(b["arg"].iloc[0]) == free


_LIVE_BYTES = """
import ctypes, sys
client = ctypes.CDLL(sys.argv[1])
client.client_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
client.client_free.argtypes = [ctypes.c_void_p]
live = ctypes.CDLL(None).uvmlab_live_managed_bytes
live.restype = ctypes.c_size_t
a, b = ctypes.c_void_p(), ctypes.c_void_p()
client.client_malloc(ctypes.byref(a), 3 << 20)
client.client_malloc(ctypes.byref(b), 5 << 20)
print(live())
client.client_free(a)
print(live())
"""


def test_live_managed_bytes_follow_allocations_and_frees(built, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _LIVE_BYTES, str(built["client"])],
        env=_env(built, tmp_path, UVMLAB_BALLOON_BYTES=str(GiB)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(8 << 20), str(5 << 20)]  # the balloon is not managed memory


def test_an_unwritable_log_disables_logging_but_not_the_program(built, tmp_path) -> None:
    proc, calls = _run_main(built, tmp_path, "m4096", "f", UVMLAB_ALLOC_LOG=str(tmp_path / "no" / "such" / "a.bin"))
    assert proc.returncode == 0
    assert "cannot open UVMLAB_ALLOC_LOG" in proc.stderr and "allocation log disabled" in proc.stderr
    assert calls[0].startswith("cudaMallocManaged")
