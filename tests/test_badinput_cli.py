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
EST = ["estimate", "alexnet", "-b", "2", "-n", "1"]
BIG = "1e308GiB"
DEEP_JSON = "[" * 5000 + "]" * 5000
"""JSON nested 5,000 deep: Python's decoder recursed into a RecursionError traceback (issue 29)."""
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
        lambda d, o: ["validate", (v := titanv_folder(d)), "--check", "titanv-abc", "-o", v, "--force"],
    ),
    Case("run-timeline-existing", lambda d, o: [*RUN, "-o", str(o), "--timeline", workload_file(d, "{}\n", "t.json")]),
    Case("run-snapshot-existing", lambda d, o: [*RUN, "-o", str(o), "--snapshot", _pickle(d / "s.pickle", {})]),
    Case(
        "nsys-import-timeline-existing",
        lambda d, o: ["nsys", "import", export(d), "-o", str(o), "--timeline", workload_file(d, "{}\n", "t.json")],
    ),
    # -- issue 29: numbers that overflow, deep JSON, damaged exports and trace folders -------------------------------
    Case("run-gpu-memory-1e308", lambda d, o: [*RUN, "--gpu-memory", "1e308GiB", "-o", str(o)]),
    Case("estimate-gpu-memory-1e308", lambda d, o: ["estimate", "alexnet", "-b", "2", "-n", "1", "--gpu-memory", BIG]),
    Case("colocate-gpu-memory-1e308", lambda d, o: ["colocate", "alexnet:2", "-n", "1", "--gpu-memory", BIG]),
    Case("evaluate-gpu-memory-1e308", lambda d, o: ["evaluate", gt_csv(d, "alexnet"), "--gpu-memory", BIG]),
    Case("run-gpu-memory-beyond-the-device-range", lambda d, o: [*RUN, "--gpu-memory", "100TiB", "-o", str(o)]),
    Case("estimate-alloc-conf-nan", lambda d, o: [*EST, "--alloc-conf", "max_split_size_mb:nan"]),
    Case("estimate-alloc-conf-1e308", lambda d, o: [*EST, "--alloc-conf", "max_split_size_mb:1e308"]),
    Case("run-sim-option-deep-json", lambda d, o: [*RUN, "--sim-option", f"knob={DEEP_JSON}", "-o", str(o)]),
    Case("estimate-proc-self-mem", lambda d, o: ["estimate", "/proc/self/mem"], needs=Path("/proc/self")),
    Case("nsys-import-text-in-a-number-column", lambda d, o: ["nsys", "import", text_in_numbers(d), "-o", str(o)]),
    Case("trace-show-missing-values", lambda d, o: ["trace", "show", damaged_trace(d, "nan")]),
    Case("trace-show-duplicated-kernels", lambda d, o: ["trace", "show", damaged_trace(d, "dup-kernels")]),
    Case("trace-show-emptied-tables", lambda d, o: ["trace", "show", damaged_trace(d, "empty")]),
    Case("trace-show-mixed-writes", lambda d, o: ["trace", "show", damaged_trace(d, "mixed")]),
    # -- issue 29: outputs inside inputs, through links, over a user's figure ---------------------------------------
    Case(
        "validate-o-inside-the-data",
        lambda d, o: ["validate", (v := titanv_folder(d)), "--check", "titanv-abc", "-o", f"{v}/uvm/out"],
    ),
    Case(
        "compare-o-inside-an-input-run",
        lambda d, o: ["compare", (a := fake_run(d, "A")), fake_run(d, "B"), "-o", f"{a}/tables", "--force"],
    ),
    Case("report-through-a-symlink", lambda d, o: ["report", linked_report(d)]),
    Case(
        "report-force-keeps-a-users-figure",
        lambda d, o: ["report", fake_sweep(d), "-o", users_paper(d) + "/report.html", "--force"],
    ),
]


def titanv_folder(d: Path) -> str:
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


def text_in_numbers(d: Path) -> str:
    """A valid export with text in the INTEGER column start of one fault row (SQLite keeps what it is given)."""
    import sqlite3

    from uvmlab.measure.nsys import schema as S
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    path = d / "text.sqlite"
    write_synthetic_export(path, faults=20, migrations=10, iterations=2, kernels_per_iteration=5)
    con = sqlite3.connect(path)
    con.execute(f"UPDATE {S.GPU_FAULTS} SET start = 'abc' WHERE rowid = (SELECT min(rowid) FROM {S.GPU_FAULTS})")
    con.commit()
    con.close()
    return str(path)


