"""Outputs under stress (issue 29): every writer on a full 20 MB tmpfs, ``--force`` with the user's files in every
subfolder of an output, and a killed writer's files in the next run.

On a full disk each writer must give one sentence naming the file (exit 2), leave no ``.tmp`` file and no output
that looks complete (no result.json, trace.json, comparison.json, report page or single output file). The tmpfs is
mounted by the test (root only: elsewhere it is skipped with the reason); a full disk cannot be made another way
that still exercises the real write path (``RLIMIT_FSIZE`` gives EFBIG and a signal, not ENOSPC).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import sweep_fake_run
from uvm_synth import make_trace

from uvmlab.cli import main
from uvmlab.errors import InputError, OutputError
from uvmlab.files.atomic import atomic_write_with
from uvmlab.files.owned import MANIFEST_NAME, MARKER_NAME
from uvmlab.files.rundir import RunDir
from uvmlab.trace.schema import write_trace

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
RUN = ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim"]
COMPLETE = ("result.json", "trace.json", "comparison.json", "rep.html", "s.pickle", "t.json", "p.json")
"""Names whose presence would make an output look complete."""


# -- a full disk ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 20 MB tmpfs mounted for this module (skipped where this process may not mount one)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 20 MB tmpfs needs root; without it a full disk cannot be made for real")
    mnt = tmp_path_factory.mktemp("tmpfs")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, free: int = 0) -> Path:
    """Empty the tmpfs, then fill it so that ``free`` bytes are left; return a fresh output folder path in it."""
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True)
    for p in mnt.iterdir():
        subprocess.run(["rm", "-rf", str(p)], check=True)
    block = b"\0" * (1 << 20)
    with open(mnt / "fill", "wb") as fh:
        try:
            while True:
                fh.write(block)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    if free:
        os.truncate(mnt / "fill", (mnt / "fill").stat().st_size - free)
    return mnt / "out"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The writers' inputs, outside the tmpfs: two runs, a sweep, an export, a trace, a ground truth, data."""
    from test_badinput_cli import export, fake_sweep, titanv_folder

    d = tmp_path_factory.mktemp("inputs")
    from uvmlab.config import RunConfig, WorkloadConfig

    for name, f in (("A", 1.0), ("B", 2.0)):
        sweep_fake_run.run(RunConfig(WorkloadConfig("gpt2", iterations=2), oversub=f), out=d / name)
    trace = write_trace(make_trace(n_iter=2), d / "trace")
    (d / "gt.csv").write_text(f"id,source,config,gpu_memory,measured_peak_bytes,oom\nr1,{trace},,80GiB,30000000,0\n")
    spec = d / "spec.yaml"
    spec.write_text("defaults: {mode: sim, iterations: 1}\ngrid: {workload: [alexnet], oversub: [1.0, 2]}\n")
    return {
        "A": str(d / "A"),
        "B": str(d / "B"),
        "sweep": fake_sweep(d),
        "export": export(d),
        "trace": str(trace),
        "gt": str(d / "gt.csv"),
        "spec": str(spec),
        "data": titanv_folder(d),
        "scratch": str(d / "scratch"),
    }


WRITERS = {  # name -> argv (OUT is a path on the full disk, I[...] an input, S a scratch folder off the disk)
    "run -o": lambda o, i: [*RUN, "-o", f"{o}/r"],
    "estimate -o": lambda o, i: ["estimate", "alexnet", "-b", "2", "-n", "1", "-o", f"{o}/e"],
    "trace -o": lambda o, i: ["trace", TINY, "-n", "1", "-o", f"{o}/t"],
    "nsys import -o": lambda o, i: ["nsys", "import", i["export"], "-o", f"{o}/n"],
    "compare -o": lambda o, i: ["compare", i["A"], i["B"], "-o", f"{o}/c"],
    "report -o": lambda o, i: ["report", i["sweep"], "-o", f"{o}/rep.html"],
    "run --snapshot": lambda o, i: [*RUN, "-o", f"{i['scratch']}/r1", "--snapshot", f"{o}/s.pickle", "--force"],
    "run --timeline": lambda o, i: [*RUN, "-o", f"{i['scratch']}/r2", "--timeline", f"{o}/t.json", "--force"],
    "estimate --snapshot": lambda o, i: ["estimate", "alexnet", "-b", "2", "-n", "1", "--snapshot", f"{o}/s.pickle"],
    "nsys import --timeline": lambda o, i: [
        "nsys",
        "import",
        i["export"],
        "-o",
        f"{i['scratch']}/n",
        "--timeline",
        f"{o}/t.json",
        "--force",
    ],
    "sweep -o": lambda o, i: ["sweep", i["spec"], "-o", f"{o}/sw"],
    "calibrate -o": lambda o, i: ["calibrate", i["export"], "-o", f"{o}/p.json"],
    "evaluate -o": lambda o, i: ["evaluate", i["gt"], "-o", f"{o}/ev"],
    "fragmentation -o": lambda o, i: ["fragmentation", i["trace"], "-o", f"{o}/fr"],
    "colocate -o": lambda o, i: ["colocate", "alexnet:2", "-n", "1", "-o", f"{o}/co"],
    "validate -o": lambda o, i: ["validate", i["data"], "--check", "titanv-abc", "-o", f"{o}/va"],
}


