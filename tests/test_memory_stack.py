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
from uvmlab.memory.stack import (
    MODEL_PART_SPREAD,
    NOISE_FLOOR_BYTES,
    FitRow,
    MeasuredRow,
    band_bytes,
    fit_rows,
    fit_stack,
    load_stack,
    read_measured,
    stack_bounds,
)
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


def _fake(predicted: dict[str, int], convs: set[str], context: int = 1100 * MiB) -> object:
    def est(cfg: object) -> object:
        name = cfg.workload  # type: ignore[attr-defined]
        orch = {"changes": {"cudnn_workspace": 3}} if name in convs else {"changes": {}}
        return SimpleNamespace(device_peak_bytes=predicted[name], orchestration=orch, context_bytes=context, trace=None)

    return est


def _row(name: str, measured: int, batch: int = 8, line: int = 2) -> MeasuredRow:
    from uvmlab.config import WorkloadConfig

    return MeasuredRow(line, WorkloadConfig(workload=name, batch_size=batch), measured)


def test_a_small_job_fits_only_what_its_own_error_cannot_explain() -> None:
    """A job whose model part is 100 MiB (band: 66 MiB + 36 % of it = 102 MiB) measured 300 MiB above its estimate:
    the stack term is the 198 MiB its own error cannot explain, and the row keeps 102 MiB as its own residual."""
    one = fit_stack([_row("a", 1500 * MiB)], _fake({"a": 1200 * MiB}, {"a"}), "A100-40GB", "lazy")  # type: ignore[arg-type]
    band = NOISE_FLOOR_BYTES + MODEL_PART_SPREAD["cnn"] * 100 * MiB
    assert one.fixed_bytes == int(300 * MiB - band) and one.cudnn_bytes == 0
    assert one.extra_bytes(True) == one.extra_bytes(False) == one.fixed_bytes
    assert one.rows[0]["residual_after_fit_bytes"] == 300 * MiB - one.fixed_bytes
    assert one.interval_bytes[0] == one.fixed_bytes and one.bounds_bytes["total"][0] < 0 < one.bounds_bytes["total"][1]
    assert any("trust it to" in n for n in one.notes)


def test_a_large_jobs_own_error_is_not_taken_for_the_stacks() -> None:
    """The whole residual of one measured job was fitted as the stack's before issue 44: a CNN estimated at 8 GiB and
    measured 2.5 GiB above it set +2.5 GiB for every other job. Within its own band (66 MiB + 36 % of its model part)
    it now fits nothing, and a residual beyond what a stack can hold even with that band is refused in one sentence."""
    est = _fake({"big": 8 * 1024 * MiB, "small": 1200 * MiB}, {"big", "small"}, context=522 * MiB)
    fit = fit_stack([_row("big", 8 * 1024 * MiB + 2500 * MiB)], est, "A100-40GB", "lazy")  # type: ignore[arg-type]
    assert fit.fixed_bytes == 0 and any("not used" in n for n in fit.notes)
    with pytest.raises(InputError, match="more than a stack can hold"):
        fit_stack([_row("small", 1200 * MiB + 4000 * MiB)], est, "A100-40GB", "lazy")  # type: ignore[arg-type]


def test_several_rows_narrow_the_fit_and_one_dominating_job_is_named() -> None:
    est = _fake({"a": 1200 * MiB, "b": 1250 * MiB, "c": 1300 * MiB}, set())
    rows = [_row("a", 1500 * MiB, line=2), _row("b", 1560 * MiB, line=3)]
    two = fit_stack(rows, est, "A100-40GB", "eager")  # type: ignore[arg-type]
    one = fit_stack(rows[:1], est, "A100-40GB", "eager")  # type: ignore[arg-type]
    assert two.fixed_bytes >= one.fixed_bytes > 0  # b's interval cuts a's from below
    with pytest.raises(InputError, match=r"c \(\{?.*line 4.*own error dominates"):
        fit_stack([*rows, _row("c", 600 * MiB, line=4)], est, "A100-40GB", "eager")  # type: ignore[arg-type]


