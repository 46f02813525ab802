"""Fuzz-style bad-input corpus: every command, fed each mistake and hostile file of issue 13 (built here).

For every case: exit code 2, exactly one line on stderr ("uvmlab: error: ..."), no traceback, and the inputs
(every file under the case's input folder: hashed before and after) unchanged. Most cases run in-process
(``uvmlab.cli.main``; a traceback there would surface as an exception and fail the test); the ``sub`` cases run
``python -m uvmlab`` in a real process where the exit-code contract needs one (OSError paths, code that exits).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from uvmlab.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
RUN = ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim"]
PY_TAG = "grid: {{workload: [alexnet]}}\n{where}: !!python/object/apply:os.system ['touch {d}/pwned']{end}\n"
"""A spec with a code-running YAML tag in field ``where`` (SafeLoader constructs nothing from it)."""
READ_ONLY = Path("/sys/uvmlab-badinput")  # sysfs refuses mkdir even for root (EPERM); skipped where absent


def _event(**kw: object) -> dict[str, object]:
    return {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": [], **kw}


def _pickle(path: Path, obj: object) -> str:
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return str(path)


def bomb(d: Path) -> str:
    """Issue 13: one list of 200,000 events referenced by 500 device traces (~1 MB; ~1e9 objects expanded)."""
    events = [_event()] * 200_000
    return _pickle(d / "bomb.pickle", {"segments": [], "device_traces": [events] * 500})


def huge_size(d: Path) -> str:
    return _pickle(d / "huge.pickle", {"segments": [], "device_traces": [[_event(size=10**30)]]})


def negative_size(d: Path) -> str:
    return _pickle(d / "neg.pickle", {"segments": [], "device_traces": [[_event(size=-4096)]]})


def cyclic(d: Path) -> str:
    loop: list[object] = []
    loop.append(loop)
    return _pickle(d / "cycle.pickle", {"segments": [], "device_traces": [loop]})


def code_pickle(d: Path) -> str:
    marker = d / "pwned"
    data = b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."
    (d / "code.pickle").write_bytes(data)
    return str(d / "code.pickle")


def random_bytes(d: Path, name: str, n: int = 3000) -> str:
    (d / name).write_bytes(os.urandom(n))
    return str(d / name)


def foreign_run(d: Path) -> str:
    """A user's folder holding their own result.json next to their code (defect 1)."""
    (d / "P" / "src").mkdir(parents=True)
    (d / "P" / "src" / "main.py").write_text("print('precious')\n")
    (d / "P" / "result.json").write_text("{}\n")
    return str(d / "P")


def user_config(d: Path) -> str:
    (d / "mine").mkdir()
    (d / "mine" / "config.json").write_text('{"learning_rate": 0.1}\n')
    return str(d / "mine")


def workload_file(d: Path, body: str, name: str = "wl.py") -> str:
    (d / name).write_text(body)
    return str(d / name)


def evil_py(d: Path) -> str:
    marker = d / "pwned"
    return workload_file(d, f"open({str(marker)!r}, 'w').write('ran')\n", "evil.py")


def gt_csv(d: Path, source: str) -> str:
    (d / "gt.csv").write_text(f"id,source,config,gpu_memory,measured_peak_bytes,oom\nr1,{source},,80GiB,1000000,0\n")
    return str(d / "gt.csv")


def sweep_dir(d: Path) -> str:
    (d / "sw" / "runs").mkdir(parents=True)
    (d / "sw" / "results.parquet").write_bytes(b"PAR1" + os.urandom(200))
    return str(d / "sw")


def symlink_run(d: Path) -> str:
    (d / "real").mkdir()
    (d / "real" / ".uvmlab-run").write_text("{}\n")
    (d / "real" / "result.json").write_text('{"outcome": "ok"}\n')
    os.symlink(d / "real", d / "link")
    return str(d / "link")


def yaml_file(d: Path, text: str) -> str:
    (d / "spec.yaml").write_text(text)
    return str(d / "spec.yaml")


def trace_dir(d: Path, header: str) -> str:
    (d / "tr").mkdir()
    (d / "tr" / "trace.json").write_text(header)
    return str(d / "tr")


def snapshot_folder_without_usable(d: Path) -> str:
    (d / "snaps").mkdir()
    (d / "snaps" / "bad.pickle").write_bytes(b"\x80\x04not really")
    return str(d / "snaps")


@dataclass(frozen=True)
class Case:
    """One bad input: ``argv(inputs, out)`` builds the files under ``inputs`` and returns the command line."""

    name: str
    argv: Callable[[Path, Path], list[str]]
    sub: bool = False
    needs: Path | None = None
    not_created: str | None = None  # a file under inputs that must NOT exist afterwards (code did not run)
    in_inputs: bool = False  # run from inside the input folder (relative paths in the input resolve there)


