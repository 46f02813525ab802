"""The trace cache and the trace/workloads commands (in-process CLI, exit codes, broken inputs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import uvmlab.trace.capture as capture_mod
from uvmlab.cli import main
from uvmlab.config import WorkloadConfig
from uvmlab.trace import cache
from uvmlab.trace.schema import read_trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "tiny_mlp.py"


def test_cache_captures_once_and_recaptures_corrupt_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path))
    calls: list[int] = []
    real = capture_mod.capture_trace

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(capture_mod, "capture_trace", counting)
    cfg = WorkloadConfig(str(EXAMPLE), batch_size=8, iterations=2)
    t1 = cache.get_trace(cfg)
    t2 = cache.get_trace(cfg)
    assert len(calls) == 1
    assert t1.allocations.equals(t2.allocations)
    entry = tmp_path / "traces" / cache.cache_key(cfg)
    assert (entry / "trace.json").is_file()
    # another configuration has another key
    assert cache.cache_key(cfg) != cache.cache_key(WorkloadConfig(str(EXAMPLE), batch_size=9, iterations=2))
    # corrupt entry: re-captured and replaced
    (entry / "allocations.parquet").write_bytes(b"not parquet")
    t3 = cache.get_trace(cfg)
    assert len(calls) == 2 and t3.allocations.equals(t1.allocations)
    read_trace(entry)  # the replacement is readable
    # an incomplete entry (no trace.json) is replaced too
    (entry / "trace.json").unlink()
    cache.get_trace(cfg)
    assert len(calls) == 3 and (entry / "trace.json").is_file()


def test_unwritable_cache_still_returns_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("UVMLAB_CACHE", str(blocker))
    capsys.readouterr()
    trace = cache.get_trace(WorkloadConfig(str(EXAMPLE), batch_size=2, iterations=1))
    assert len(trace.allocations) > 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not writable" in lines[0] and lines[0].startswith("uvmlab: warning: ")  # no source


def test_an_entry_replaced_by_a_plain_file_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: a file where a cache entry's folder belongs was never removed, so every later run warned twice
    and captured again."""
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path))
    cfg = WorkloadConfig(str(EXAMPLE), batch_size=2, iterations=1)
    entry = tmp_path / "traces" / cache.cache_key(cfg)
    entry.parent.mkdir(parents=True)
    entry.write_text("not a trace folder")
    capsys.readouterr()
    cache.get_trace(cfg)
    assert entry.is_dir() and (entry / "trace.json").is_file()
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(warnings) == 1 and "capturing it again" in warnings[0]
    cache.get_trace(cfg)
    assert capsys.readouterr().err.strip() == ""  # healed: read from the cache, no warning


def test_trace_capture_and_show_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    assert main(["trace", str(EXAMPLE), "-o", str(out), "-b", "4", "-n", "2", "--option", "hidden=16"]) == 0
    assert read_trace(out).header["config"]["options"] == {"hidden": 16}
    capsys.readouterr()
    assert main(["trace", "show", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("peak live tensor bytes", "parameter", "optimizer_state", "gradient", "forward", "backward"):
        assert word in text
    assert main(["trace", "show", str(out), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["iterations"] == 2 and s["peak_live_bytes"] > 0
    cats = {c["category"]: c for c in s["categories"]}
    assert cats["optimizer_state"]["allocated_bytes"] == 2 * cats["parameter"]["allocated_bytes"]


def test_trace_capture_subcommand_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    argv = ["trace", "capture", str(EXAMPLE), "-o", str(out), "-n", "1", "--optimizer", "sgd", "--format", "json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert not any(c["category"] == "optimizer_state" for c in s["categories"])  # SGD without momentum


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trace", "resnet9000", "-o", "X"], "known workloads"),
        (["trace", "gpt2", "-o", "X", "-b", "0"], "batch size"),
        (["trace", "gpt2", "-o", "X", "-b", "-3"], "batch size"),
        (["trace", "gpt2", "-o", "X", "--option", "layers=2"], "its options are"),
        (["trace", "gpt2", "-o", "X", "--option", "oops"], "KEY=VALUE"),
        (["trace", "show", "NOPE"], "not a uvmlab trace"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # bad input makes no output folder


def test_trace_show_refuses_broken_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good"
    assert main(["trace", str(EXAMPLE), "-o", str(good), "-n", "1", "--format", "json"]) == 0
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    (broken / "kernels.parquet").write_bytes(b"\x00" * 10)
    capsys.readouterr()
    assert main(["trace", "show", str(broken)]) == 2
    assert "kernels.parquet is not a readable Parquet file" in capsys.readouterr().err  # the one Parquet reader
    (good / "trace.json").write_text("{not json")
    assert main(["trace", "show", str(good)]) == 2


def test_trace_help_explains_both_forms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--help"]) == 0
    text = capsys.readouterr().out
    assert "uvmlab trace WORKLOAD -o DIR" in text and "uvmlab trace show DIR" in text


def test_workloads_command_lists_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "--parameters", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gpt2"]["default_batch_size"] == 8 and 124e6 < rows["gpt2"]["parameters"] < 125e6
    assert set(rows) == {"alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small"}
