"""Microbenchmark fitting (pure, on the CPU): round trip through the model, recorded RTX 5090 numbers, refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError, UnavailableError
from uvmlab.measure.gpu import microbench as mb
from uvmlab.measure.gpu.detect import gpu_status
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.units import GiB, MiB

SIZES = (2 * MiB, 8 * MiB, 64 * MiB, 512 * MiB)


def test_fit_recovers_the_parameters_that_generated_the_timings() -> None:
    truth = dataclasses.replace(
        CostParams(),
        link_bytes_per_s=24e9,
        block_service_ns=31_000.0,
        block_first_gpu_ns=270_000.0,
        evict_fixed_ns=18_000.0,
        batch_turnaround_ns=22_000.0,
    )
    f = mb.fit(mb.synthetic_timings(truth, SIZES))
    for name in mb.param_names():
        assert getattr(f.params, name) == pytest.approx(getattr(truth, name), rel=1e-9), name
    assert f.notes == ()


@settings(max_examples=40, deadline=None)
@given(
    link=st.floats(5e9, 100e9),
    service=st.floats(1, 100_000),  # a measured time is never 0
    first=st.floats(0, 1e6),
    evict=st.floats(0, 100_000),
    turn=st.floats(0, 100_000),
)
def test_round_trip_property(link, service, first, evict, turn) -> None:
    truth = dataclasses.replace(
        CostParams(),
        link_bytes_per_s=link,
        block_service_ns=service,
        block_first_gpu_ns=first,
        evict_fixed_ns=evict,
        batch_turnaround_ns=turn,
    )
    got = mb.fit_params(mb.synthetic_timings(truth, SIZES))
    for name in mb.param_names():
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-3), name


def test_missing_kinds_keep_defaults_and_say_so() -> None:
    t = pd.DataFrame([("prefetch_htod", 64 * MiB, 1.0, 3e6)], columns=list(mb.TIMING_COLUMNS))
    f = mb.fit(t)
    d = CostParams()
    assert f.params.block_service_ns == d.block_service_ns and f.params.evict_fixed_ns == d.evict_fixed_ns
    assert any(n.startswith("block_service_ns: needs touch_host") for n in f.notes)
    assert f.link_bytes_per_s == pytest.approx(
        64 * MiB / 3e-3 / float(mb._curve_factor(pd.Series([64.0 * MiB]).to_numpy())[0])
    )


def test_recorded_rtx5090_oversubscription_numbers(real_data: Path) -> None:
    """gpu_ext uvmbench seq_stream (one byte per 4 KiB page, in order) at 1.25x and 1.5x of a 31.36 GiB card: the
    steady-state cost per 2 MiB block, and what it implies with a PCIe 5 link at 46 GB/s (uvmlab.gpus)."""
    csv = pd.read_csv(real_data / "uvm" / "gpu_ext_rtx5090_microbench" / "t0rq3_results.csv")
    rows = csv[(csv["kernel"] == "seq_stream") & (csv["mode"] == "uvm") & (csv["size_factor"] > 1.0)]
    t = pd.DataFrame(
        {
            "kind": "touch_oversub",
            "size_bytes": rows["working_set_bytes"],
            "factor": rows["size_factor"],
            "time_ns": rows["median_ms"] * 1e6,
        }
    )
    f = mb.fit(t, link_bytes_per_s=46e9)
    # by hand: (20069 * 1931.438 + 24082 * 1973.304) / (20069^2 + 24082^2) ms per block
    assert f.per_block_ns["touch_oversub"] == pytest.approx(87_780, rel=2e-3)
    # 87.8 us per block is below two 2 MiB transfers at 46 GB/s (91.2 us): the model cannot place an eviction cost
    assert f.params.evict_fixed_ns == 0.0
    assert any(n.startswith("evict_fixed_ns: fitted") for n in f.notes)
    # if HtoD and DtoH overlapped on two copy engines (an effective 100 GB/s), the same data leaves ~16 us
    fast = mb.fit(t, link_bytes_per_s=100e9)
    t2 = 2 * MiB / 100e9 * 1e9
    assert fast.params.evict_fixed_ns == pytest.approx(f.per_block_ns["touch_oversub"] - 30_000 - 2 * t2)
    assert 10_000 < fast.params.evict_fixed_ns < 20_000


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"kind": ["touch_host"], "size_bytes": [1]}), "lack columns"),
        (pd.DataFrame([("warp_drive", 1, 1.0, 1.0)], columns=list(mb.TIMING_COLUMNS)), "unknown microbenchmark kinds"),
        (pd.DataFrame([("touch_host", 0, 1.0, 1.0)], columns=list(mb.TIMING_COLUMNS)), "size_bytes > 0"),
    ],
)
def test_bad_timings_refused(frame: pd.DataFrame, message: str) -> None:
    with pytest.raises(InputError, match=message):
        mb.fit(frame)


def test_fitted_params_write_the_costparams_file(tmp_path: Path) -> None:
    truth = dataclasses.replace(CostParams(), link_bytes_per_s=20e9)
    timings = mb.synthetic_timings(truth, SIZES)
    doc = mb.write_fit(mb.fit(timings), timings, tmp_path / "p.json", "test")
    assert CostParams.from_file(tmp_path / "p.json") == mb.fit(timings).params
    assert doc["schema_version"] == 1 and doc["source"] == "test" and sorted(doc["fitted"]) == sorted(mb.param_names())
    partial = timings[timings["kind"] == "touch_host"]
    doc = mb.write_fit(mb.fit(partial), partial, tmp_path / "q.json", "test")
    assert doc["fitted"] == [] and "needs" in doc["source"]  # no link: nothing could be fitted, and it says why


def test_run_microbench_refuses_without_a_gpu() -> None:
    if gpu_status().available:
        pytest.skip("a GPU is present")
    with pytest.raises(UnavailableError, match=r"^microbenchmarks need an NVIDIA GPU: "):
        mb.run_microbench()
    with pytest.raises(UnavailableError):
        mb.calibrate_microbench("/nonexistent/p.json")
    assert GiB  # units import used by the module's defaults


STUBS = Path(__file__).parent / "stubs"
SITE = STUBS / "site"
"""Fakes importable as ``cupy`` and ``pynvml`` (tests/stubs/site/cupy.py, tests/stubs/site/pynvml.py)."""


@pytest.fixture(scope="module")
def stub_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the stub CUDA runtime is C")
    out = tmp_path_factory.mktemp("cudart") / "libcudart.so.13"
    tail = (str(STUBS / "fake_cudart.c"), "-lpthread")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,--version-script={STUBS / 'libcudart.map'}", "-Wl,-soname,libcudart.so.13",
         "-o", str(out), *tail],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return out


_CHILD = """
import json, sys
import cupy
from uvmlab.measure.gpu import microbench as mb
from uvmlab.measure.gpu.cudart import loaded_cudart
assert "torch" not in sys.modules and loaded_cudart() is None, loaded_cudart()  # CuPy's linking: no libcudart
if sys.argv[1] == "old":
    cupy.MANAGED_CLASS[0] = cupy.OldManagedMemory
