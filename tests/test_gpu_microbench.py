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


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch):
    """tests/stubs/fake_cupy.py as ``cupy``, and a GPU that NVML 'sees'."""
    import importlib.util
    import sys

    from uvmlab.measure.gpu import detect

    spec = importlib.util.spec_from_file_location("cupy", STUBS / "fake_cupy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    monkeypatch.setattr(detect, "gpu_status", lambda: detect.GpuStatus(True, "", "Fake GPU", 80 * GiB, "1", "13.0"))
    return mod


@pytest.fixture(scope="module")
def stub_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the stub CUDA runtime is C")
    out = tmp_path_factory.mktemp("cudart") / "libcudart.so.13"
    tail = (str(STUBS / "fake_cudart.c"), "-lpthread")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,--version-script={STUBS / 'libcudart.map'}", "-o", str(out), *tail],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.parametrize("version", [13000, 12080])
@pytest.mark.parametrize("old_cupy", [False, True])
def test_run_microbench_drives_cupy_with_its_real_signatures(
    fake_cupy, stub_cudart, tmp_path, monkeypatch, version: int, old_cupy: bool
) -> None:
    """Defect 1: microbench called ManagedMemory.prefetch(stream, dev), a TypeError with CuPy's keyword-only
    device_id, before measuring anything. Every prefetch now goes through runtime.memPrefetchAsync (same
    signature in all CuPy releases); to the host on CUDA 13 through the runtime itself with a host location."""
    fake_cupy.RUNTIME_VERSION[0] = version
    if old_cupy:
        fake_cupy.MANAGED_CLASS[0] = fake_cupy.OldManagedMemory
    monkeypatch.setattr(mb, "find_loaded_cudart", lambda: str(stub_cudart))
    monkeypatch.setenv("FAKE_CUDART_LOG", str(tmp_path / "cudart.log"))
    monkeypatch.setenv("FAKE_CUDART_VERSION", str(version))
    t = mb.run_microbench(sizes=(2 * MiB,), factors=(1.5,), oversub_capacity_bytes=4 * MiB, repeats=1)
    assert list(t["kind"]) == [*mb.KINDS[:5], "touch_oversub"] and (t["time_ns"] == 1e6).all()
    pre = [c for c in fake_cupy.CALLS if c[0] == "memPrefetchAsync"]
    assert all(c[2] == 2 * MiB and c[4] == 0xABC0 for c in pre)
    host = (tmp_path / "cudart.log").read_text().splitlines() if (tmp_path / "cudart.log").exists() else []
    if version >= 13000:
        # htod + (htod before dtoh) via CuPy; the dtoh itself via the runtime with {Host, 0}
        assert [c[3] for c in pre] == [0, 0]
        assert len(host) == 1 and "loc_type=2 loc_id=0 flags=0" in host[0] and "stream=0xabc0" in host[0]
    else:
        assert [c[3] for c in pre] == [0, 0, -1] and host == []