def test_two_batch_sizes_of_one_job_report_its_fixed_and_per_sample_residual() -> None:
    est = _fake({"a": 1200 * MiB}, set())
    rows = [_row("a", 1500 * MiB, batch=8, line=2), _row("a", 1580 * MiB, batch=16, line=3)]
    fit = fit_stack(rows, est, "A100-40GB", "lazy")  # type: ignore[arg-type]
    (job,) = fit.jobs
    assert job["residual_per_sample_bytes"] == 10 * MiB and job["residual_at_batch_0_bytes"] == 220 * MiB
    assert any("per sample" in n for n in fit.notes)


def test_calibrate_then_estimate_with_the_stack_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One measured row, 600 MiB above uvmlab's prediction of a tiny MLP: the stack term is what the row's own error
    band cannot explain, and an estimate with the stack file moves by exactly that term (nothing model-specific)."""
    base = ["estimate", TINY, "-b", "16", "-n", "2", "--gpu", "A100-40GB", "--format", "json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    measured = plain["device_peak_bytes"] // MiB + 600
    csv = tmp_path / "measured.csv"
    csv.write_text(f"workload,batch,measured_mib,iterations\n{TINY},16,{measured},2\n")
    out = tmp_path / "stack.json"
    assert main(["calibrate", "--memory", str(csv), "-o", str(out), "--gpu", "A100-40GB"]) == 0
    shown = capsys.readouterr()
    assert "own error band" in shown.out and "trust it to" in shown.err
    fit = load_stack(out)
    (row,) = fit.rows
    assert abs(fit.fixed_bytes - (measured * MiB - plain["device_peak_bytes"] - row["band_bytes"])) <= 1
    assert 0 < fit.fixed_bytes < 600 * MiB
    assert main([*base, "--stack", str(out)]) == 0
    stacked = json.loads(capsys.readouterr().out)
    assert stacked["device_peak_bytes"] == plain["device_peak_bytes"] + fit.fixed_bytes
    assert stacked["context_model"]["by_library"]["stack_calibration"] == fit.fixed_bytes
    assert stacked["interval"]["stack_calibrated"] is True
    assert main(["calibrate", "--memory", str(csv), "-o", str(out), "--gpu", "A100-40GB"]) == 2  # exists: --force
    (tmp_path / "junk.json").write_text("{}")
    assert main([*base, "--stack", str(tmp_path / "junk.json")]) == 2


def test_stack_rows_add_the_fitted_term() -> None:
    rows = [Row("carma", "a", "cnn", 410.0 * MiB, 200.0 * MiB, context=150.0 * MiB),
            Row("carma", "b", "cnn", 220.0 * MiB, 200.0 * MiB, context=150 * MiB),
            Row("carma", "c", "cnn", 50 * MiB, 60 * MiB, context=40 * MiB)]  # fmt: skip
    term = 210 * MiB - (NOISE_FLOOR_BYTES + MODEL_PART_SPREAD["cnn"] * 50 * MiB)
    st_rows = stack_rows(rows, "a")
    assert [r.predicted for r in st_rows] == [200.0 * MiB + term, 200.0 * MiB + term, 60 * MiB + term]
    assert [r.stack_fit for r in st_rows] == [True, False, False]
    assert summary(st_rows)["rows"] == 2
    assert stack_rows(rows, "b")[1].predicted == 200.0 * MiB  # within its band: nothing fitted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(20, 30_000), st.floats(-0.5, 1.5), st.sampled_from(["cnn", "mlp", "transformer"])),
        min_size=1,
        max_size=6,
    )
)
def test_the_fit_stays_inside_every_used_rows_interval_and_the_bounds(rows: list[tuple[float, float, str]]) -> None:
    """Whatever the rows: the stack term is inside the bounds and every used row's interval, is the value nearest 0
    there, and is 0 when every residual lies within its row's own band; or the fit is refused."""
    fit_rows_ = [
        FitRow(i, f"w{i}", f"w{i}", 8, (1 + rel) * (500 + model) * MiB, (500 + model) * MiB, 500 * MiB, family)
        for i, (model, rel, family) in enumerate(rows)
    ]
    bounds = stack_bounds("A100-40GB", "lazy", False)
    try:
        fit = fit_rows(fit_rows_, "A100-40GB", "lazy")
    except InputError as exc:
        assert len(str(exc).splitlines()) == 1
        # a refusal only where some row lies outside its own band: rows all within it fit 0, never refuse
        assert any(abs(r.residual_bytes) > band_bytes(r.family, r.model_bytes) for r in fit_rows_)
        return
    assert bounds.low <= fit.fixed_bytes <= bounds.high
    used = [r for r, t in zip(fit_rows_, fit.rows, strict=True) if t["used"]]
    for r in used:
        band = band_bytes(r.family, r.model_bytes)
        assert r.residual_bytes - band - 1 <= fit.fixed_bytes <= r.residual_bytes + band + 1
    if all(abs(r.residual_bytes) <= band_bytes(r.family, r.model_bytes) for r in fit_rows_):
        assert fit.fixed_bytes == 0


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


