"""CARMA's A100 run summary (itu-rad/CARMA workloads/ehsan-summary.csv) as ground truth, on a synthetic file."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.evaluate import carma_runs
from uvmlab.evaluate.ground_truth import load_ground_truth
from uvmlab.units import MiB

MEASURED = carma_runs.MEASURED_COLUMN
HEADER = ["Model", "Max memory.used [MB]", "Faketensor Estimate [MB]", "Run folder", "Script", "batch_size"]
ROWS = [
    ["resnet18_cifar100", "788.0", "53.9", "2025-09-22_10-15-10_resnet18_cifar100.py_--batch_size_32_--epochs_1",
     "resnet18_cifar100.py", ""],
    ["resnet50_cifar100", "854.0", "233.3", "2025-09-22_10-20-12_resnet50_cifar100.py_--batch_size_128_--epochs_1",
     "resnet50_cifar100.py", ""],
    ["vgg", "6684.0", "3121.3", "2025-09-22_11-59-37_vgg.py_--batch_size_32_--num_epochs_1", "vgg.py", ""],
    ["Inception", "5230.0", "1590.3", "2025-09-22_06-12-29_Inception.py_--batch_size_32_--num_epochs_1",
     "Inception.py", ""],
    ["BERT_base_on_wiki", "19828.0", "", "2025-09-22_02-25-43_BERT_base_on_wiki.py", "BERT_base_on_wiki.py", ""],
]  # fmt: skip


def _write(path: Path, rows: list[list[str]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_cases_configs_and_skips(tmp_path: Path) -> None:
    src = _write(tmp_path / carma_runs.CSV_NAME, ROWS)
    cases, skipped = carma_runs.read_carma_summary(tmp_path)  # the folder works too
    assert [c.case_id for c in cases] == ["resnet18_cifar100.py_bs32", "resnet50_cifar100.py_bs128", "vgg.py_bs32"]
    r18, r50, vgg = cases
    assert r18.measured_peak_bytes == 788 * MiB and r18.target == "device" and r18.module_loading == "lazy"
    assert r18.gpu_name == "A100-40GB" and not r18.oom
    assert (
        r18.fitted and r50.fitted and not vgg.fitted
    )  # CIFAR rows calibrate the lazy conv modules, ImageNet validates
    assert r18.workload is not None and r18.workload.workload == "timm:resnet18"
    assert (r18.workload.batch_size, r18.workload.optimizer) == (32, "adamw")
    assert r18.workload.options == {"image_size": 32, "num_classes": 100}
    assert r50.workload is not None and r50.workload.workload == "timm:efficientnet_b0"  # the script's own model
    assert vgg.workload is not None and vgg.workload.workload == "torchvision:vgg16"
    assert vgg.workload.optimizer == "adam" and vgg.workload.options == {"image_size": 224, "num_classes": 1000}
    reasons = dict(skipped)
    assert set(reasons) == {"Inception.py_bs32", "BERT_base_on_wiki.py_line6"}
    assert "aux" in reasons["Inception.py_bs32"]
    assert carma_runs.is_carma_summary(src)


def test_load_ground_truth_dispatches(tmp_path: Path) -> None:
    src = _write(tmp_path / "summary.csv", ROWS[:1])
    cases, skipped = load_ground_truth(src)
    assert len(cases) == 1 and cases[0].target == "device" and skipped == []


def test_not_a_carma_summary(tmp_path: Path) -> None:
    other = _write(tmp_path / "x.csv", [["a", "1"]], header=["model", "Max memory.used [MB]"])
    assert not carma_runs.is_carma_summary(other)
    assert not carma_runs.is_carma_summary(tmp_path / "absent.csv")


@pytest.mark.parametrize("value", ["", "n/a", "0", "-5"])
def test_bad_measured_value(tmp_path: Path, value: str) -> None:
    row = [ROWS[0][0], value, *ROWS[0][2:]]
    with pytest.raises(InputError, match="line 2"):
        carma_runs.read_carma_summary(_write(tmp_path / "s.csv", [row]))


def test_missing_column_and_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="Run folder"):
        carma_runs.read_carma_summary(_write(tmp_path / "s.csv", [["m", "1"]], header=["Script", MEASURED]))
    with pytest.raises(InputError, match="not found"):
        carma_runs.read_carma_summary(tmp_path / "nope.csv")


def test_cli_evaluate_end_to_end(tmp_path: Path) -> None:
    """`uvmlab evaluate` on a one-run summary scores the row at the same device peak `uvmlab estimate` gives."""
    import json

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from uvmlab.cli import cli

    folder = "2025-09-22_08-52-27_mobilenet_cifar100.py_--batch_size_32_--epochs_1"
    row = ["mobilenet_cifar100", "590.0", "15.2", folder, "mobilenet_cifar100.py", ""]
    src = _write(tmp_path / "summary.csv", [row, ROWS[-1]])
    out = tmp_path / "eval"
    res = CliRunner().invoke(cli, ["evaluate", str(src), "--estimator", "uvmlab-pca", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "result.json").read_text())["n_cases"] == 1
    est = CliRunner().invoke(
        cli,
        ["estimate", "timm:mobilenetv3_small_100", "-b", "32", "--image-size", "32", "--num-classes", "100",
         "--gpu", "A100-40GB", "--optimizer", "adamw", "--module-loading", "lazy", "--format", "json"],
    )  # fmt: skip
    assert est.exit_code == 0, est.output
    device_peak = json.loads(est.output)["device_peak_bytes"]
    table = pq.read_table(out / "tables" / "estimates.parquet").to_pylist()
    assert len(table) == 1
    assert table[0]["estimate_bytes"] == device_peak
    assert table[0]["measured_peak_bytes"] == 590 * MiB
