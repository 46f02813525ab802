"""What users read (issue 29): one name per quantity in every command, units as printed, the policy a run used,
and progress lines in a log (stderr not a terminal)."""

from __future__ import annotations

import pytest

from uvmlab import console
from uvmlab.cli import main
from uvmlab.stats.schema import RESULT_LABELS

SMALL = ["alexnet", "-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2"]


def test_run_and_advise_call_the_slowdown_the_same(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """advise said "vs all-resident" for what run calls the slowdown vs native PCA on; run --policy did not say
    which policy it ran."""
    args = [*SMALL, "--oversub", "1.5", "--mode", "sim", "--policy", "pca-off", "-o", str(tmp_path / "r")]
    assert main(["run", *args]) == 0
    run_out = capsys.readouterr().out
    assert RESULT_LABELS["slowdown_vs_native_pca"] in run_out and RESULT_LABELS["slowdown_vs_native"] in run_out
    policy_row = next(line for line in run_out.splitlines() if line.startswith("| policy"))
    assert "pca-off" in policy_row
    assert main(["advise", *SMALL, "--oversub", "1.5", "--policy", "pca-off", "--no-combine"]) == 0
    advise_out = capsys.readouterr().out
    assert RESULT_LABELS["slowdown_vs_native_pca"] in advise_out and "all-resident" not in advise_out


def test_estimate_prints_mib_as_mib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *SMALL]) == 0
    out = capsys.readouterr().out
    device_peak = next(line for line in out.splitlines() if "device peak" in line)
    assert device_peak.rstrip(" |").endswith("MiB)") and " MB" not in out


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_log_progress_prints_a_line_every_tenth_or_30_s(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = _Clock()
    monkeypatch.setattr(console, "monotonic", clock)
    assert not console.err.is_terminal  # captured by pytest, as in a log
    with console.progress_bar() as bar:
        assert isinstance(bar, console.LogProgress)
        task = bar.add_task(console.plain("checks [fast]"), total=100)
        bar.update(task, completed=3)  # in the first seconds: quiet
        clock.now += 10
        bar.update(task, completed=4)  # past the quiet time, before the first tenth: the 30 s rule waits
        clock.now += 1
        bar.update(task, completed=10)  # a tenth
        bar.update(task, completed=11)
        clock.now += 31
        bar.update(task, completed=12)  # 30 s since the last line
        bar.update(task, completed=100)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "checks [fast]: 10/100 (10 %), 0:00:11 elapsed",
        "checks [fast]: 12/100 (12 %), 0:00:42 elapsed",
        "checks [fast]: 100/100 (100 %), 0:00:42 elapsed",
    ]


def test_short_work_prints_no_progress_line(capsys: pytest.CaptureFixture[str]) -> None:
    with console.progress_bar() as bar:
        task = bar.add_task("quick", total=3)
        for _ in range(3):
            bar.advance(task)
    assert capsys.readouterr().err == ""


def test_a_logged_sweep_says_how_far_it_is(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A 13-minute sweep printed nothing to its log until the last line."""
    from uvmlab.sweep.runner import _Progress

    clock = _Clock()
    monkeypatch.setattr(console, "monotonic", clock)
    with _Progress(20, True) as bar:
        for i in range(20):
            clock.now += 40  # each configuration takes 40 s
            bar.update("oom" if i == 3 else "ok")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 20  # more than 30 s between configurations: a line for each
    assert lines[0] == "sweep: 1/20 (5 %), ok 1  oom 0  error 0, 0:00:40 elapsed"
    assert lines[-1] == "sweep: 20/20 (100 %), ok 19  oom 1  error 0, 0:13:20 elapsed"
