"""Ground truth: the CSV format (good and broken files) and real snapshots as ground-truth runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.evaluate.ground_truth import read_ground_truth, snapshot_case, write_ground_truth

HEADER = "id,source,config,gpu_memory,measured_peak_bytes,oom\n"


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    p = tmp_path / "gt.csv"
    p.write_text(header + body)
    return p


def test_workload_rows(tmp_path: Path) -> None:
    p = write(tmp_path, 'a,gpt2,"{""batch_size"": 4}",80GiB,1234567,0\nb,resnet50,,8GiB,,1\n')
    a, b = read_ground_truth(p)
    assert a.workload.workload == "gpt2" and a.workload.batch_size == 4
    assert a.gpu_memory_bytes == 80 * 2**30 and a.measured_peak_bytes == 1234567 and not a.oom
    assert b.oom and math.isnan(b.measured_peak_bytes) and b.workload.batch_size is None


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("a,gpt2,,80GiB,,0\n", "measured_peak_bytes is required"),
        ("a,gpt2,,80GiB,12,maybe\n", "not a yes/no"),
        ("a,gpt2,{bad,80GiB,12,0\n", "not JSON"),
        ('a,gpt2,"{""nope"": 1}",80GiB,12,0\n', "unknown config keys"),
        ("a,gpt2,,lots,12,0\n", "gpu_memory"),
        ("a,gpt2,,80GiB,12,0\na,gpt2,,80GiB,12,0\n", "duplicate id"),
        ("a,,,80GiB,12,0\n", "empty source"),
        ("", "no runs"),
        ("a,missing.pickle,,80GiB,12,0\n", "not found"),
    ],
)
def test_broken_csv(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        read_ground_truth(write(tmp_path, body))


def test_missing_column(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing columns"):
        read_ground_truth(write(tmp_path, "a,gpt2\n", header="id,source\n"))


SNAP = "HugePandaCoder__octree-nca-groupeq__752276c1__my_snapshot.pickle"
OOM_SNAP = "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"


def test_snapshot_ground_truth_matches_manifest(real_data: Path) -> None:
    case = snapshot_case(real_data / "snapshots" / SNAP)
    # MANIFEST.tsv: peak_reserved real/sim = 9196011520
    assert case.measured_peak_bytes == 9196011520 and not case.oom
    a = case.trace.allocations
    assert len(a) == 294 + 75  # 294 alloc events + 75 blocks live when the trace began
    case.trace.validate()


def test_snapshot_oom_device(real_data: Path) -> None:
    case = snapshot_case(real_data / "snapshots" / OOM_SNAP, device=1)
    assert case.oom and math.isnan(case.measured_peak_bytes)
    assert case.alloc_conf == "expandable_segments:True"
    # the failing request is the last allocation, never freed
    last = case.trace.allocations.iloc[-1]
    assert last["free_seq"] == -1 and last["size_bytes"] == 5308694528


def test_snapshot_roundtrip_csv(real_data: Path, tmp_path: Path) -> None:
    case = snapshot_case(real_data / "snapshots" / SNAP)
    p = tmp_path / "gt.csv"
    write_ground_truth([case], p)
    (back,) = read_ground_truth(p)
    assert back.measured_peak_bytes == case.measured_peak_bytes
    assert len(back.trace.allocations) == len(case.trace.allocations)