def _assert_one_sentence_nothing_complete(
    code: int, err: str, mnt: Path, reason: str = "No space left on device"
) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("uvmlab: error: ")]
    assert "Traceback" not in err, err
    assert code == 2, err
    assert len(errors) == 1 and reason in errors[0] and str(mnt) in errors[0], err
    # besides the error, only progress lines (rich's sweep bar; uvmlab.console.LogProgress's "..., 0:00:08 elapsed",
    # which a slow machine prints once work passes LOG_QUIET_S)
    assert all(ln.startswith(("uvmlab: error: ", "sweep ")) or ln.endswith(" elapsed") for ln in lines), err
    left = [p for p in mnt.rglob("*") if p.name.endswith(".tmp") or p.name in COMPLETE]
    assert not left, left


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_on_a_full_disk_gives_one_sentence(
    writer: str, tmpfs: Path, inputs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = fill(tmpfs)
    argv = WRITERS[writer](out, inputs)
    (tmpfs / "out").mkdir()
    capsys.readouterr()
    code = main(argv)
    _assert_one_sentence_nothing_complete(code, capsys.readouterr().err, tmpfs)


@pytest.mark.parametrize("writer", ["run -o", "report -o", "trace -o"])
def test_a_disk_that_fills_halfway_leaves_no_output_that_looks_complete(
    writer: str, tmpfs: Path, inputs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """150 KB free: the first files fit, a later one does not; nothing looks complete, no temporaries stay."""
    out = fill(tmpfs, free=150_000 if writer != "trace -o" else 12_000)
    (tmpfs / "out").mkdir()
    capsys.readouterr()
    code = main(WRITERS[writer](out, inputs))
    _assert_one_sentence_nothing_complete(code, capsys.readouterr().err, tmpfs)
    assert any(p.is_file() and p.stat().st_size for p in (tmpfs / "out").rglob("*")), "nothing was written at all"


def test_a_read_only_file_system_gives_one_sentence(
    tmpfs: Path, inputs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmpfs, free=1 << 20)
    (tmpfs / "fill").unlink()
    assert subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True).returncode == 0
    try:
        for argv in ([*RUN, "-o", f"{tmpfs}/r"], ["calibrate", inputs["export"], "-o", f"{tmpfs}/p.json"]):
            capsys.readouterr()
            code = main(argv)
            _assert_one_sentence_nothing_complete(code, capsys.readouterr().err, tmpfs, "Read-only file system")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], capture_output=True)


def test_an_io_error_while_writing_is_one_sentence_and_leaves_no_temporary(tmp_path: Path) -> None:
    """EIO cannot be made on demand; the writer's failure path is the same for every errno (uvmlab.files.atomic)."""

    def failing(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OutputError, match=r"cannot write .*x\.parquet: Input/output error"):
        atomic_write_with(tmp_path / "x.parquet", failing)
    assert list(tmp_path.iterdir()) == []


# -- --force removes only what uvmlab wrote ------------------------------------------------------------------------


def _plant_user_files(root: Path, subfolders: list[str]) -> dict[Path, bytes]:
    """A user's file at the top and in every subfolder (also a nested one); return them with their content."""
    planted = {}
    for sub in ["", *subfolders, *(f"{s}/mine" for s in subfolders)]:
        folder = root / sub
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("notes.txt", "mine.parquet", "fig_mine.png"):
            (folder / name).write_bytes(f"the user's {sub}/{name}\n".encode())
            planted[folder / name] = (folder / name).read_bytes()
    return planted


def _assert_kept(planted: dict[Path, bytes], root: Path) -> None:
    for path, content in planted.items():
        assert path.read_bytes() == content, f"{path} was removed or changed"
    listed = set(json.loads((root / MANIFEST_NAME).read_text())["files"])
    assert not listed & {p.relative_to(root).as_posix() for p in planted}, "a user's file is in uvmlab's manifest"


