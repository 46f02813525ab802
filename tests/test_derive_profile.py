"""`uvmlab.measure.profile_fit.derive_profile`: the cost profile of a GPU for which we hold only an nsys export
(A100)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.measure import calibrate
from uvmlab.measure import profile_fit as calibrate_uvm
from uvmlab.measure.nsys import read
from uvmlab.sim.uvm.timing import CostParams

PROFILES = Path(calibrate_uvm.__file__).resolve().parents[1] / "sim" / "uvm" / "profiles"
CSC746 = "nsys/csc746_a100_um_migrations_nsys2022.2.1.sqlite"
BASE = {
    "gpu": "RTX5090",
    "driver": "575 (test)",
    "fitted_on": ["kernels line", "fault_scale line", "link line"],
    "params": {**CostParams().to_dict(), "fault_entry_ns": 123.0, "link_bytes_per_s": 1.0, "memory_efficiency": 0.9},
}


def _fake_fit(monkeypatch: pytest.MonkeyPatch, link: float | None, cpu_fault: float | None = None) -> None:
    monkeypatch.setattr(read, "open_export", contextlib.nullcontext)
    info = {"migrations": 7} if link else {"reason": "no UM migrations"}
    monkeypatch.setattr(calibrate, "fit_link_bandwidth", lambda ex: (link, info))
    cpu_info = {"gaps": 9, "cpu_faults": 12} if cpu_fault else {"reason": "no CPU faults"}
    monkeypatch.setattr(calibrate, "fit_cpu_fault_ns", lambda ex: (cpu_fault, cpu_info))
    monkeypatch.setattr(calibrate, "fit_serial_refaults", lambda ex: (None, {"reason": "not one thread"}))


def test_fault_path_from_the_base_link_from_the_export_kernels_from_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_fit(monkeypatch, 2.5e10)
    defaults = CostParams(compute_efficiency=0.41, memory_efficiency=0.62)
    path = calibrate_uvm.derive_profile(tmp_path / "p.json", "A100-80GB", BASE, tmp_path / "x.sqlite", defaults)
    doc = json.loads(path.read_text())
    p = doc["params"]
    assert p["fault_entry_ns"] == 123.0  # the base profile's fault path
    assert p["batch_turnaround_ns"] == BASE["params"]["batch_turnaround_ns"]
    assert p["link_bytes_per_s"] == 2.5e10  # this GPU's own link, fitted on its export
    assert (p["compute_efficiency"], p["memory_efficiency"]) == (0.41, 0.62)  # not the base GPU's kernels
    assert p["zero_fill_bytes_per_s"] is None
    assert doc["gpu"] == "A100-80GB" and doc["link"] == "PCIe 4.0 x16"
    assert doc["fitted_on"] == ["x.sqlite: 7 UM migrations -> link_bytes_per_s", "(from RTX5090) fault_scale line"]
    assert CostParams.from_file(path).link_bytes_per_s == 2.5e10  # a loadable parameter file
    assert p["cpu_fault_ns"] == BASE["params"]["cpu_fault_ns"]  # the export has no CPU fault: the base's


def test_the_host_cpu_fault_cost_is_fitted_where_the_export_has_cpu_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_fit(monkeypatch, 2.5e10, cpu_fault=41_700.0)
    path = calibrate_uvm.derive_profile(tmp_path / "p.json", "A100-80GB", BASE, tmp_path / "x.sqlite", CostParams())
    doc = json.loads(path.read_text())
    assert doc["params"]["cpu_fault_ns"] == 41_700.0
    assert "x.sqlite: 9 gaps between CPU faults -> cpu_fault_ns" in doc["fitted_on"]


def test_an_export_without_a_link_fit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_fit(monkeypatch, None)
    with pytest.raises(InputError, match="no link bandwidth fit"):
        calibrate_uvm.derive_profile(tmp_path / "p.json", "A100-80GB", BASE, tmp_path / "x.sqlite", CostParams())
    assert not (tmp_path / "p.json").exists()


def test_the_shipped_a100_profile_is_what_derive_profile_gives(real_data: Path, tmp_path: Path) -> None:
    """a100.json is derive_profile(RTX 5090 profile, csc746 export): when the RTX 5090 profile is refitted, this
    fails until a100.json is derived again."""
    export = real_data / CSC746
    if not export.is_file():
        pytest.skip(f"{export} absent")
    base = json.loads((PROFILES / "rtx5090.json").read_text())
    shipped = json.loads((PROFILES / "a100.json").read_text())
    path = calibrate_uvm.derive_profile(tmp_path / "a100.json", shipped["gpu"], base, export, CostParams())
    assert json.loads(path.read_text()) == shipped