REAL = REPO.parent / "shared" / "real-data" / "memory"


def _xmem_rows() -> list[Row]:
    from uvmlab.evaluate.estimators import after_context_bytes, case_gpu
    from uvmlab.evaluate.xmem_sample import read_xmem_sample
    from uvmlab.memory.estimate import estimate, has_cudnn_convolutions
    from uvmlab.memory.intervals import family_of

    cases, _ = read_xmem_sample(REAL / "xmem_rtx3060_sample")
    rows = []
    for c in cases:
        est = estimate(c.workload, case_gpu(c), alloc_conf=c.alloc_conf, module_loading=c.module_loading)
        ctx = est.context
        rows.append(Row("xmem", c.case_id, family_of(est.trace), c.measured_peak_bytes, after_context_bytes(est),
                        context=ctx.lazy_conv_modules_bytes + ctx.eager_cudnn_bytes,
                        job=f"{c.workload.workload}/{c.workload.optimizer}", batch=c.workload.batch_size,
                        convolutions=has_cudnn_convolutions(est)))  # fmt: skip
    return rows


def _mlp_sample_rows() -> list[Row]:
    from uvmlab.evaluate.gpumemnet import GPU_NAME, read_mlp_set
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.devicemem import context_model
    from uvmlab.memory.estimate import estimate

    rows, _ = read_mlp_set(REAL / "gpumemnet_mlp_a100")
    out = []
    for r in rows:
        if r.index % 100 != 1:  # the validation scorecard's fast sample (30 rows)
            continue
        est = estimate(r.config(), get_gpu(GPU_NAME), context=context_model(GPU_NAME, "eager"))
        out.append(Row("gpumemnet", f"row {r.index}", "mlp", r.measured_bytes, est.device_peak_bytes,
                       context=est.context_bytes))  # fmt: skip
    return out


@pytest.mark.parametrize("dataset", ["xmem", "gpumemnet"])
def test_every_choice_of_the_calibration_job_leaves_the_other_jobs_no_worse(dataset: str) -> None:
    """Calibrate as a user would, on one job (each row; each pair of batch sizes of one job), and estimate the others:
    their median error must be no worse than without a calibration, their worst no worse than twice. The whole-residual
    fit of uvmlab before issue 44 broke both on xMem's sample (ConvNeXt-Tiny with Adam at batch 500, -507 MiB of its own
    error, moved every other row by it) and on GPUMemNet's rows; CARMA's summary, not in ../shared, is in
    docs/evaluation.md's table (tools/memory_residuals.py)."""
    from uvmlab.evaluate.memory_validation import stack_choices

    folder = REAL / ("xmem_rtx3060_sample" if dataset == "xmem" else "gpumemnet_mlp_a100")
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here (../shared/real-data)")
    rows = _xmem_rows() if dataset == "xmem" else _mlp_sample_rows()
    choices = stack_choices(rows)
    assert len(choices) >= len(rows)
    for c in choices:
        assert c["median_new"] <= c["median_before"] + 1e-12, c["cases"]
        assert c["worst_new"] <= 2 * c["worst_before"], c["cases"]
    old_ok = [
        c["median_old"] <= c["median_before"] + 1e-12 and c["worst_old"] <= 2 * c["worst_before"] for c in choices
    ]
    assert not all(old_ok)  # the rule before issue 44 fails some choice of this data set
