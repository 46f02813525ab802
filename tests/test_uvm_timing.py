"""The cost model: parameter files, the transfer curve, the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from uvmlab.errors import InputError
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.timing import CostParams, kernel_time_ns, transfer_bandwidth, transfer_time_ns


def test_param_file_round_trip(tmp_path: Path) -> None:
    p = CostParams(batch_turnaround_ns=12_345.0, fault_overlap=0.25)
    path = p.to_file(tmp_path / "params.json", source="unit test")
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and doc["source"] == "unit test"
    assert CostParams.from_file(path) == p


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"schema_version": 2, "params": {}}', "schema_version"),
        ('{"schema_version": 1}', "params"),
        ('{"schema_version": 1, "params": {"batch_turnround_ns": 1}}', "unknown fields"),
        ('{"schema_version": 1, "params": {"batch_turnaround_ns": -1}}', "batch_turnaround_ns -1 is outside"),
        ('{"schema_version": 1, "params": {"fault_overlap": 2}}', "fault_overlap"),
    ],
)
def test_bad_param_files_are_input_errors(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(InputError, match=match):
        CostParams.from_file(path)


def test_missing_param_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        CostParams.from_file(tmp_path / "nope.json")


def test_transfer_curve_small_transfers_are_slower() -> None:
    link = 23e9
    bw = transfer_bandwidth(np.array([4096, 65536, 2 * 1024 * 1024]), link)
    assert bw[0] < bw[1] < bw[2]
    assert bw[2] == pytest.approx(link)
    assert 0.1 < bw[0] / link < 0.3  # UVMSmart: 2.17 of 11.95 GiB/s at 4 KiB
    # one 2 MiB transfer is faster than 512 separate 4 KiB ones
    assert transfer_time_ns(np.array([2 << 20]), link) < transfer_time_ns(np.full(512, 4096), link) / 3


def test_roofline_kernel_time() -> None:
    gpu = GPUS["A100-80GB"]
    c = CostParams()
    t = kernel_time_ns(np.array([0.0, 1e12, 0.0]), np.array([0.0, 0.0, 1e9]), gpu, c)
    assert t[0] == c.kernel_min_ns
    assert t[1] == pytest.approx(1e12 / (gpu.fp32_flops * c.compute_efficiency) * 1e9)
    assert t[2] == pytest.approx(1e9 / (gpu.hbm_bytes_per_s * c.for_gpu(gpu).memory_efficiency) * 1e9)
    bf16 = kernel_time_ns(np.array([1e12]), np.array([0.0]), gpu, c, dtype="bf16")
    assert bf16[0] < t[1]
