"""gpu_status(): cheap, never raises, one sentence when there is no GPU; doctor and the shim commands."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.errors import UnavailableError
from uvmlab.measure.gpu import detect
from uvmlab.measure.gpu.detect import gpu_status


class _NVMLError(Exception):
    pass


# NVML index -> (name, PCI bus id, UUID): NVML's index order is not the PCI order here (NVML promises none).
_GPUS = [
    ("NVIDIA A100 80GB PCIe", "00000000:81:00.0", "GPU-aaaaaaaa-0000-0000-0000-000000000000"),
    ("NVIDIA GeForce RTX 4090", "00000000:01:00.0", "GPU-bbbbbbbb-0000-0000-0000-000000000000"),
    ("NVIDIA H100 PCIe", "00000000:41:00.0", "GPU-cccccccc-0000-0000-0000-000000000000"),
]


def _fake_pynvml(count: int = 1, init_error: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError

    def init() -> None:
        if init_error:
            raise _NVMLError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetIndex = lambda h: h[1]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=_GPUS[h[1]][1].encode())
    m.nvmlDeviceGetUUID = lambda h: _GPUS[h[1]][2]

    def by_uuid(u: str) -> tuple[str, int]:
        for i, g in enumerate(_GPUS[:count]):
            if g[2] == u:
                return ("handle", i)
        raise _NVMLError("Not Found")

    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetName = lambda h: _GPUS[h[1]][0].encode()
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=85899345920, used=1 << 30)
    m.nvmlSystemGetDriverVersion = lambda: "580.95.05"
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000
    return m


def test_this_machine_has_no_gpu_and_says_what_is_missing() -> None:
    st = gpu_status()
    if st.available:
        pytest.skip("a GPU is present on this machine")
    assert st.reason and "\n" not in st.reason and st.reason.count(". ") == 0
    with pytest.raises(UnavailableError) as exc:
        st.require()
    assert str(exc.value).startswith("--mode gpu needs an NVIDIA GPU: ") and exc.value.exit_code == 2


def test_available_gpu_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    st = gpu_status(env={})
    assert st.available and st.reason == ""
    assert (st.name, st.memory_bytes, st.driver, st.cuda, st.index) == (
        "NVIDIA A100 80GB PCIe",
        85899345920,
        "580.95.05",
        "13.0",
        0,
    )
    assert st.require() is st


@pytest.mark.parametrize(
    ("env", "count", "init_error", "needle"),
    [
        ({"CUDA_VISIBLE_DEVICES": ""}, 1, False, "hides every GPU"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 1, False, "hides every GPU"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 2, False, "sees only 2 GPU"),
        ({}, 0, False, "reports no GPU"),
        ({}, 1, True, "NVML"),
    ],
)
def test_unavailable_reasons(monkeypatch, env, count, init_error, needle) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count, init_error))
    st = gpu_status(env=env)
    assert not st.available and needle in st.reason


@pytest.mark.parametrize(
    ("env", "name", "index"),
    [
        ({}, "NVIDIA GeForce RTX 4090", 1),  # CUDA device 0 = lowest PCI bus id, not NVML index 0
        ({"CUDA_VISIBLE_DEVICES": "1"}, "NVIDIA H100 PCIe", 2),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, "NVIDIA A100 80GB PCIe", 0),
        ({"CUDA_VISIBLE_DEVICES": "GPU-cccccccc-0000-0000-0000-000000000000"}, "NVIDIA H100 PCIe", 2),
        ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, "NVIDIA GeForce RTX 4090", 1),  # a unique prefix, as CUDA accepts
    ],
)
def test_the_gpu_cuda_will_use_is_the_one_described(monkeypatch, env, name, index) -> None:
    """Defect 6: the NVML device was the first NUMBER of CUDA_VISIBLE_DEVICES taken as an NVML index (UUIDs ignored),
    so on a mixed host NVML described another GPU than the run used."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(3))
    st = gpu_status(env=env)
    assert st.available, st.reason
    assert (st.name, st.index) == (name, index)


def test_an_ambiguous_uuid_prefix_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(3))
    st = gpu_status(env={"CUDA_VISIBLE_DEVICES": "GPU-"})
    assert not st.available and "matches 3 of the 3 GPU(s)" in st.reason


def test_missing_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    st = detect.gpu_status(env={})
    assert not st.available and "nvidia-ml-py" in st.reason


