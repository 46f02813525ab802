"""Issue 42 section 4: a sweep run whose result.json is not UTF-8, or nests 100,000 deep, is reported as broken by
``report`` and ``sweep collect`` (it was a traceback in both); the other runs still count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile import Probe, assert_refused, run_probes, tree_hashes
from uvmlab.cli import main

SPEC = "name: t\ndefaults: {mode: sim, iterations: 1}\ngrid:\n  workload: [gpt2, bert]\n  oversub: [1.0, 2]\n"
DAMAGE = {
    "not-utf8": b'\xff\xfe{"outcome": "ok"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not-an-object": b"[1, 2, 3]",
}


@pytest.fixture
def damaged_sweep(tmp_path: Path, fake_env: dict[str, str]) -> tuple[Path, list[str]]:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out)]) == 0
    runs = sorted((out / "runs").iterdir())
    for victim, data in zip(runs, DAMAGE.values(), strict=False):
        (victim / "result.json").write_bytes(data)
    return out, [r.name for r in runs[: len(DAMAGE)]]


def test_collect_lists_broken_runs_and_counts_the_others(
    damaged_sweep: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, broken = damaged_sweep
    capsys.readouterr()
    assert main(["sweep", "collect", str(out), "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["rows"] == 4 and got["outcomes"] == {"broken": 3, "ok": 1}
    import pandas as pd

    df = pd.read_parquet(out / "results.parquet").set_index("run_id")
    for run_id in broken:
        assert df.loc[run_id, "outcome"] == "broken" and "result.json" in df.loc[run_id, "error"]


def test_report_draws_the_others_and_names_the_broken(
    damaged_sweep: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, broken = damaged_sweep
    capsys.readouterr()
    assert main(["report", str(out), "--format", "json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert sorted(built["broken"]) == sorted(broken)
    page = Path(built["html"]).read_text()
    assert "Runs that did not finish" in page and all(b in page for b in broken)


def test_under_the_limits_collect_and_report_finish(damaged_sweep: tuple[Path, list[str]]) -> None:
    """Under 1 GiB / 60 s (tests/hostile.py), nothing of the sweep's runs changes but the derived files."""
    out, _ = damaged_sweep
    derived = (out / "results.parquet", out / "report")
    probes = [
        Probe("collect", ["sweep", "collect", str(out)], out.parent, out, outputs=derived),
        Probe("report", ["report", str(out)], out.parent, out, outputs=derived),
    ]
    before = tree_hashes(out / "runs")
    for outcome in run_probes(probes).values():
        assert outcome.code == 0, outcome.describe()
        assert "Traceback" not in outcome.stderr and "broken" in outcome.stderr
    assert tree_hashes(out / "runs") == before


def test_the_dry_run_calls_them_pending_and_a_sweep_redoes_them(
    damaged_sweep: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, broken = damaged_sweep
    spec = out.parent / "s.yaml"
    capsys.readouterr()
    assert main(["sweep", str(spec), "-o", str(out), "--dry-run", "--format", "json"]) == 0
    status = {c["run_id"]: c["status"] for c in json.loads(capsys.readouterr().out)["configs"]}
    assert all(status[b] == "pending" for b in broken)
    assert main(["sweep", str(spec), "-o", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["ran"] == len(broken)


def test_a_refusal_stays_one_line(tmp_path: Path) -> None:
    """A sweep folder without runs/ is still one sentence (the contract of tests/hostile.py)."""
    outcome = run_probes([Probe("no-runs", ["sweep", "collect", str(tmp_path)], tmp_path, tmp_path)])["no-runs"]
    assert_refused(outcome, words="not a sweep folder")


def test_collect_never_replaces_a_users_results_parquet_in_a_folder_uvmlab_does_not_own(tmp_path: Path) -> None:
    """A folder without uvmlab's ownership record (a sweep of an older uvmlab): collect replaced any results.parquet
    there, a user's file too (exit 0, the file became a 0-row table). It now refuses one that is not its table."""
    from uvmlab.cli import main

    (tmp_path / "runs").mkdir()
    mine = tmp_path / "results.parquet"
    mine.write_text("my precious")
    assert main(["sweep", "collect", str(tmp_path)]) == 2
    assert mine.read_text() == "my precious"
    mine.unlink()
    assert main(["sweep", "collect", str(tmp_path)]) == 0  # uvmlab's own table: rebuilt each time
    assert main(["sweep", "collect", str(tmp_path)]) == 0
