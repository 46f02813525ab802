"""Stack calibration (uvmlab.memory.stack, `uvmlab calibrate --memory`, `uvmlab estimate --stack`) and the interval
rule (uvmlab.memory.intervals)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.evaluate.memory_validation import Row, stack_rows, summary
from uvmlab.memory.intervals import build_table, coverage, interval
from uvmlab.memory.stack import MeasuredRow, fit_stack, load_stack, read_measured
from uvmlab.units import MiB

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_measured_csv_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "m.csv"
    bad.write_text("workload,batch\nresnet50,32\n")
    with pytest.raises(InputError, match="measured_mib"):
        read_measured(bad)
    bad.write_text("workload,batch,measured_mib\nresnet50,32,lots\n")
    with pytest.raises(InputError, match="line 2: measured_mib must be a number, not 'lots'"):
        read_measured(bad)
    good = tmp_path / "g.csv"
    good.write_text("workload,batch,measured_mib,optimizer,image_size\ntimm:resnet18,32,788,adamw,32\n")
    (row,) = read_measured(good)
    assert row.measured_bytes == 788 * MiB and row.config.optimizer == "adamw"
    assert row.config.options == {"image_size": 32}


def _fake(predicted: dict[str, int], convs: set[str]) -> object:
    def est(cfg: object) -> object:
        name = cfg.workload  # type: ignore[attr-defined]
        orch = {"changes": {"cudnn_workspace": 3}} if name in convs else {"changes": {}}
        return SimpleNamespace(device_peak_bytes=predicted[name], orchestration=orch)

    return est


def _row(name: str, measured: int) -> MeasuredRow:
    from uvmlab.config import WorkloadConfig

    return MeasuredRow(2, WorkloadConfig(workload=name, batch_size=8), measured)


def test_one_row_fits_the_fixed_cost_and_two_kinds_split_cudnn() -> None:
    one = fit_stack([_row("a", 1500 * MiB)], _fake({"a": 1200 * MiB}, {"a"}), "A100-40GB", "eager")  # type: ignore[arg-type]
    assert one.fixed_bytes == 300 * MiB and one.cudnn_bytes == 0
    assert one.extra_bytes(True) == one.extra_bytes(False) == 300 * MiB
    rows = [_row("cnn", 2000 * MiB), _row("mlp", 1100 * MiB)]
    two = fit_stack(rows, _fake({"cnn": 1500 * MiB, "mlp": 1000 * MiB}, {"cnn"}), "A100-40GB", "eager")  # type: ignore[arg-type]
    assert two.fixed_bytes == 100 * MiB and two.cudnn_bytes == 400 * MiB
    assert two.extra_bytes(True) == 500 * MiB and two.extra_bytes(False) == 100 * MiB


def test_calibrate_then_estimate_with_the_stack_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One measured row, 300 MiB above uvmlab's prediction: the stack file makes the same estimate exact, and a
    second estimate with it moves by the same fixed cost (nothing model-specific)."""
    base = ["estimate", TINY, "-b", "16", "-n", "2", "--gpu", "A100-40GB", "--format", "json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    measured = plain["device_peak_bytes"] // MiB + 300
    csv = tmp_path / "measured.csv"
    csv.write_text(f"workload,batch,measured_mib,iterations\n{TINY},16,{measured},2\n")
    out = tmp_path / "stack.json"
    assert main(["calibrate", "--memory", str(csv), "-o", str(out), "--gpu", "A100-40GB"]) == 0
    capsys.readouterr()
    fit = load_stack(out)
    assert fit.fixed_bytes == measured * MiB - plain["device_peak_bytes"]
    assert main([*base, "--stack", str(out)]) == 0
    stacked = json.loads(capsys.readouterr().out)
    assert stacked["device_peak_bytes"] == measured * MiB
    assert stacked["context_model"]["by_library"]["stack_calibration"] == fit.fixed_bytes
    assert stacked["interval"]["stack_calibrated"] is True
    assert main(["calibrate", "--memory", str(csv), "-o", str(out), "--gpu", "A100-40GB"]) == 2  # exists: --force
    (tmp_path / "junk.json").write_text("{}")
    assert main([*base, "--stack", str(tmp_path / "junk.json")]) == 2


def test_stack_rows_add_the_fit_rows_offset() -> None:
    rows = [Row("d", "a", "cnn", 110.0, 100.0), Row("d", "b", "cnn", 220.0, 200.0), Row("d", "c", "cnn", 50, 60)]
    st_rows = stack_rows(rows, "a")
    assert [r.predicted for r in st_rows] == [110.0, 210.0, 70.0]
    assert [r.stack_fit for r in st_rows] == [True, False, False]
    assert summary(st_rows)["rows"] == 2


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(-0.3, 0.6), min_size=1, max_size=40), st.lists(st.floats(-0.3, 0.6), min_size=1, max_size=40))
def test_the_cover_rule_covers_95_percent_of_every_data_set(a: list[float], b: list[float]) -> None:
    """Whatever the residuals, required = predicted x (1 + cover) covers >= 95 % of each data set's rows."""
    table = build_table({"x": a, "y": b}, {"x": a, "y": b}, {"x": ["cnn"], "y": ["cnn"]})
    for res in (a, b):
        rows = [Row("s", str(i), "cnn", 100.0 * (1 + r), 100.0) for i, r in enumerate(res)]
        assert coverage(rows, table, stack=False)["coverage"] >= 0.95
    assert table["families"]["cnn"]["no_stack"]["cover"] >= 0
    iv = interval(1000 * MiB, "transformer", False, table)  # no data for the family: the widest of all
    assert "no validation data" in iv["source"] and iv["p10_bytes"] <= iv["p90_bytes"]


def test_the_shipped_residual_table_is_built_from_every_memory_data_set() -> None:
    """uvmlab/memory/residuals.json (``tools/memory_residuals.py --write``) must come from every whole-device data set
    held, every validation row: until 2026-11-28 it held CARMA's 15 rows only, so the MLP family had "no validation
    data" and took CARMA's CNN cover (+34 %) for every MLP estimate instead of GPUMemNet's own (+1.75 %)."""
    from uvmlab.memory.intervals import load_table

    fam = load_table()["families"]
    for stack in ("no_stack", "stack"):
        assert fam["mlp"][stack]["datasets"] == ["gpumemnet"] and fam["mlp"][stack]["rows"] >= 2000
        assert fam["mlp"][stack]["source"] == "validation rows of this family"
        assert {"carma", "xmem"} <= set(fam["cnn"][stack]["datasets"])
        assert fam["mlp"][stack]["cover"] < fam["cnn"][stack]["cover"]  # GPUMemNet's residuals are the tightest
