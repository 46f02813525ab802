"""Sweeps as Hydra/submitit users expect: readable run folders, KEY=V1,V2 overrides, progress with outcomes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sweep_fake_run
from rich.console import Console

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.sweep import runner
from uvmlab.sweep.runner import _Progress, plan_entries, run_sweep
from uvmlab.sweep.spec import parse_overrides, parse_spec

SPEC = """
name: t
defaults: {mode: sim, iterations: 2}
grid:
  workload: [{workload: alexnet, batch_size: 2}, gpt2]
  oversub: [1.0, 2]
  pca: [on, off]
include:
  - {workload: bert, oversub: 3}
"""


def _keys(spec) -> list[tuple[str, int | None, float, bool]]:  # type: ignore[no-untyped-def]
    return [(c.workload.workload, c.workload.batch_size, c.oversub, c.pca) for c in spec.configs]


def test_overrides_replace_axes_keep_bundles_and_reach_includes() -> None:
    spec = parse_spec(SPEC, overrides=parse_overrides(["workload=alexnet,bert", "oversub=4", "pca=off"]))
    # grid: alexnet keeps its bundled batch size; the include gets every override value too (Hydra semantics)
    assert _keys(spec) == [("alexnet", 2, 4.0, False), ("bert", None, 4.0, False), ("alexnet", None, 4.0, False)]
    assert spec.duplicates == 1  # the include's bert is the grid's bert
    spec = parse_spec(SPEC, overrides=parse_overrides(["iterations=1,3"]))  # not a grid axis: a new one
    assert sorted({c.workload.iterations for c in spec.configs}) == [1, 3]
    assert len(spec.configs) == 2 * (8 + 1)


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        (["oversubb=2"], "unknown field"),
        (["oversub=0"], "override oversub=0"),
        (["workload=gpt3"], "unknown workload 'gpt3'"),
        (["oversub"], "KEY=VALUE"),
        (["oversub=1,,2"], "comma-separated"),
        (["pca=on", "pca=off"], "given twice"),
    ],
)
def test_bad_overrides_are_one_sentence(items: list[str], needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        parse_overrides(items)


def test_cli_overrides_and_readable_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    args = ["sweep", str(spec), "workload=gpt2", "oversub=4", "-o", str(tmp_path / "o"), "--dry-run"]
    assert main([*args, "--format", "json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    names = [c["run_id"] for c in data["configs"]]
    assert len(names) == 2  # gpt2 x4 on/off; the include, overridden to gpt2 x4 (PCA on), is a duplicate
    assert names[0].startswith("gpt2-x4-pcaon-") and names[1].startswith("gpt2-x4-pcaoff-")
    assert main(["sweep", str(spec), "oversub=zero", "-o", str(tmp_path / "p"), "--dry-run"]) == 2
    assert "override oversub=zero" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_legacy_hash_folders_are_resumed(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    cfg = spec.configs[0]
    legacy = tmp_path / "runs" / cfg.config_hash()
    legacy.mkdir(parents=True)
    entries = plan_entries(spec, tmp_path)
    assert entries[0].path == legacy.resolve()
    assert entries[1].path.name.startswith("alexnet-x1-pcaoff-")
    assert len({e.path for e in entries}) == len(entries)


def test_progress_counts_ok_oom_error_and_shows_time_remaining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = sweep_fake_run.env_for_worker()
    for key in ("UVMLAB_SWEEP_RUN_FN", "PYTHONPATH"):
        monkeypatch.setenv(key, env[key])
    buf = io.StringIO()
    import uvmlab.console

    monkeypatch.setattr(uvmlab.console, "err", Console(file=buf, force_terminal=True, width=200, no_color=True))
    text = SPEC.replace("{workload: alexnet, batch_size: 2}, ", "").replace("{workload: bert, oversub: 3}", "")
    text = text.replace("include:\n  - \n", "include:\n  - {workload: bert, oversub: 2, sim.fail: [oom, error]}\n")
    summary = run_sweep(parse_spec(text), tmp_path / "o", jobs=2, progress=True)
    assert summary.outcomes == {"ok": 4, "oom": 1, "error": 1}
    shown = buf.getvalue()
    assert "ok 4  oom 1  error 1" in shown and "remaining" in shown and "6/6" in shown
    assert all(p.name.startswith(("gpt2-x", "bert-x2-")) for p in (tmp_path / "o" / "runs").iterdir())


def test_progress_unit() -> None:
    p = _Progress(4, enabled=False)
    for outcome in ("ok", "oom", "interrupted", "error", "missing"):
        p.update(outcome)
    assert p.counts == {"ok": 1, "oom": 1, "error": 2} and p.done == 4
    assert runner.run_dir_name(parse_spec(SPEC).configs[3]).startswith("alexnet-x2-pcaoff-")
