"""End-to-end ``uvmlab run`` (simulation mode) on real workloads, and its refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.stats.schema import RESULT_KEYS, TABLE_COLUMNS

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
TINY_ARGS = [TINY, "--option", "hidden=2048", "--batch-size", "256", "--iterations", "2", "--mode", "sim"]


pytestmark = pytest.mark.usefixtures("module_trace_cache")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["run", *TINY_ARGS, "--oversub", "2", "--pca", "off", "-o", str(out)]) == 0
    return out


def test_run_writes_a_complete_run_directory(tiny_run: Path) -> None:
    rd = RunDir(tiny_run)
    assert rd.is_complete()
    result = rd.read_result()
    assert set(RESULT_KEYS) <= set(result)
    assert result["mode"] == "sim" and result["pca"] is False and result["oversub"] == 2.0
    assert result["iterations"] == 2
    assert result["available_bytes"] == int(result["footprint_bytes"] / 2)
    assert result["slowdown_vs_native"] > 1 and "slowdown" not in result and "baseline_time_ns" not in result
    for name in ("iterations", "kernels", "memory"):
        df = rd.read_table(name)
        assert list(df.columns[: len(TABLE_COLUMNS[name])]) == list(TABLE_COLUMNS[name])
    its = rd.read_table("iterations")
    assert int(its["fault_count"].sum()) == result["fault_count"]
    assert (its["fault_count"] == its["read_fault_count"] + its["write_fault_count"]).all()
    for fig in ("memory_per_kernel", "faults_migrations"):
        assert rd.figure(fig).stat().st_size > 1000
    cfg = json.loads(rd.config_json.read_text())
    assert cfg["run"]["oversub"] == 2.0
    assert cfg["run"]["workload"]["batch_size"] == 256 and cfg["used"]["batch_size"] == 256
    assert json.loads(rd.env_json.read_text())["mode"] == "sim"


def test_both_native_figures_in_result_json_and_iterations_table(tiny_run: Path) -> None:
    rd = RunDir(tiny_run)
    result, its = rd.read_result(), rd.read_table("iterations")
    # PCA off: its own native run pays one cudaMalloc and one cudaFree per tensor, PCA on's native run does not
    assert result["native_time_ns"] > result["native_pca_time_ns"] > 0
    assert result["slowdown_vs_native"] == pytest.approx(result["iteration_time_ns"] / result["native_time_ns"])
    assert result["slowdown_vs_native_pca"] == pytest.approx(result["iteration_time_ns"] / result["native_pca_time_ns"])
    assert result["slowdown_vs_native_pca"] > result["slowdown_vs_native"]
    assert (its["native_time_ns"] > its["native_pca_time_ns"]).all()
    assert result["native_time_ns"] == pytest.approx(its["native_time_ns"].iloc[1:].mean())


def test_pca_on_native_is_the_pca_native(tmp_path: Path) -> None:
    assert main(["run", *TINY_ARGS, "--oversub", "2", "--pca", "on", "-o", str(tmp_path / "on")]) == 0
    result = RunDir(tmp_path / "on").read_result()
    assert result["native_time_ns"] == result["native_pca_time_ns"]
    assert result["slowdown_vs_native"] == result["slowdown_vs_native_pca"]


def test_default_batch_is_recorded_in_config_json(tmp_path: Path) -> None:
    args = [a for a in TINY_ARGS if a not in ("--batch-size", "256")]
    assert main(["run", *args, "--oversub", "1", "-o", str(tmp_path / "d")]) == 0
    cfg = json.loads(RunDir(tmp_path / "d").config_json.read_text())
    # the workload's default, resolved where the run starts (issue 42: a default given or left out is one run)
    assert isinstance(cfg["used"]["batch_size"], int) and cfg["used"]["batch_size"] >= 1
    assert cfg["run"]["workload"]["batch_size"] == cfg["used"]["batch_size"]


def test_refuses_to_overwrite_without_force(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *TINY_ARGS, "--oversub", "2", "--pca", "off", "-o", str(tiny_run)]) == 2
    assert "--force" in capsys.readouterr().err


def test_json_format_prints_only_result_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", *TINY_ARGS, "--oversub", "1", "--pca", "on", "-o", str(tmp_path / "r"), "--format", "json"])
    assert code == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result == RunDir(tmp_path / "r").read_result()
    assert result["eviction_count"] == 0 and result["dtoh_bytes"] == 0  # factor 1: nothing evicted


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--oversub", "lots"], "oversubscription factor"),
        (["--oversub", "0"], "oversubscription factor"),
        (["--oversub", "-3"], "oversubscription factor"),
        (["--pca", "maybe"], "--pca"),
        (["--sim-option", "prefetch_treshold=70"], "unknown simulator options"),
        (["--gpu", "Z100"], "unknown GPU"),
    ],
)
def test_bad_input_is_one_sentence_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    assert main(["run", *TINY_ARGS, *args, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_bad_params_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.json"
    bad.write_text('{"schema_version": 1, "source": "x", "params": {"warp_speed": 9}}')
    assert main(["run", *TINY_ARGS, "--params", str(bad), "-o", str(tmp_path / "x")]) == 2
    assert "unknown fields" in capsys.readouterr().err


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``gpu_availability`` report no GPU, so the no-GPU paths are tested on every machine."""
    import uvmlab.run as run_mod
    from uvmlab.measure.gpu.detect import GpuStatus

    monkeypatch.setattr(run_mod, "gpu_availability", lambda: GpuStatus(False, "no CUDA device found"))