def test_doctor_json_lists_every_probe_and_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    items = [c["item"] for c in doc["checks"]]
    assert items == [
        *("GPU", "NVIDIA driver", "CUDA runtime", "torch", "worker imports", "nsys", "g++", "shim", "nvidia-ml-py"),
        "cupy",
    ]
    modes = {m["item"]: m for m in doc["modes"]}
    assert modes["run --mode sim"]["ok"] is True
    gpu_ok = next(c for c in doc["checks"] if c["item"] == "GPU")["ok"]
    assert modes["run --mode gpu"]["ok"] is (gpu_ok and modes["run --mode gpu"]["detail"] == "ready")
    if not gpu_ok:
        assert "GPU" in modes["run --mode gpu"]["detail"]
        assert modes["run --mode auto"]["detail"] == "falls back to the simulator"


def test_doctor_table_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "This machine" in out and "Modes" in out and "run --mode gpu" in out


def test_shim_cli_build_path_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    assert main(["shim", "path", "--cache-dir", str(cache)]) == 1
    assert "not built yet" in capsys.readouterr().err
    assert main(["shim", "build", "--cache-dir", str(cache)]) == 0
    built = Path(capsys.readouterr().out.strip())
    assert built.is_file() and built.name == "libuvmlab_shim.so" and cache in built.parents
    assert main(["shim", "path", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(built)
    assert main(["shim", "status", "--cache-dir", str(cache), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["built"] is True


def test_shim_build_without_compiler_is_one_sentence(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    assert main(["shim", "build", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uvmlab: error: no C++ compiler found") and err.count("\n") == 1


def test_run_mode_gpu_without_a_gpu_exits_with_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    """End to end through `uvmlab run`."""
    st = gpu_status()
    if st.available:
        pytest.skip("a GPU is present")
    code = main(["run", "gpt2", "--oversub", "4", "--pca", "off", "--mode", "gpu", "--out", "/nonexistent/never"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("uvmlab: error: ") and st.reason in err
    assert "Traceback" not in err


# ---- MIG (issue 26 defect 6): the fake NVML of tests/stubs/site/pynvml.py, nvidia-ml-py's names and errors ----------
_MIG_UUID = "MIG-11111111-2222-3333-4444-555555555555"
_MIG_HOST = {
    "gpus": [
        {
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
            "bus_id": "00000000:07:00.0",
            "total": 85899345920,
            "used": 0,
            "mig": [
                {"name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "uuid": _MIG_UUID, "total": 42949672960, "used": 5 << 20},
                {
                    "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                    "uuid": "MIG-66666666-7777-8888-9999-000000000000",
                    "total": 42949672960,
                    "used": 0,
                },
            ],
        }
    ]
}


@pytest.fixture
def mig_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> types.ModuleType:
    import importlib.util

    cfg = tmp_path / "nvml.json"
    cfg.write_text(json.dumps(_MIG_HOST))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(cfg))
    spec = importlib.util.spec_from_file_location("pynvml", Path(__file__).parent / "stubs" / "site" / "pynvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_on_mig_the_worker_finds_its_nvml_device_by_the_uuid_cuda_reports(mig_nvml) -> None:
    """CUDA reports a MIG device's own UUID and torch prints it without a prefix; the lookup took it as GPU-<uuid>
    and always failed (NVML_ERROR_NOT_FOUND), so a run on MIG had no NVML samples. It now tries MIG-<uuid> too."""
    from uvmlab.measure.gpu.worker import _Nvml

    mig_nvml.nvmlInit()
    handle, why = detect.nvml_handle(mig_nvml, {}, uuid=_MIG_UUID.removeprefix("MIG-"))
    assert why == "" and mig_nvml.nvmlDeviceGetUUID(handle) == _MIG_UUID
    assert [c[1] for c in mig_nvml.CALLS] == ["GPU-" + _MIG_UUID[4:], _MIG_UUID]  # GPU- tried first
    with pytest.raises(mig_nvml.NVMLError_NotFound):
        detect.nvml_handle(mig_nvml, {}, uuid="99999999-0000-0000-0000-000000000000")
    sampler = _Nvml(True, _MIG_UUID.removeprefix("MIG-"))
    assert sampler.used() == 5 << 20  # the MIG device's memory, not the whole GPU's


@pytest.mark.parametrize("cvd", [_MIG_UUID, None, "0"])
def test_gpu_status_describes_the_mig_device(mig_nvml, cvd) -> None:
    """A MIG device named in CUDA_VISIBLE_DEVICES (or, approximated, the first MIG device of a MIG-mode GPU named by
    index) is described with its own name and memory; NVML's index is its parent's."""
    st = gpu_status(env={} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd})
    assert st.available, st.reason
    assert (st.name, st.memory_bytes, st.index) == ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 42949672960, 0)
    assert st.free_bytes == 42949672960 - (5 << 20)


def test_the_old_mig_name_form_is_refused_with_a_sentence(mig_nvml) -> None:
    st = gpu_status(env={"CUDA_VISIBLE_DEVICES": "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/1/0"})
    assert not st.available and "old MIG-GPU-<uuid>/<gi>/<ci> form" in st.reason
