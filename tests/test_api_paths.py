"""uvmlab.api: paths or opened objects alike, run results give DataFrames, errors speak Python, not CLI flags."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from uvmlab import api
from uvmlab.errors import InputError, UnavailableError

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")


def test_python_message_names_parameters_not_flags() -> None:
    assert api.python_message("will not overwrite the run in x without --force") == (
        "will not overwrite the run in x without force=True"
    )
    assert api.python_message("--jobs must be >= 1, not 0") == "jobs must be >= 1, not 0"
    assert "mode='sim'" in api.python_message("use --mode sim to simulate instead")
    kept = "give the .sqlite file written by `nsys export --type sqlite`"  # a shell command stays a command
    assert api.python_message(kept) == kept


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> object:
    mp = pytest.MonkeyPatch()
    mp.setenv("UVMLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    cfg = api.RunConfig(
        api.WorkloadConfig(TINY, batch_size=64, iterations=2, options={"hidden": 512}), oversub=2, pca=False, mode="sim"
    )
    out = tmp_path_factory.mktemp("runs") / "tiny"
    res = api.run(cfg, out=out, quiet=True)
    yield cfg, res
    mp.undo()


def test_run_gives_its_tables_as_dataframes(tiny: tuple) -> None:
    _, res = tiny
    its = res.table("iterations")
    assert isinstance(its, pd.DataFrame) and len(its) == 2
    assert {"iterations", "kernels", "memory"} <= set(res.tables)
    assert all(isinstance(df, pd.DataFrame) for df in res.tables.values())
    assert int(its["fault_count"].sum()) == res.result["fault_count"]
    with pytest.raises(InputError, match="no table 'nope'"):
        res.table("nope")


def test_run_errors_speak_python(tiny: tuple) -> None:
    cfg, res = tiny
    with pytest.raises(InputError) as exc:
        api.run(cfg, out=res.path, quiet=True)
    assert "force=True" in str(exc.value) and "--force" not in str(exc.value)
    with pytest.raises(UnavailableError) as exc:
        api.run(api.RunConfig(cfg.workload, oversub=2, pca=False, mode="gpu"), out=res.path.parent / "g", quiet=True)
    assert "--" not in str(exc.value).split("`")[0]


def test_run_takes_a_workload_name_and_the_cli_settings(tiny: tuple, tmp_path: Path) -> None:
    """Issue 29: ``api.run("gpt2", oversub=4)`` was a TypeError, and ``pca="off"`` ran with PCA on."""
    cfg, res = tiny
    by_name = api.run(
        TINY, oversub=2, pca="off", batch_size=64, iterations=2, options={"hidden": 512}, mode="sim",
        out=tmp_path / "by-name", quiet=True,
    )  # fmt: skip
    assert by_name.result["pca"] is False
    assert by_name.result["iteration_time_ns"] == res.result["iteration_time_ns"]  # the same job as the RunConfig
    config = api.RunDir(by_name.path).read_json(api.RunDir(by_name.path).config_json)
    from uvmlab.run import canonical
    from workloads.registry import load_workload

    assert config["run"] == canonical(cfg, load_workload(TINY)).to_dict()  # the workload's defaults resolved once
    replaced = api.run(cfg, oversub=4, out=tmp_path / "x4", quiet=True)  # keywords replace a RunConfig's fields
    assert replaced.result["oversub"] == 4 and replaced.result["pca"] is False
    with pytest.raises(InputError, match=r"unknown parameters \['oversubscription'\].*RunConfig fields"):
        api.run(TINY, oversubscription=2)


def test_compare_runs_takes_paths_run_results_and_rundirs(tiny: tuple) -> None:
    _, res = tiny
    by_path = api.compare_runs(str(res.path), res.path)
    by_object = api.compare_runs(res, api.RunDir(res.path))
    assert by_path.totals.equals(by_object.totals)


def test_estimate_takes_names(tiny: tuple) -> None:
    cfg, _ = tiny
    a = api.estimate(cfg.workload, "A100-80GB")
    b = api.estimate(cfg.workload, api.get_gpu("A100-80GB"))
    assert a.peak_reserved_bytes == b.peak_reserved_bytes > 0


@pytest.mark.real_data
def test_summarize_takes_a_path_or_an_opened_export(real_data: Path) -> None:
    f = real_data / "nsys" / "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
    if not f.is_file():
        pytest.skip(f"{f.name} missing from real data")
    by_path = api.summarize(f)
    with api.open_export(f) as ex:
        by_object = api.summarize(ex)
    assert by_path.to_dict() == by_object.to_dict()
    assert by_path.faults["gpu_fault_count"] is not None


@pytest.mark.real_data
def test_replay_snapshot_takes_a_path_or_a_read_snapshot(real_data: Path) -> None:
    f = real_data / "snapshots" / "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle"
    if not f.is_file():
        pytest.skip(f"{f.name} missing from real data")
    by_path = api.replay_snapshot(f)
    by_object = api.replay_snapshot(api.read_snapshot(f))
    assert by_path.to_dict() == by_object.to_dict()


def test_cache_root_follows_uvmlab_cache_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from uvmlab.trace.cache import cache_root

    monkeypatch.delenv("UVMLAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "uvmlab" / "traces"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "uvmlab" / "traces"
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "u"))
    assert cache_root() == tmp_path / "u" / "traces"


def test_characterize_source_takes_a_trace_object_or_its_folder(tmp_path: Path) -> None:
    from eval_helpers import make_trace

    trace = make_trace([(3 * 2**20, 2), (2**20, 1), (2 * 2**20, 0)])
    api.write_trace(trace, tmp_path / "t")
    by_object = api.characterize_source(trace)
    by_path = api.characterize_source(str(tmp_path / "t"))
    assert by_object.table.drop(columns="allocator").equals(by_path.table.drop(columns="allocator"))
    assert by_object.table["peak_reserved_bytes"].gt(0).all()


@pytest.mark.real_data
def test_evaluate_takes_a_ground_truth_path(real_data: Path, tmp_path: Path) -> None:
    snap = real_data / "snapshots" / "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle"
    if not snap.is_file():
        pytest.skip(f"{snap.name} missing from real data")
    csv = tmp_path / "gt.csv"
    csv.write_text(f"id,source,config,gpu_memory,measured_peak_bytes,oom\nr,{snap},,80GiB,98566144,0\n")
    ev = api.evaluate(csv, ["shape-inference"])
    assert list(ev.per_run["case_id"]) == ["r"] and ev.per_run["estimate_bytes"].iloc[0] > 0