def test_force_on_a_run_keeps_the_users_files_in_every_subfolder(tmp_path: Path) -> None:
    """Issue 29 defect 1: ``RUN -o P; echo n > P/logs/notes.txt; RUN --oversub 2 -o P --force`` lost notes.txt."""
    out = tmp_path / "P"
    assert main([*RUN, "-o", str(out)]) == 0
    planted = _plant_user_files(out, ["logs", "figures", "tables"])
    assert main([*RUN, "--oversub", "2", "-o", str(out), "--force"]) == 0
    _assert_kept(planted, out)
    assert json.loads((out / "result.json").read_text())["oversub"] == 2.0
    assert RunDir(out).read_table("iterations")["fault_count"].sum() == RunDir(out).read_result()["fault_count"]


def test_force_on_trace_comparison_and_report_folders_keeps_the_users_files(
    tmp_path: Path, inputs: dict[str, str]
) -> None:
    trace = tmp_path / "T"
    write_trace(make_trace(n_iter=1), trace)
    planted = _plant_user_files(trace, ["sub"])
    with pytest.raises(InputError, match="--force"):
        write_trace(make_trace(n_iter=2), trace)
    write_trace(make_trace(n_iter=2), trace, force=True)
    _assert_kept(planted, trace)
    assert main(["trace", "show", str(trace)]) == 0

    cmp = tmp_path / "C"
    assert main(["compare", inputs["A"], inputs["B"], "-o", str(cmp)]) == 0
    planted = _plant_user_files(cmp, ["tables", "figures"])
    assert main(["compare", inputs["B"], inputs["A"], "-o", str(cmp), "--force"]) == 0
    _assert_kept(planted, cmp)
    assert (cmp / "comparison.json").is_file() and (cmp / "tables" / "totals.parquet").is_file()

    page = tmp_path / "paper" / "report.html"
    assert main(["report", inputs["sweep"], "-o", str(page)]) == 0
    planted = _plant_user_files(page.parent / "figures", ["sub"])
    assert main(["report", inputs["sweep"], "-o", str(page), "--force"]) == 0
    _assert_kept(planted, page.parent / "figures")
    assert (page.parent / "figures" / "fig3_slowdown.png").read_bytes()[:4] == b"\x89PNG"


def test_a_folder_without_a_manifest_is_never_guessed(tmp_path: Path) -> None:
    """A run directory of an uvmlab before the manifest: --force cannot tell its tables from the user's: refused."""
    out = tmp_path / "R"
    (out / "tables").mkdir(parents=True)
    (out / MARKER_NAME).write_text('{"uvmlab": "0.1.0"}\n')
    (out / "result.json").write_text('{"outcome": "ok"}\n')
    (out / "tables" / "maybe_mine.parquet").write_bytes(b"PAR1")
    with pytest.raises(InputError, match="kept no list of its files"):
        RunDir(out).prepare(force=True)
    assert (out / "tables" / "maybe_mine.parquet").read_bytes() == b"PAR1" and (out / "result.json").is_file()


# -- a killed writer -----------------------------------------------------------------------------------------------


def test_a_killed_run_leaves_nothing_in_the_next_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29 defect 5: ``RUN --figure-format svg -o R & kill -9; RUN --oversub 3 -o R`` kept the dead run's .svg
    figure and a .tmp file in a "complete" run. The dead writer's state is made exactly as a kill leaves it: files
    written through the run directory (so in its manifest), a temporary of the figure it was writing, no result."""
    out = tmp_path / "R"
    dead = RunDir(out, figure_format="svg")
    dead.prepare()
    dead.write_json(dead.config_json, {"oversub": 9})
    dead.write_table("iterations", pd.DataFrame({"fault_count": [123]}))
    dead.write_table("stale_only_in_the_dead_run", pd.DataFrame({"x": [1]}))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    dead.write_figure("memory_per_kernel", fig)
    plt.close(fig)
    half = dead.record(dead.figure("faults_migrations"))  # recorded, then killed while its temporary was written
    (half.parent / f".{half.name}.k1ll3d.tmp").write_bytes(b"<svg half")
    (out / ".result.json.deadbeef.tmp").write_text('{"outcome": "ok"')
    dead.release()  # what the kernel does when the process dies

    assert main([*RUN, "--oversub", "3", "-o", str(out)]) == 0
    assert not list(out.rglob("*.tmp")), list(out.rglob("*.tmp"))
    assert not list(out.rglob("*.svg")) and not (out / "tables" / "stale_only_in_the_dead_run.parquet").exists()
    assert json.loads((out / "result.json").read_text())["oversub"] == 3.0
    assert json.loads((out / "config.json").read_text())["run"]["oversub"] == 3.0