t = mb.run_microbench(sizes=(2 << 20,), factors=(1.5, 3.0), oversub_capacity_bytes=4 << 20, repeats=1)
print(json.dumps({"kinds": list(t["kind"]), "times": list(t["time_ns"]), "factors": list(t["factor"]),
                  "sizes": [int(x) for x in t["size_bytes"]], "calls": [list(c) for c in cupy.CALLS
                  if c[0] in ("memPrefetchAsync", "malloc", "free")],
                  "order": [c[1] if c[0] == "kernel" else c[0] for c in cupy.CALLS
                            if c[0] in ("kernel", "event_record", "memPrefetchAsync")]}))
"""


@pytest.mark.parametrize("version", [13000, 12080])
@pytest.mark.parametrize("old_cupy", [False, True])
def test_run_microbench_drives_cupy_with_its_real_signatures_and_linking(
    stub_cudart: Path, tmp_path: Path, version: int, old_cupy: bool
) -> None:
    """Issue 14 defect 1: ManagedMemory.prefetch(stream, dev) was a TypeError with CuPy's keyword-only device_id;
    every prefetch now goes through runtime.memPrefetchAsync (same signature in all CuPy releases).
    Issue 26 defect 1: CuPy links the CUDA runtime statically, so a process that never imports torch has no
    libcudart loaded and the host-bound prefetch on CUDA 13 raised UnavailableError. The child process here has
    CuPy's real linking (asserted: no libcudart in /proc/self/maps); the runtime is loaded by path
    ($UVMLAB_CUDART, the stub) and gets the host location.
    Issue 26 defect 2: the balloon left C + 256 MiB free and UVM used it all, so the rows ran at 0.8x the factor
    they named; it now leaves exactly C, and each row's factor is its size over the free memory measured after
    the balloon."""
    import json
    import os
    import subprocess
    import sys

    free, cap = 64 << 20, 4 << 20
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_", "LD_", "CUDA_VISIBLE"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE), str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]),
        UVMLAB_CUDART=str(stub_cudart),
        FAKE_CUDART_LOG=str(tmp_path / "cudart.log"),
        FAKE_CUDART_VERSION=str(version),
        FAKE_CUDART_PAGEABLE_ACCESS="1",  # CuPy's managed buffers come from its own (static) runtime: not this stub's
        FAKE_CUPY_RUNTIME_VERSION=str(version),
        FAKE_CUPY_FREE_BYTES=str(free),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, "old" if old_cupy else "new"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kinds"] == [*mb.KINDS[:5], "touch_oversub", "touch_oversub"] and min(got["times"]) > 0
    pre = [c for c in got["calls"] if c[0] == "memPrefetchAsync"]
    assert all(c[2] == 2 * MiB and c[4] == 0xABC0 for c in pre)
    host = (tmp_path / "cudart.log").read_text().splitlines() if (tmp_path / "cudart.log").exists() else []
    if version >= 13000:
        # the untimed warm-up's htod, then htod + (htod before dtoh) via CuPy; each dtoh via the runtime loaded by
        # path, with {Host, 0}: the first one (which loads and initialises that runtime) is the warm-up's
        assert [c[3] for c in pre] == [0, 0, 0]
        assert len(host) == 2 and all("loc_type=2 loc_id=0 flags=0" in h and "stream=0xabc0" in h for h in host)
        assert all(h.endswith("-> 0") for h in host)
    else:
        assert [c[3] for c in pre] == [0, -1, 0, 0, -1] and host == []
    balloon = [c for c in got["calls"] if c[0] == "malloc"]
    assert balloon == [["malloc", free - cap]]  # UVM gets exactly C: nothing is left for it beyond
    assert got["sizes"][-2:] == [6 * MiB, 12 * MiB] and got["factors"][-2:] == [1.5, 3.0]


def test_the_stub_runtime_refuses_hints_on_memory_that_is_not_managed(stub_cudart: Path, tmp_path: Path) -> None:
    """The stub answers cudaMemAdvise / cudaMemPrefetchAsync as the CUDA 13 header documents them: managed ranges
    succeed, device memory (cudaMalloc) and unknown host memory fail with cudaErrorInvalidValue (1) unless the
    device reports pageable memory access; cudaDeviceGetAttribute answers attributes 88 and 89."""
    import ctypes
    import os
    import subprocess
    import sys

    code = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, Loc]
lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
m, d = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.cudaMallocManaged(ctypes.byref(m), ctypes.c_size_t(1 << 20), 1) == 0
assert lib.cudaMalloc(ctypes.byref(d), ctypes.c_size_t(1 << 20)) == 0
host = ctypes.create_string_buffer(4096)
dev = Loc(1, 0)
out = [lib.cudaMemAdvise(m, 1 << 20, 1, dev), lib.cudaMemAdvise(d, 1 << 20, 1, dev),
       lib.cudaMemPrefetchAsync(m, 1 << 20, dev, 0, None), lib.cudaMemPrefetchAsync(d, 4096, dev, 0, None),
       lib.cudaMemAdvise(m, (1 << 20) + 4096, 1, dev), lib.cudaMemAdvise(ctypes.addressof(host), 4096, 1, dev)]
v = ctypes.c_int(-5)
out += [lib.cudaDeviceGetAttribute(ctypes.byref(v), 89, 0), v.value]
out += [lib.cudaDeviceGetAttribute(ctypes.byref(v), 88, 0), v.value, lib.cudaDeviceGetAttribute(ctypes.byref(v), 1, 0)]
print(out)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    # with concurrent managed access 0 a prefetch to the device is cudaErrorInvalidDevice (101) whatever the range
    # (cuda_runtime_api.h: the device "must have non-zero value for the device attribute concurrentManagedAccess")
    for pageable, expected in (("0", [0, 1, 0, 1, 1, 1, 0, 1, 0, 0, 1]), ("1", [0, 1, 101, 101, 1, 0, 0, 0, 0, 1, 1])):
        extra = {
            "FAKE_CUDART_PAGEABLE_ACCESS": pageable,
            "FAKE_CUDART_CONCURRENT_MANAGED": "0" if pageable == "1" else "1",
        }
        proc = subprocess.run(
            [sys.executable, "-c", code, str(stub_cudart)], env={**env, **extra}, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert eval(proc.stdout) == expected
    assert ctypes  # the child uses ctypes; the parent loads nothing


def test_timings_are_device_time_only(stub_cudart: Path, tmp_path: Path) -> None:
    """Issue 43 defect 8: each timed region was an event pair around host work (Python, ctypes, and on the first
    host-bound prefetch the loading and initialisation of a second CUDA runtime). Now every timed region is
    [gate kernel, start event, work, end event]: the device waits on the gate while the host enqueues, and the first
    call of each path (kernel module, host prefetch through the runtime loaded by path) is made once before any
    region. The fake CuPy's events measure the host's real time (there is no device), so here they show what a
    region contains; the order of calls is what the GPU sees."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_", "LD_", "CUDA_VISIBLE"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE), str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]),
        UVMLAB_CUDART=str(stub_cudart),
        FAKE_CUDART_PAGEABLE_ACCESS="1",
        FAKE_CUDART_LOG=str(tmp_path / "cudart.log"),
        FAKE_CUPY_FREE_BYTES=str(64 << 20),
    )
    proc = subprocess.run([sys.executable, "-c", _CHILD, "new"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    order = json.loads(proc.stdout.strip().splitlines()[-1])["order"]
    first_region = next(i for i in range(1, len(order)) if order[i - 1] == "gate" and order[i] == "event_record")
    # before the first timed region: the touch kernel ran and both prefetch directions were issued once
    assert "touch" in order[:first_region] and "memPrefetchAsync" in order[:first_region]
    assert (tmp_path / "cudart.log").read_text().count("cudaMemPrefetchAsync") == 2  # the warm-up's and the row's
    # every timed region (a start event the gate precedes) is gate, start, work, end
    starts = [i for i in range(len(order)) if order[i] == "event_record" and order[i - 1] == "gate"]
    assert order[starts[0] - 2 : starts[0] + 1] == ["event_record", "gate", "event_record"]  # the gate, timed once
    assert len(starts) == 1 + 5 + 2  # then one region per row (repeats=1): five kinds and two oversubscribed factors
    inside = []
    for i in starts[1:]:
        end = order.index("event_record", i + 1)
        assert "gate" not in order[i + 1 : end]  # the region closes before the next gate
        inside.append(order[i + 1 : end])
    # the work inside each region; the dtoh prefetch goes through the runtime loaded by path (its log, above)
    assert inside == [["memPrefetchAsync"], [], ["touch"], ["touch"], ["touch"], ["touch"], ["touch"]]
