"""``uvmlab advise --check-env`` (issue 28 item 4): the CUDA runtime and driver versions, the nvidia_uvm module's
parameters, root, concurrent managed access and the shim, read through a stub CUDA runtime (tests/stubs/fake_cudart.c,
the real signatures and cudaError_t values) and a folder standing in for /sys/module/nvidia_uvm/parameters; and
which policies the machine can apply."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.advise.environment import MachineEnv, can_apply, env_rows, policy_marks, probe_env
from uvmlab.advise.evidence import APPLY

STUBS = Path(__file__).parent / "stubs"


@pytest.fixture(scope="module")
def cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the stub CUDA runtime is C")
    # The probe loads the stub into this process with its soname, libcudart.so.13: torch must have loaded the real
    # runtime first, or a later `import torch` in this process (another test, same xdist worker) binds to the stub.
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("cudart")
    lib = d / "libcudart.so.13"
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", f"-Wl,--version-script={STUBS / 'libcudart.map'}",
         "-Wl,-soname,libcudart.so.13", "-o", str(lib), str(STUBS / "fake_cudart.c"), "-lpthread"],
        check=True, capture_output=True,
    )  # fmt: skip
    return lib


def _params(tmp_path: Path, **values: str) -> Path:
    d = tmp_path / "parameters"
    d.mkdir()
    for k, v in values.items():
        (d / k).write_text(v + "\n")
    return d


def test_the_probe_reads_versions_attributes_and_module_parameters(cudart, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDART_VERSION", "13000")
    monkeypatch.setenv("FAKE_CUDART_DRIVER_VERSION", "13010")
    monkeypatch.setenv("FAKE_CUDART_CC", "90")
    params = _params(tmp_path, uvm_perf_prefetch_threshold="51", uvm_perf_prefetch_enable="1")
    env = probe_env(cudart=cudart, uvm_parameters=params, euid=1000)
    assert (env.runtime_version, env.driver_version) == (13000, 13010)
    assert env.concurrent_managed_access is True and env.compute_capability == (9, 0) and env.device_reason == ""
    assert env.uvm_loaded and env.uvm_parameters["uvm_perf_prefetch_threshold"] == "51" and not env.root
    rows = dict(env_rows(env))
    assert rows["CUDA runtime"].startswith("13.0") and rows["CUDA driver"] == "supports up to CUDA 13.1"
    assert "uvm_perf_prefetch_threshold=51" in rows["nvidia_uvm prefetch and fault parameters"]
    assert rows["concurrent managed access"] == "yes" and rows["root"] == "no"
    marks = {p: (here, why) for p, here, why in policy_marks(env)}
    assert set(marks) == set(APPLY)
    assert marks["pca-off"][0] == "yes" and "uvmlab run --policy applies it" in marks["pca-off"][1]
    assert marks["driver-prefetch-aggressive"] == ("no", "needs root")  # no root here
    assert marks["discard-freed-blocks"][0] == "yes" and "uvmlab cannot apply it" in marks["discard-freed-blocks"][1]
    assert marks["optimizer-8bit"][0] == ("yes" if env.bitsandbytes else "no")


def test_what_a_machine_lacks_rules_policies_out(cudart, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDART_VERSION", "12080")
    monkeypatch.setenv("FAKE_CUDART_CC", "70")
    monkeypatch.setenv("FAKE_CUDART_CONCURRENT_MANAGED", "0")  # e.g. WSL2
    env = probe_env(cudart=cudart, uvm_parameters=tmp_path / "absent", euid=0)
    assert env.concurrent_managed_access is False and not env.uvm_loaded and env.root
    here = {p: (s, w) for p, s, w in policy_marks(env)}
    assert here["discard-freed-blocks"][0] == "no" and "CUDA 13 (runtime 12.8" in here["discard-freed-blocks"][1]
    assert "concurrent managed access (0 on this device)" in here["prefetch-on-alloc"][1]
    assert here["bf16-autocast"][0] == "no" and "compute capability 7.x" in here["bf16-autocast"][1]
    assert here["driver-prefetch-off"] == ("no", "needs the nvidia_uvm module (not loaded)")  # root, but no module
    assert here["pca-on"][0] == "yes"


def test_a_driver_setting_already_in_place_says_so(cudart, tmp_path) -> None:
    env = probe_env(cudart=cudart, uvm_parameters=_params(tmp_path, uvm_perf_prefetch_threshold="1"), euid=0)
    assert can_apply("driver-prefetch-aggressive", env)[0] == "already set"
    assert can_apply("driver-prefetch-off", env)[0] == "yes"  # root and the module: a reload can set it


def test_without_a_device_every_policy_is_simulate_only(cudart, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDART_NO_DEVICE", "1")
    monkeypatch.setenv("FAKE_CUDART_DRIVER_VERSION", "0")  # cudaDriverGetVersion's answer without a driver
    env = probe_env(cudart=cudart, uvm_parameters=tmp_path / "absent", euid=1000)
    assert env.concurrent_managed_access is None and "cudaErrorNoDevice (100)" in env.device_reason
    assert dict(env_rows(env))["CUDA driver"] == "none installed (cudaDriverGetVersion gives 0)"
    assert all(s == "no" and "uvmlab run --mode sim" in w for _, s, w in policy_marks(env))
    missing = probe_env(cudart=tmp_path / "libcudart.so.13", uvm_parameters=tmp_path / "absent")
    assert missing.runtime_version is None and "cannot load" in missing.device_reason


def test_check_env_cli_json_and_doctor_carry_the_report() -> None:
    proc = subprocess.run([sys.executable, "-m", "uvmlab", "advise", "--check-env", "--format", "json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert set(MachineEnv.__dataclass_fields__) == set(d["environment"])
    assert {p["policy"] for p in d["policies"]} == set(APPLY)
    assert all(p["here"] in ("yes", "no", "unknown", "already set") and p["why"] for p in d["policies"])
    doc = subprocess.run([sys.executable, "-m", "uvmlab", "doctor", "--format", "json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert doc.returncode == 0, doc.stderr
    rep = json.loads(doc.stdout)
    assert set(rep["uvm_environment"]) == set(d["environment"]) and len(rep["policies"]) == len(APPLY)


def test_advise_without_a_workload_or_check_env_is_one_sentence() -> None:
    proc = subprocess.run([sys.executable, "-m", "uvmlab", "advise"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "needs a WORKLOAD (or --check-env)" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