def test_mode_gpu_without_gpu_is_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_gpu(monkeypatch)
    args = [a for a in TINY_ARGS if a not in ("--mode", "sim")]
    assert main(["run", *args, "--mode", "gpu", "-o", str(tmp_path / "g")]) == 2
    assert "--mode gpu needs a CUDA device" in capsys.readouterr().err


def test_auto_mode_says_it_simulates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_gpu(monkeypatch)
    args = [a for a in TINY_ARGS if a not in ("--mode", "sim")]
    assert main(["run", *args, "--oversub", "1.5", "-o", str(tmp_path / "a")]) == 0
    assert "running the simulator (--mode sim)" in capsys.readouterr().err


@pytest.mark.slow
def test_gpt2_main_command(tmp_path: Path) -> None:
    """THE main command on the seed study's GPT-2 (2 iterations to keep CI short), PCA off and on."""
    results = {}
    for pca in ("off", "on"):
        out = tmp_path / pca
        assert main(["run", "gpt2", "--oversub", "4", "--pca", pca, "--iterations", "2", "-o", str(out)]) == 0
        results[pca] = RunDir(out).read_result()
    off, on = results["off"], results["on"]
    assert off["fault_count"] > on["fault_count"] > 0  # PCA reuses mapped memory
    assert on["eviction_count"] > 0 and off["eviction_count"] > 0
    assert 0 < off["read_fault_share"] < 1
    k = pd.read_parquet(RunDir(tmp_path / "on").table("kernels"))
    assert k["kernel_bytes"].max() < on["footprint_bytes"]  # the study's observation: kernels touch little
    # factor 1 with PCA: after the first iteration nothing is evicted or migrated; the only faults left are
    # first touches of segment space never used before (zero-fill)
    assert main(["run", "gpt2", "--oversub", "1", "--pca", "on", "--iterations", "2", "-o", str(tmp_path / "f1")]) == 0
    its = RunDir(tmp_path / "f1").read_table("iterations")
    later = its[its["iteration"] >= 1]
    assert (later[["htod_bytes", "dtoh_bytes", "eviction_count", "read_fault_count"]] == 0).all().all()
    assert (later["fault_count"] * 4096 <= later["zero_fill_bytes"]).all()
    assert (later["memcpy_htod_bytes"] > 0).all()  # the retained input copy


def test_gpu_mode_hands_the_flags_to_the_gpu_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU reported, auto mode picks gpu and builds GpuRunOptions from the CLI flags (runner faked)."""
    import uvmlab.measure.gpu.runner as runner
    import uvmlab.run as run_mod
    from uvmlab.measure.gpu.detect import GpuStatus

    seen: dict = {}

    def fake_run_gpu(cfg, opts, rundir):  # type: ignore[no-untyped-def]
        seen.update(cfg=cfg, opts=opts)
        result = {"mode": "gpu", "workload": cfg.workload.workload}
        rundir.write_json(rundir.result_json, result)
        return result

    monkeypatch.setattr(run_mod, "gpu_availability", lambda: GpuStatus(True, ""))
    monkeypatch.setattr(runner, "run_gpu", fake_run_gpu)
    args = [a for a in TINY_ARGS if a not in ("--mode", "sim")]
    code = main(
        [
            "run",
            *args,
            "--oversub",
            "3",
            "--footprint",
            "2GiB",
            "--baseline",
            "-o",
            str(tmp_path / "g"),
            "--format",
            "json",
        ]
    )
    assert code == 0
    assert seen["cfg"].oversub == 3.0
    assert seen["opts"].footprint == 2 * 1024**3 and seen["opts"].baseline is True and seen["opts"].nsys is False