def damaged_trace(d: Path, how: str) -> str:
    """A trace folder written by uvmlab, then damaged: a missing value, a duplicated kernel row, every table
    emptied, or the allocations table of another write (a mixed folder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from uvm_synth import make_trace

    from uvmlab.trace.schema import write_trace

    path = write_trace(make_trace(n_iter=1), d / "tr")
    if how == "mixed":
        other = write_trace(make_trace(n_iter=2), d / "other")
        (path / "allocations.parquet").write_bytes((other / "allocations.parquet").read_bytes())
        return str(path)
    for name in ("allocations", "kernels", "accesses") if how == "empty" else ("allocations", "kernels"):
        table = pq.read_table(path / f"{name}.parquet")
        if how == "empty":
            table = table.slice(0, 0)
        elif how == "nan" and name == "allocations":
            sizes = pa.array([None, *table["size_bytes"].to_pylist()[1:]], pa.int64())
            table = table.set_column(table.schema.get_field_index("size_bytes"), "size_bytes", sizes)
        elif how == "dup-kernels" and name == "kernels":
            table = pa.concat_tables([table, table.slice(0, 1)])
        pq.write_table(table, path / f"{name}.parquet")
    return str(path)


def fake_sweep(d: Path) -> str:
    """A complete two-run sweep folder, written in-process by the sweep tests' stand-in for uvmlab.run."""
    import sweep_fake_run

    from uvmlab.sweep.aggregate import write_results
    from uvmlab.sweep.runner import prepare
    from uvmlab.sweep.spec import parse_spec

    out = d / "sw"
    for entry in prepare(
        parse_spec("defaults: {mode: sim, iterations: 1}\ngrid: {workload: [gpt2], oversub: [1.0, 2]}\n"), out
    ):
        sweep_fake_run.run(entry.config, out=entry.path, force=True)
    write_results(out)
    return str(out)


def linked_report(d: Path) -> str:
    """A sweep whose report/ folder is a symbolic link to the user's own folder (issue 29: written through)."""
    sweep = Path(fake_sweep(d))
    (d / "my_report").mkdir()
    (d / "my_report" / "report.html").write_text("<p>my own report</p>\n")
    (sweep / "report").symlink_to(d / "my_report", target_is_directory=True)
    return str(sweep)


def users_paper(d: Path) -> str:
    """The user's paper folder, with their own figures/fig3_slowdown.png (issue 29: replaced by --force)."""
    (d / "paper" / "figures").mkdir(parents=True)
    (d / "paper" / "figures" / "fig3_slowdown.png").write_bytes(b"\x89PNG my own figure")
    return str(d / "paper")


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


MEMO_PICKLE = b"\x80\x04]r\x00\x46\xc3\x23."
"""Issue 29: 9 bytes; LONG_BINPUT names memo slot 600,000,000, and the C unpickler grows its memo to twice that."""
LAUGHS = "".join(
    f"{k}: &{k} [{', '.join(['lol'] * 9) if k == 'a' else ', '.join(['*' + chr(ord(k) - 1)] * 9)}]\n"
    for k in "abcdefghi"
)
"""A YAML "billion laughs": nine levels of nine aliases (9**9 strings once expanded) in a few hundred bytes."""


def laughs_in(d: Path, where: str) -> str:
    """A sweep spec whose ``where`` holds the laughs (under defaults' options, or as a grid axis)."""
    body = "\n".join("  " + line for line in LAUGHS.splitlines())
    if where == "options":
        text = f"defaults:\n  options:\n{body}\ngrid: {{workload: [alexnet]}}\n"
    else:
        text = f"grid:\n  workload: [alexnet]\n  option.x: &top\n    - 1\n  option.y:\n{body}\n  option.z: *i\n"
    return yaml_file(d, text)


def many_configs(d: Path) -> str:
    """A few hundred bytes that expand to 2.88 million configurations (issue 29)."""
    axes = "".join(f"  sim.k{i}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" for i in range(3))
    head = "grid:\n  workload: [alexnet, gpt2, bert]\n  oversub: [1, 2, 3, 4, 5, 6, 7, 8]\n  pca: [on, off]\n"
    return yaml_file(
        d, head + "  batch_size: [1, 2, 4, 8, 16, 32]\n  iterations: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + axes
    )