CASES = [
    # -- run: numbers, outputs, workloads -----------------------------------------------------------------------
    Case("run-oversub-1e-300", lambda d, o: [*RUN, "--oversub", "1e-300", "-o", str(o)]),
    Case("run-oversub-nan", lambda d, o: [*RUN, "--oversub", "nan", "-o", str(o)]),
    Case("run-oversub-negative", lambda d, o: [*RUN, "--oversub", "-2", "-o", str(o)]),
    Case("run-iterations-1e12", lambda d, o: [*RUN[:-4], "--mode", "sim", "-n", str(10**12), "-o", str(o)]),
    Case("run-batch-zero", lambda d, o: ["run", "alexnet", "-b", "0", "-n", "1", "--mode", "sim", "-o", str(o)]),
    Case("run-option-no-equals", lambda d, o: [*RUN, "--option", "seq_len", "-o", str(o)]),
    Case("run-unknown-workload", lambda d, o: ["run", "nosuchmodel", "--mode", "sim", "-o", str(o)]),
    Case("run-o-existing-file", lambda d, o: [*RUN, "-o", workload_file(d, "x = 1\n", "notes.txt")]),
    Case("run-o-under-a-file", lambda d, o: [*RUN, "-o", workload_file(d, "x = 1\n", "f.txt") + "/sub"]),
    Case("run-o-name-too-long", lambda d, o: [*RUN, "-o", str(o.parent / ("a" * 300))], sub=True),
    Case("run-o-read-only", lambda d, o: [*RUN, "-o", str(READ_ONLY)], sub=True, needs=Path("/sys")),
    Case("run-o-symlink", lambda d, o: [*RUN, "-o", symlink_run(d), "--force"]),
    Case("run-force-foreign-folder", lambda d, o: [*RUN, "-o", foreign_run(d), "--force"]),
    Case("run-o-user-config", lambda d, o: [*RUN, "-o", user_config(d)]),
    Case(
        "run-workload-raises",
        lambda d, o: [
            *RUN[:1],
            workload_file(d, "raise ValueError('boom')\n"),
            "-n",
            "1",
            "--mode",
            "sim",
            "-o",
            str(o),
        ],
        sub=True,
    ),
    Case(
        "run-workload-sys-exit-0",
        lambda d, o: [
            *RUN[:1],
            workload_file(d, "import sys\nsys.exit(0)\n"),
            "-n",
            "1",
            "--mode",
            "sim",
            "-o",
            str(o),
        ],
        sub=True,
    ),
    Case(
        "run-alexnet-batch-1e12",
        lambda d, o: ["run", "alexnet", "-b", str(10**12), "-n", "1", "--mode", "sim", "-o", str(o)],
    ),
    Case(
        "run-gpt2-batch-1e12", lambda d, o: ["run", "gpt2", "-b", str(10**12), "-n", "1", "--mode", "sim", "-o", str(o)]
    ),
    # -- estimate -----------------------------------------------------------------------------------------------
    Case(
        "estimate-snapshot-existing",
        lambda d, o: [
            "estimate",
            "alexnet",
            "-b",
            "2",
            "-n",
            "1",
            "--snapshot",
            _pickle(d / "old.pickle", {"segments": []}),
        ],
    ),
    Case(
        "estimate-o-foreign-folder",
        lambda d, o: ["estimate", "alexnet", "-b", "2", "-n", "1", "-o", foreign_run(d), "--force"],
    ),
    Case("estimate-iterations-negative", lambda d, o: ["estimate", "alexnet", "-n", "-3"]),
    # -- trace --------------------------------------------------------------------------------------------------
    Case("trace-o-existing-trace", lambda d, o: ["trace", TINY, "-n", "1", "-o", trace_dir(d, '{"x": 1}\n')]),
    Case("trace-show-header-list", lambda d, o: ["trace", "show", trace_dir(d, "[1]\n")]),
    Case("trace-show-header-binary", lambda d, o: ["trace", "show", _binary_trace(d)]),
    Case("trace-show-missing", lambda d, o: ["trace", "show", str(d / "nothing")]),
    # -- snapshot show / replay / fragmentation: hostile pickles ------------------------------------------------
    Case("snapshot-shared-reference-bomb", lambda d, o: ["snapshot", "show", bomb(d)]),
    Case("snapshot-size-1e30", lambda d, o: ["snapshot", "show", huge_size(d)]),
    Case("snapshot-negative-size", lambda d, o: ["snapshot", "show", negative_size(d)]),
    Case("snapshot-cycle", lambda d, o: ["snapshot", "show", cyclic(d)]),
    Case("snapshot-code-global", lambda d, o: ["snapshot", "show", code_pickle(d)], not_created="pwned"),
    Case("snapshot-random-bytes", lambda d, o: ["snapshot", "show", random_bytes(d, "r.pickle")]),
    Case("replay-shared-reference-bomb", lambda d, o: ["replay", bomb(d)]),
    Case("replay-size-1e30", lambda d, o: ["replay", huge_size(d)]),
    Case("fragmentation-shared-reference-bomb", lambda d, o: ["fragmentation", bomb(d)]),
    Case("fragmentation-negative-size", lambda d, o: ["fragmentation", negative_size(d)]),
    # -- evaluate -----------------------------------------------------------------------------------------------
    Case("evaluate-random-bytes-csv", lambda d, o: ["evaluate", random_bytes(d, "g.csv")]),
    Case("evaluate-csv-absolute-code", lambda d, o: ["evaluate", gt_csv(d, evil_py(d))], not_created="pwned"),
    Case("evaluate-csv-relative-code", lambda d, o: ["evaluate", _rel_csv(d)], not_created="pwned", in_inputs=True),
    Case("evaluate-no-usable-snapshots", lambda d, o: ["evaluate", snapshot_folder_without_usable(d)]),
    Case("evaluate-o-is-the-input", lambda d, o: ["evaluate", (s := snapshot_folder_without_usable(d)), "-o", s]),
    # -- calibrate / compare / report / nsys / sweep / shim / colocate ------------------------------------------
    Case("calibrate-o-is-the-input", lambda d, o: ["calibrate", (v := export(d)), "-o", v]),
    Case(
        "calibrate-o-existing",
        lambda d, o: ["calibrate", export(d), "-o", workload_file(d, "{}\n", "p.json")],
    ),
    Case("compare-o-is-an-input", lambda d, o: ["compare", (a := fake_run(d, "A")), fake_run(d, "B"), "-o", a]),
    Case("compare-o-existing", lambda d, o: ["compare", fake_run(d, "A"), fake_run(d, "B"), "-o", _comparison(d)]),
    Case(
        "compare-o-another-run-even-with-force",
        lambda d, o: ["compare", fake_run(d, "A"), fake_run(d, "B"), "-o", fake_run(d, "C"), "--force"],
    ),
    Case("report-o-existing", lambda d, o: ["report", sweep_dir(d), "-o", workload_file(d, "<html/>", "r.html")]),
    Case("report-o-is-results", lambda d, o: ["report", (s := sweep_dir(d)), "-o", f"{s}/results.parquet"]),
    Case("nsys-import-random", lambda d, o: ["nsys", "import", random_bytes(d, "x.sqlite"), "-o", str(o)]),
    Case("nsys-import-o-is-the-input", lambda d, o: ["nsys", "import", (x := random_bytes(d, "x.sqlite")), "-o", x]),
    Case(
        "sweep-yaml-python-apply",
        lambda d, o: ["sweep", yaml_file(d, f"!!python/object/apply:os.system ['touch {d}/pwned']\n"), "-o", str(o)],
        not_created="pwned",
    ),
    Case(
        "sweep-yaml-python-in-grid",
        lambda d, o: [
            "sweep",
            yaml_file(d, f"grid:\n  workload: !!python/object/apply:os.system ['touch {d}/pwned']\n"),
            "-o",
            str(o),
        ],
        not_created="pwned",
    ),
    Case(
        "sweep-yaml-python-in-name",
        lambda d, o: ["sweep", yaml_file(d, PY_TAG.format(d=d, where="name", end="")), "-o", str(o)],
        not_created="pwned",
    ),
    Case(
        "sweep-yaml-python-in-values",
        lambda d, o: ["sweep", yaml_file(d, PY_TAG.format(d=d, where="defaults: {iterations", end="}")), "-o", str(o)],
        not_created="pwned",
    ),
    Case(
        "sweep-o-holds-a-users-spec",
        lambda d, o: ["sweep", yaml_file(d, "grid: {workload: [alexnet]}\n"), "-o", _users_spec_folder(d)],
    ),
    Case(
        "sweep-o-existing-file",
        lambda d, o: [
            "sweep",
            yaml_file(d, "grid: {workload: [alexnet]}\n"),
            "-o",
            workload_file(d, "x\n", "file.txt"),
        ],
    ),
    Case(
        "shim-build-read-only",
        lambda d, o: ["shim", "build", "--cache-dir", str(READ_ONLY)],
        sub=True,
        needs=Path("/sys"),
    ),
    Case("colocate-o-user-config", lambda d, o: ["colocate", "alexnet:2", "-n", "1", "-o", user_config(d)]),
    # -- commands merged beside issue 13 (validate, run --timeline/--snapshot, nsys import --timeline) -----------
    Case("advise-unknown-workload", lambda d, o: ["advise", "nosuchmodel", "-n", "1"]),
    Case("advise-unknown-policy", lambda d, o: ["advise", "alexnet", "-b", "2", "-n", "1", "--policy", "nosuch"]),
    Case(
        "sweep-override-bad-value",
        lambda d, o: ["sweep", yaml_file(d, "grid: {workload: [alexnet]}\n"), "oversub=abc", "-o", str(o)],
    ),
    Case(
        "validate-o-is-the-data",
        lambda d, o: ["validate", (v := _titanv_folder(d)), "--check", "titanv-abc", "-o", v, "--force"],
    ),
    Case("run-timeline-existing", lambda d, o: [*RUN, "-o", str(o), "--timeline", workload_file(d, "{}\n", "t.json")]),
    Case("run-snapshot-existing", lambda d, o: [*RUN, "-o", str(o), "--snapshot", _pickle(d / "s.pickle", {})]),
    Case(
        "nsys-import-timeline-existing",
        lambda d, o: ["nsys", "import", export(d), "-o", str(o), "--timeline", workload_file(d, "{}\n", "t.json")],
    ),
]


