"""One writer per output: concurrent runs into one -o, concurrent estimates of one uncached configuration.

Writers are real processes (forked from this one after the imports, so each costs no interpreter start), released
together by a barrier. The SIGKILL-mid-sweep test stays in tests/test_sweep_runner.py.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.files.owned import BOOKKEEPING

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "docs" / "examples" / "tiny_mlp.py"
WRITERS = 8


def _child(barrier: mp.synchronize.Barrier, argv: list[str]) -> None:
    barrier.wait(timeout=60)
    code = 3
    try:
        code = main(argv)
    finally:
        os._exit(code)


def _race(argvs: list[list[str]]) -> list[int]:
    """Start one forked process per argv at the same moment; return their exit codes."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(argvs))
    procs = [ctx.Process(target=_child, args=(barrier, argv)) for argv in argvs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    return [p.exitcode for p in procs]


def _assert_one_consistent_run(out: Path) -> dict:
    result = json.loads((out / "result.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["run"]["oversub"] == result["oversub"], "config.json and result.json come from different runs"
    its = pd.read_parquet(out / "tables" / "iterations.parquet")
    assert int(its["fault_count"].sum()) == result["fault_count"], "tables and result.json come from different runs"
    assert (out / ".uvmlab-run").is_file()
    return result


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_eight_runs_into_one_out_leave_one_consistent_run(tmp_path: Path) -> None:
    out = tmp_path / "R"
    factors = [2 + i for i in range(WRITERS)]  # each writer a different configuration: a mix would show
    base = ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim", "--format", "json", "-o", str(out)]
    codes = _race([[*base, "--oversub", str(f)] for f in factors])
    assert sorted(codes) == [0] + [2] * (WRITERS - 1), codes  # one writes, the others refuse with one sentence
    first = _assert_one_consistent_run(out)
    assert first["oversub"] in factors

    # again with --force into the complete run: still one writer at a time, one consistent run at the end
    codes = _race([[*base, "--oversub", str(f), "--force"] for f in factors])
    assert codes.count(0) >= 1 and set(codes) <= {0, 2}, codes
    _assert_one_consistent_run(out)
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".") and p.name not in BOOKKEEPING]
    assert not leftovers, leftovers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_eight_estimates_of_one_uncached_config_capture_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = tmp_path / "builds.log"
    wl = tmp_path / "counted_mlp.py"  # tiny_mlp that logs every build(): one build per capture
    wl.write_text(
        TINY.read_text().replace(
            "def build(cfg, device, options):\n",
            "def build(cfg, device, options):\n"
            f"    with open({str(builds)!r}, 'a') as fh:\n"
            "        fh.write('build\\n')\n",
        )
    )
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "cache"))  # empty: the configuration is uncached
    argv = ["estimate", str(wl), "-b", "8", "-n", "1", "--format", "json", "--gpu", "A100-80GB"]
    codes = _race([argv] * WRITERS)
    assert codes == [0] * WRITERS, codes
    assert builds.read_text().count("build") == 1, "the trace was captured more than once"
    entries = [p for p in (tmp_path / "cache" / "traces").iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "trace.json").is_file()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_four_traces_into_one_out_leave_one_consistent_trace(tmp_path: Path) -> None:
    """Issue 29: ``trace -o`` had no lock; four writers all exited 0 and one folder mixed batch 4's tables with
    batch 2's header, which ``trace show`` accepted."""
    pytest.importorskip("torch")  # imported here once, so the forked writers do not each import it
    import uvmlab.trace.capture  # noqa: F401
    from uvmlab.trace.schema import read_trace

    out = tmp_path / "T"
    base = ["trace", str(TINY), "-n", "1", "--format", "json", "-o", str(out)]
    batches = [2, 3, 4, 5]
    codes = _race([[*base, "-b", str(b)] for b in batches])
    assert sorted(codes) == [0, 2, 2, 2], codes  # one writes, the others refuse at once with one sentence
    first = read_trace(out)  # the write id ties every table to the header: a mixed folder is refused
    assert first.header["config"]["batch_size"] in batches

    codes = _race([[*base, "-b", str(b), "--force"] for b in batches])
    assert codes.count(0) >= 1 and set(codes) <= {0, 2}, codes
    again = read_trace(out)
    assert again.header["config"]["batch_size"] in batches
    assert main(["trace", "show", str(out), "--format", "json"]) == 0


def test_two_calibrations_into_one_file_never_both_succeed(tmp_path: Path) -> None:
    """Two ``calibrate -o p.json`` at once: one writes, the other is refused (never a silent replacement)."""
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    export = tmp_path / "v.sqlite"
    write_synthetic_export(export, faults=40, migrations=20, iterations=2, kernels_per_iteration=5)
    code = (
        "import sys, time\n"
        "from uvmlab.cli import main\n"
        "t = float(sys.argv[1])\n"
        "while time.time() < t: time.sleep(0.01)\n"
        "sys.exit(main(sys.argv[2:]))\n"
    )
    import time

    start = str(time.time() + 8)
    argv = ["calibrate", str(export), "-o", str(tmp_path / "p.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, start, *argv], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=240) for p in procs)
    errs = [p.stderr.read() for p in procs if p.stderr]
    assert codes == [0, 2], (codes, errs)
    assert any("appeared while uvmlab was writing it" in e or "exists; pass --force" in e for e in errs), errs
    json.loads((tmp_path / "p.json").read_text())
