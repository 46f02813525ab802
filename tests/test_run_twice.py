"""Running the README's main command twice works (issue 29: the second time was "will not overwrite the complete
run ... without --force", exit 2). Without -o: the stored identical simulation is shown as such, anything else
goes to a new folder; with -o the refusal stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
README_LIKE = ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim", "--oversub", "4", "--pca", "off"]
"""``uvmlab run gpt2 --oversub 4 --pca off`` with a small job (the same code path, seconds instead of a minute)."""


def _runs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "runs").iterdir())


def test_the_same_command_twice_shows_the_stored_result(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the session's trace cache (conftest)
    first = subprocess.run([sys.executable, "-m", "uvmlab", *README_LIKE], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stderr
    (folder,) = _runs(tmp_path)
    stored = (tmp_path / "runs" / folder / "result.json").read_bytes()
    second = subprocess.run([sys.executable, "-m", "uvmlab", *README_LIKE], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=300)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert f"Stored in runs/{folder} (shown again)" in second.stdout
    assert "already holds this run (same configuration and uvmlab version)" in second.stderr
    assert "| slowdown vs native" in second.stdout  # the same table as the first time
    assert _runs(tmp_path) == [folder] and (tmp_path / "runs" / folder / "result.json").read_bytes() == stored


def test_what_cannot_be_reused_goes_to_a_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", TINY, "--option", "hidden=512", "-b", "64", "-n", "2", "--mode", "sim", "--format", "json"]
    assert main(args) == 0
    (first,) = _runs(tmp_path)
    assert main(args) == 0  # a workload file may have changed since: simulated again, into <dir>-2
    assert _runs(tmp_path) == [first, f"{first}-2"]
    assert f"writing runs/{first}-2" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0  # --force: the default folder itself, again
    assert _runs(tmp_path) == [first, f"{first}-2"]


def test_a_stored_run_of_another_version_is_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(README_LIKE) == 0
    (first,) = _runs(tmp_path)
    env_json = tmp_path / "runs" / first / "env.json"
    env_json.write_text(json.dumps({**json.loads(env_json.read_text()), "uvmlab": "0.0.1"}))
    assert main(README_LIKE) == 0  # written by another uvmlab version: simulated again
    assert main(README_LIKE) == 0  # ... and that run is shown the third time
    assert _runs(tmp_path) == [first, f"{first}-2"]
    assert f"Stored in runs/{first}-2 (shown again)" in capsys.readouterr().out
    assert main([*README_LIKE, "--figure-format", "svg"]) == 0  # no svg figures stored: simulated again
    assert _runs(tmp_path) == [first, f"{first}-2", f"{first}-3"]
    explicit = ["-o", str(tmp_path / "runs" / first)]
    capsys.readouterr()
    assert main([*README_LIKE, *explicit]) == 2  # an explicit -o keeps the refusal
    assert "will not overwrite the complete run" in capsys.readouterr().err