def _titanv_folder(d: Path) -> str:
    """A data folder with the (empty) folder of the titanv-abc check: validate gets past its data check."""
    (d / "data" / "uvm" / "uvm-eval_titanv_460.27.04").mkdir(parents=True)
    return str(d / "data")


def _users_spec_folder(d: Path) -> str:
    (d / "project").mkdir()
    (d / "project" / "spec.yaml").write_text("# the user's own notes\n")
    return str(d / "project")


def export(d: Path) -> str:
    """A valid (synthetic) nsys export."""
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    write_synthetic_export(d / "v.sqlite", faults=0, migrations=50, iterations=2, kernels_per_iteration=5)
    return str(d / "v.sqlite")


def fake_run(d: Path, name: str) -> str:
    """A complete run directory, written in milliseconds by the sweep tests' stand-in for uvmlab.run."""
    import sweep_fake_run

    from uvmlab.config import RunConfig, WorkloadConfig

    sweep_fake_run.run(RunConfig(WorkloadConfig("gpt2", iterations=2), oversub=2.0), out=d / name)
    return str(d / name)


def _binary_trace(d: Path) -> str:
    (d / "tr").mkdir()
    (d / "tr" / "trace.json").write_bytes(b"\xff\xfe\x00garbage")
    return str(d / "tr")