def huge_spec(d: Path) -> str:
    """A 16 MB spec (issue 29: still parsing after 300 s)."""
    entry = "  - {workload: alexnet, oversub: 2, batch_size: 4}\n"
    (d / "big.yaml").write_text("include:\n" + entry * (16_000_000 // len(entry)))
    return str(d / "big.yaml")


def memo_pickle(d: Path, name: str = "m.pickle") -> str:
    (d / name).write_bytes(MEMO_PICKLE)
    return str(d / name)


def memo_folder(d: Path) -> str:
    (d / "snaps").mkdir()
    memo_pickle(d / "snaps")
    return str(d / "snaps")


def urandom_link(d: Path) -> str:
    (d / "u.pickle").symlink_to("/dev/urandom")
    return str(d / "u.pickle")


def deep_csv(d: Path) -> str:
    import csv

    with open(d / "gt.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "source", "config", "gpu_memory", "measured_peak_bytes", "oom"])
        w.writerow(["r1", "alexnet", '{"x": ' + "[" * 20000 + "]" * 20000 + "}", "80GiB", "1000000", "0"])
    return str(d / "gt.csv")


MEMORY_CASES = [  # (case, the words that prove the limit refused it, not a MemoryError caught by chance)
    (Case("snapshot-show-memo-index-9-bytes", lambda d, o: ["snapshot", "show", memo_pickle(d)]), "memo slot"),
    (Case("replay-memo-index-9-bytes", lambda d, o: ["replay", memo_pickle(d)]), "memo slot"),
    (Case("fragmentation-memo-index-9-bytes", lambda d, o: ["fragmentation", memo_pickle(d)]), "memo slot"),
    (Case("evaluate-memo-index-9-bytes", lambda d, o: ["evaluate", memo_folder(d)]), "memo slot"),
    (Case("snapshot-show-link-to-dev-urandom", lambda d, o: ["snapshot", "show", urandom_link(d)]), "regular file"),
    (Case("sweep-yaml-laughs-in-options", lambda d, o: ["sweep", laughs_in(d, "options"), "-o", str(o)]), "nodes"),
    (Case("sweep-yaml-laughs-in-the-grid", lambda d, o: ["sweep", laughs_in(d, "grid"), "-o", str(o)]), "nodes"),
    (
        Case("sweep-yaml-nested-deep", lambda d, o: ["sweep", yaml_file(d, "grid: " + "[" * 5000), "-o", str(o)]),
        "nests",
    ),
    (
        Case("sweep-yaml-alias-in-itself", lambda d, o: ["sweep", yaml_file(d, "grid: &a [*a]\n"), "-o", str(o)]),
        "alias",
    ),
    (
        Case("sweep-2.88M-configurations", lambda d, o: ["sweep", many_configs(d), "-o", str(o), "--dry-run"]),
        "2,880,000 configurations",
    ),
    (Case("sweep-16MB-spec", lambda d, o: ["sweep", huge_spec(d), "-o", str(o), "--dry-run"]), "bytes"),
    (Case("nsys-summarize-text-in-a-number-column", lambda d, o: ["nsys", "summarize", text_in_numbers(d)]), "damaged"),
    (Case("evaluate-csv-config-deep-json", lambda d, o: ["evaluate", deep_csv(d)]), "nests deeper"),
    (Case("run-option-deep-json", lambda d, o: [*RUN, "--option", f"x={DEEP_JSON}", "-o", str(o)]), "nests deeper"),
    (Case("trace-show-duplicated-rows", lambda d, o: ["trace", "show", damaged_trace(d, "dup-kernels")]), "duplicated"),
]
MEMORY_LIMIT = 1 << 30
"""1 GiB of address space for every probe of an untrusted format (pickle, YAML, SQLite, CSV, JSON, trace folder)."""


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, object], bool]]:
    """Every MEMORY_CASES probe, run in ONE process under the memory limit: {name: (result, inputs unchanged)}."""
    root = tmp_path_factory.mktemp("memory")
    runs, before = [], {}
    for case, _ in MEMORY_CASES:
        inputs = root / case.name / "in"
        inputs.mkdir(parents=True)
        argv = case.argv(inputs, root / case.name / "out")
        before[case.name] = tree_hashes(inputs)
        runs.append([case.name, argv, str(inputs)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "badinput_memory.py"), str(MEMORY_LIMIT)],
        input=json.dumps(runs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    return {n: (results[n], tree_hashes(root / n / "in") == before[n]) for n in results}


@pytest.mark.parametrize("case,words", MEMORY_CASES, ids=[c.name for c, _ in MEMORY_CASES])
def test_untrusted_formats_stay_below_the_memory_limit(
    case: Case, words: str, memory_results: dict[str, tuple[dict[str, object], bool]]
) -> None:
    """Issue 29: each probe is refused by its limit (one sentence, exit 2) inside 1 GiB, and loses nothing."""
    result, unchanged = memory_results[case.name]
    err = str(result["stderr"])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert result["code"] == 2, (result["code"], err[-500:])
    assert len(lines) == 1 and lines[0].startswith("uvmlab: error: ") and len(lines[0]) < 400, err[-500:]
    assert words in lines[0], lines[0]
    assert unchanged, "an input was changed"


def test_corpus_is_large_enough() -> None:
    assert len(CASES) + len(MEMORY_CASES) >= 97  # 64 before issue 29
    names = [c.name for c in CASES] + [c.name for c, _ in MEMORY_CASES]
    assert len(set(names)) == len(names)


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