def _rel_csv(d: Path) -> str:
    evil_py(d)
    return gt_csv(d, "evil.py")


def _comparison(d: Path) -> str:
    (d / "cmp").mkdir()
    (d / "cmp" / "comparison.json").write_text("{}\n")
    return str(d / "cmp")


def tree_hashes(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): files by SHA-256, folders and links by kind/target."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run_sub(argv: list[str], cache: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "UVMLAB_CACHE": cache, "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "uvmlab", *argv], env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.needs is not None and not case.needs.is_dir():
        pytest.skip(f"{case.needs} is not on this machine")
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    if case.in_inputs:
        monkeypatch.chdir(inputs)
    argv = case.argv(inputs, out)
    before = tree_hashes(inputs)
    if case.sub:
        code, err = _run_sub(argv, os.environ["UVMLAB_CACHE"])
    else:
        code = main(argv)
        err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("uvmlab: error: "), err
    assert tree_hashes(inputs) == before, "an input was changed or a file was written among the inputs"
    if case.not_created:
        assert not (inputs / case.not_created).exists(), "code named by the input ran"


def test_force_keeps_unrelated_files_of_an_owned_run(tmp_path: Path) -> None:
    """--force on uvmlab's own run directory replaces only uvmlab's files (defect 1)."""
    out = tmp_path / "R"
    assert main([*RUN, "-o", str(out)]) == 0
    (out / "notes.txt").write_text("mine\n")
    (out / "src").mkdir()
    (out / "src" / "main.py").write_text("print(1)\n")
    assert main([*RUN, "--oversub", "2", "-o", str(out), "--force"]) == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "src" / "main.py").is_file()
    assert json.loads((out / "result.json").read_text())["oversub"] == 2.0


def test_markup_in_output_path_is_printed_not_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-o 'a[/]b'`` crashed rich after the run was written (defect 7)."""
    out = tmp_path / "a[" / "]b"
    assert main([*RUN, "-o", str(out)]) == 0
    assert f"Wrote {out}" in capsys.readouterr().out
