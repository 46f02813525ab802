"""Issue 42, section 1 (data loss), over every command and every path option, enumerated from the click tree.

- Every option or argument that names a path declares its role (uvmlab.cli.options.PathParam), and every command
  checks its paths together before it starts: a new path option cannot escape the checks below.
- Outputs against inputs and against each other (links resolved): for every command, every output option is made
  the same path as each input (directly and through a link), a folder holding it, a path inside an input folder,
  and the same path as (or a path inside) each other output. Each case is refused: exit 2, one line, nothing
  around it changed.
- Crafted manifests: for every command that writes an owned folder, a folder whose ``.uvmlab-files.json`` lists a
  path outside it (relative ``..``, absolute, ``tables/../..``), a link to a file outside, or a user's file inside
  it under a name uvmlab never writes there; with ``--force`` on a complete folder and without it on an
  incomplete one. Nothing outside the folder, and no user file in it, is removed: exit 2, one line.

Every case runs under RLIMIT_AS = 1 GiB and a 60 s limit (tests/hostile.py). On main (before issue 42) the
checks fail: an output folder holding an input was accepted (``run wl.py -o .``), two outputs could be one file,
and crafted manifests removed files outside the folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from hostile import Outcome, Probe, assert_all, assert_refused, run_probes

from uvmlab.cli import cli, main
from uvmlab.cli.options import PathParam

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "docs" / "examples" / "tiny_mlp.py"
NOT_PATHS = {
    "alloc_conf", "budget", "checkpoint", "factors", "footprint", "gpu", "gpu_memory", "gpu_name", "gpu_sets",
    "iteration_pattern", "lora_targets", "margin", "only", "options", "overrides", "oversub", "partition", "pca",
    "policies", "policy", "shard_options", "sim_options", "what", "workloads",
}  # fmt: skip
"""String parameters that are not paths (workload options, GPU names, sizes, patterns, policy names)."""


def commands(group: click.Group = cli, prefix: str = "") -> list[tuple[str, click.Command]]:
    """(``"nsys import"``, command) for every command that runs."""
    out: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        out += commands(command, path + " ") if isinstance(command, click.Group) else [(path, command)]
    return out


def path_params(command: click.Command) -> list[tuple[click.Parameter, PathParam]]:
    return [(p, p.type) for p in command.params if isinstance(p.type, PathParam)]


def test_every_path_parameter_declares_its_role() -> None:
    """A parameter of a path type, or a string not known to be something else, must say what it is to its command;
    and every command runs the one path check before it starts."""
    roles = {"input": 0, "output": 0, "inout": 0}
    for path, command in commands():
        assert getattr(command.callback, "paths_checked", False), f"{path} does not check its paths"
        for param in command.params:
            if isinstance(param.type, PathParam):
                roles[param.type.role] += 1
                continue
            where = f"{path} {param.opts[0] if param.opts else param.name}"
            assert not isinstance(param.type, click.Path | click.File), f"{where}: a path without a role (PathParam)"
            if type(param.type) is click.types.StringParamType:
                assert param.name in NOT_PATHS, f"{where}: a string: give it a PathParam, or add it to NOT_PATHS"
    assert roles["input"] >= 25 and roles["output"] >= 18, roles


# -- outputs against inputs and each other ----------------------------------------------------------------------


@dataclass
class Case:
    name: str
    values: dict[str, str]  # parameter name -> value
    build: Callable[[Path], None] = field(default=lambda d: None)


def _value_for(param: click.Parameter, kind: PathParam, d: Path) -> str:
    """A fresh value for a parameter: an input fixture (created) or an output path (not created)."""
    name = param.name or "p"
    if kind.role == "output":
        return str(d / (f"out-{name}" + ("" if kind.folder else ".out")))
    if kind.folder or kind.reads:
        folder = d / f"in-{name}"
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        (folder / "data.txt").write_text("input\n")
        return str(folder)
    file = d / f"in-{name}.py"
    file.write_text("x = 1\n")
    return str(file) + (":2" if kind.path_of is not None else "")


def _argv(command: click.Command, path: str, values: dict[str, str]) -> list[str]:
    argv = path.split()
    for param in command.params:
        if param.name not in values:
            continue
        value = values[param.name]
        if isinstance(param, click.Argument):
            argv.append(value)
        else:
            argv += [param.opts[0], value]
    return argv


def _input_path(kind: PathParam, value: str) -> str:
    return value.split(":")[0] if kind.path_of is not None else value


def conflict_cases() -> list[tuple[str, click.Command, str, Callable[[Path], dict[str, str]]]]:
    """(case id, command, command path, builder of the parameter values in a folder) for every conflict."""
    cases = []
    for path, command in commands():
        params = path_params(command)
        outs = [(p, k) for p, k in params if k.role == "output"]
        ins = [(p, k) for p, k in params if k.role in ("input", "inout")]
        for o, ok in outs:
            for i, ik in ins:
                file_in = not (ik.folder or ik.reads)
                kinds = ["holds"] if ok.folder else []
                kinds += ["same", "link"] if file_in and not ok.folder else []
                kinds += ["inside"] if not file_in else []
                for how in kinds:
                    name = f"{path}:{o.opts[0]}-{how}-{i.name}"
                    cases.append((name, command, path, _conflict(params, o, i, ik, how)))
            for o2, ok2 in outs:
                if o2 is o:
                    continue
                if o.name < (o2.name or ""):
                    cases.append((f"{path}:{o.opts[0]}-same-{o2.opts[0]}", command, path, _two(params, o, o2, False)))
                if ok2.folder:
                    cases.append((f"{path}:{o.opts[0]}-in-{o2.opts[0]}", command, path, _two(params, o, o2, True)))
    return cases


def _fill(params: list[tuple[click.Parameter, PathParam]], d: Path) -> dict[str, str]:
    return {p.name or "": _value_for(p, k, d) for p, k in params}


def _conflict(params, o, i, ik, how):  # type: ignore[no-untyped-def]
    def build(d: Path) -> dict[str, str]:
        values = _fill(params, d)
        src = _input_path(ik, values[i.name])
        if how == "same":
            values[o.name] = src
        elif how == "link":
            (d / "link.out").symlink_to(src)
            values[o.name] = str(d / "link.out")
        elif how == "holds":
            box = d / "box"
            box.mkdir()
            moved = box / Path(src).name
            os.replace(src, moved)
            values[i.name] = values[i.name].replace(src, str(moved))
            values[o.name] = str(d / "box-link")
            (d / "box-link").symlink_to(box, target_is_directory=True)  # the folder through a link
        else:  # inside an input folder (the part of it the command reads)
            inner = Path(src) / ("runs" if ik.reads else "")
            values[o.name] = str(inner / "sub" / "x.out")
        return values

    return build


def _two(params, o, o2, inside):  # type: ignore[no-untyped-def]
    def build(d: Path) -> dict[str, str]:
        values = _fill(params, d)
        values[o.name] = str(Path(values[o2.name]) / "result.json") if inside else values[o2.name]
        return values

    return build


CONFLICTS = conflict_cases()


def conflict_outcomes(root: Path) -> dict[str, Outcome]:
    probes = []
    for i, (name, command, path, build) in enumerate(CONFLICTS):
        d = root / f"c{i}"
        d.mkdir()
        argv = _argv(command, path, build(d))
        probes.append(Probe(name, argv, cwd=d, root=d))
    return run_probes(probes)


def test_the_conflict_matrix_covers_every_command_with_an_output() -> None:
    with_outputs = {p for p, c in commands() if any(k.role == "output" for _, k in path_params(c))}
    covered = {name.split(":")[0] for name, *_ in CONFLICTS}
    no_inputs = {p for p, c in commands() if not any(k.role != "output" for _, k in path_params(c))}
    assert with_outputs - no_inputs <= covered, with_outputs - no_inputs - covered
    assert len(CONFLICTS) >= 50, len(CONFLICTS)


CONFLICT_WORDS = ("is also an input", "holds the input", "inside the input folder", "name the same path",
                  "inside the output folder")  # fmt: skip
"""The path check's sentences: a conflict must be refused BY the check (not by a later, unrelated error)."""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one probe per case, each under 60 s; together a few minutes on 2 busy cores
def test_an_output_never_meets_an_input_or_another_output(tmp_path: Path) -> None:
    """Every case of the matrix (CONFLICTS), each under the limits, refused by the path check's own sentence."""
    outcomes = conflict_outcomes(tmp_path)

    def check(outcome: Outcome) -> None:
        line = assert_refused(outcome)
        assert any(w in line for w in CONFLICT_WORDS), line

    assert_all({name: (lambda o=outcome: check(o)) for name, outcome in outcomes.items()})


def test_run_into_the_folder_of_its_workload_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's own cases, by name: ``run wl.py -o .`` and ``nsys import D/x.sqlite -o D``."""
    (tmp_path / "wl.py").write_text(TINY.read_text())
    monkeypatch.chdir(tmp_path)  # restored after the test: later tests on this worker keep their own folder
    assert main(["run", "wl.py", "-n", "1", "--mode", "sim", "-o", "."]) == 2
    assert "holds the input wl.py" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wl.py"]


# -- crafted manifests ----------------------------------------------------------------------------------------------

KINDS = {
    "run": ("result.json", "env.json"),
    "trace": ("trace.json", "kernels.parquet"),
    "comparison": ("comparison.json", "tables/t.parquet"),
    "report figures": (None, "fig3_slowdown.png"),
    "sweep": (None, "results.parquet"),
}
"""Per folder kind: its completeness file, and a name uvmlab writes there (for a planted link)."""
OWNED_OUTPUTS = {
    "run": "run", "estimate": "run", "nsys import": "run", "evaluate": "run", "fragmentation": "run",
    "colocate": "run", "validate": "run", "trace capture": "trace", "compare": "comparison",
    "report": "report figures", "sweep run": "sweep",
}  # fmt: skip
"""The commands that write an owned folder, and its kind."""
NOT_OWNED = {
    "shim build": "the shim's build cache: files by fixed names, written only after a build; never removes",
    "collect": "GPU only: refused before anything is written on a machine without a GPU (tested below)",
    "advise": "-o is the folder of --confirm-on-gpu's run directories (GPU only); each one is a run directory",
}
"""Commands with an output folder that is not an owned folder of theirs, and why."""


def test_every_output_folder_is_owned_or_says_why_not() -> None:
    folders = {
        p for p, c in commands() if any(k.role == "output" and (k.folder or k.beside) for _, k in path_params(c))
    }
    assert folders == set(OWNED_OUTPUTS) | set(NOT_OWNED), folders ^ (set(OWNED_OUTPUTS) | set(NOT_OWNED))


def _base(command: str, d: Path, out: Path) -> list[str]:
    """A command line that reaches the preparation of its output folder ``out``."""
    import hostile_files as H

    if command == "run":
        return ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim", "-o", str(out)]
    if command == "estimate":
        return ["estimate", "alexnet", "-b", "2", "-n", "1", "-o", str(out)]
    if command == "nsys import":
        return ["nsys", "import", str(H.export(d)), "-o", str(out)]
    if command == "evaluate":
        (d / "gt.csv").write_text("id,source,config,gpu_memory,measured_peak_bytes,oom\nr1,alexnet,,80GiB,1000000,0\n")
        return ["evaluate", str(d / "gt.csv"), "-o", str(out)]
    if command == "fragmentation":
        return ["fragmentation", "alexnet", "-b", "2", "-n", "1", "-o", str(out)]
    if command == "colocate":
        return ["colocate", "alexnet:2", "-n", "1", "-o", str(out)]
    if command == "validate":
        (d / "data" / "uvm" / "uvm-eval_titanv_460.27.04").mkdir(parents=True)
        return ["validate", str(d / "data"), "--check", "titanv-abc", "-o", str(out)]
    if command == "trace capture":
        return ["trace", str(TINY), "-n", "1", "-o", str(out)]
    if command == "compare":
        from test_badinput_cli import fake_run

        return ["compare", fake_run(d, "A"), fake_run(d, "B"), "-o", str(out)]
    if command == "report":
        from test_badinput_cli import fake_sweep

        return ["report", fake_sweep(d), "-o", str(out / "report.html")]
    if command == "sweep run":
        (d / "spec.yaml").write_text("grid: {workload: [alexnet], oversub: [1, 2]}\n")
        return ["sweep", "run", str(d / "spec.yaml"), "-o", str(out)]
    raise AssertionError(f"no base command line for {command}")


VARIANTS = ("parent", "absolute", "dotdot", "link", "foreign-name")


def _craft(folder: Path, kind: str, variant: str, victim: Path, complete: bool) -> None:
    """An owned folder of ``kind`` whose manifest lists one crafted entry (``variant``)."""
    done, linkable = KINDS[kind]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".uvmlab-run").write_text(json.dumps({"uvmlab": "0", "kind": kind}))
    (folder / "notes.txt").write_text("the user's own notes\n")
    entry = {
        "parent": "../" + victim.name,
        "absolute": str(victim),
        "dotdot": "tables/../../" + victim.name,
        "link": linkable,
        "foreign-name": "notes.txt",
    }[variant]
    if variant == "link":
        (folder / linkable).parent.mkdir(parents=True, exist_ok=True)
        (folder / linkable).symlink_to(victim)
    if done is not None and complete:
        (folder / done).write_text("{}\n")
    (folder / ".uvmlab-files.json").write_text(json.dumps({"files": [entry] + ([done] if done and complete else [])}))


def manifest_cases() -> list[tuple[str, str, str, bool]]:
    out = []
    for command, kind in sorted(OWNED_OUTPUTS.items()):
        states = [False] + ([True] if KINDS[kind][0] is not None else [])
        for variant in VARIANTS:
            for complete in states:
                state = "complete" if complete else "incomplete"
                out.append((f"{command}-{variant}-{state}", command, variant, complete))
    return out


MANIFESTS = manifest_cases()


def manifest_outcomes(root: Path) -> dict[str, tuple[Outcome, Path]]:
    """{case: (outcome, the crafted folder)}; every case run under the limits."""
    probes, folders = [], {}
    for name, command, variant, complete in MANIFESTS:
        d = root / name
        d.mkdir()
        victim = d / "victim.txt"
        victim.write_text("precious\n")
        kind = OWNED_OUTPUTS[command]
        out = d / "out"
        argv = _base(command, d, out)
        folder = out / "figures" if kind == "report figures" else out
        if command == "sweep run" and variant != "parent":  # a run directory of the sweep, crafted
            from uvmlab.sweep.runner import plan_entries
            from uvmlab.sweep.spec import load_spec

            folder = plan_entries(load_spec(d / "spec.yaml"), out)[0].path
            _craft(folder, "run", variant, victim, False)
        else:
            _craft(folder, kind, variant, victim, complete)
        if complete or kind == "report figures":
            argv.append("--force")
        probes.append(Probe(name, argv, cwd=d, root=d, outputs=(out,)))
        folders[name] = folder
    outcomes = run_probes(probes)
    return {name: (outcomes[name], folders[name]) for name in outcomes}


def test_the_manifest_matrix_covers_every_owned_folder() -> None:
    assert {m[1] for m in MANIFESTS} == set(OWNED_OUTPUTS)
    assert len(MANIFESTS) >= 80, len(MANIFESTS)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one probe per case, each under 60 s; together a few minutes on 2 busy cores
def test_a_crafted_manifest_removes_nothing_outside_what_uvmlab_wrote(tmp_path: Path) -> None:
    """Every case of the matrix (MANIFESTS), each under the limits: refused, nothing outside the folder changed (the
    victim is there, unchanged), and the user's file inside it kept."""

    def check(outcome: Outcome, folder: Path) -> None:
        assert_refused(outcome)
        assert (folder / "notes.txt").read_text() == "the user's own notes\n", "a user's file was removed"

    cases = manifest_outcomes(tmp_path)
    assert_all({name: (lambda o=outcome, f=folder: check(o, f)) for name, (outcome, folder) in cases.items()})


def test_collect_writes_nothing_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """collect's folder is not owned (NOT_OWNED): on a machine without a GPU it refuses before writing."""
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "meta.json").write_text("{}\n")
    before = sorted(p.name for p in (tmp_path / "kit").iterdir())
    code = main(["collect", "-o", str(tmp_path / "kit"), "--force"])
    assert code == 2, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "kit").iterdir()) == before


# -- files at uvmlab's names that uvmlab did not write ------------------------------------------------------------

RUN = ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim"]


def test_force_never_overwrites_a_users_file_at_an_uvmlab_name(tmp_path: Path) -> None:
    """``--force --figure-format svg`` would have written figures/memory_per_kernel.svg over the user's."""
    out = tmp_path / "R"
    assert main([*RUN, "-o", str(out)]) == 0
    mine = out / "figures" / "memory_per_kernel.svg"
    mine.write_text("<svg>my own figure</svg>")
    assert main([*RUN, "-o", str(out), "--force", "--figure-format", "svg"]) == 2
    assert mine.read_text() == "<svg>my own figure</svg>"
    assert not (out / "result.json").exists()  # the new run did not complete over it


def test_an_incomplete_run_never_overwrites_the_users_tables(tmp_path: Path) -> None:
    out = tmp_path / "R"
    assert main([*RUN, "-o", str(out)]) == 0
    (out / "result.json").unlink()  # as if the writer had been killed
    for rel in ("tables/iterations.parquet", "figures/faults_migrations.png"):
        (out / rel).write_bytes(b"the user's own " + rel.encode())
    assert main([*RUN, "-o", str(out)]) == 2
    for rel in ("tables/iterations.parquet", "figures/faults_migrations.png"):
        assert (out / rel).read_bytes() == b"the user's own " + rel.encode()


def test_force_keeps_a_listed_file_the_user_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "R"
    assert main([*RUN, "-o", str(out)]) == 0
    (out / "result.json").write_text('{"my": "edit"}\n')
    capsys.readouterr()
    assert main([*RUN, "-o", str(out), "--force"]) == 2
    assert "was changed after uvmlab wrote it" in capsys.readouterr().err
    assert json.loads((out / "result.json").read_text()) == {"my": "edit"}


def test_the_manifest_records_what_was_written(tmp_path: Path) -> None:
    out = tmp_path / "R"
    assert main([*RUN, "-o", str(out)]) == 0
    files = json.loads((out / ".uvmlab-files.json").read_text())["files"]
    import hashlib

    for rel, writes in files.items():
        if rel.startswith("logs/"):
            continue
        data = (out / rel).read_bytes()
        assert writes[-1] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, rel


# -- sweeps: one spec per folder, resumable after a kill while preparing ------------------------------------------

SPEC_A = "defaults: {mode: sim, iterations: 1}\ngrid: {workload: [gpt2], oversub: [1.0, 2]}\n"
SPEC_B = "defaults: {mode: sim, iterations: 1}\ngrid: {workload: [gpt2], oversub: [3, 4]}\n"


def test_a_second_spec_into_one_sweep_folder_is_refused(
    tmp_path: Path, fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(SPEC_A)
    (tmp_path / "b.yaml").write_text(SPEC_B)
    out = tmp_path / "S"
    assert main(["sweep", str(tmp_path / "a.yaml"), "-o", str(out)]) == 0
    before = {p: p.read_bytes() for p in (out / "spec.yaml", out / "sweep.json", out / "results.parquet")}
    capsys.readouterr()
    assert main(["sweep", str(tmp_path / "b.yaml"), "-o", str(out)]) == 2
    assert "holds the sweep of another spec" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    assert len(list((out / "runs").iterdir())) == 2


def _prepare_and_die(spec: Path, out: Path, after: int) -> None:
    """In a forked child: run the sweep's preparation and die (os._exit) after ``after`` run configs."""
    from uvmlab.files.rundir import RunDir
    from uvmlab.sweep import runner
    from uvmlab.sweep.spec import load_spec

    written = {"n": 0}
    original = RunDir.write_json

    def dying(self: RunDir, which: Path, obj: object) -> None:
        original(self, which, obj)
        written["n"] += 1
        if written["n"] >= after:
            os._exit(9)

    RunDir.write_json = dying  # type: ignore[method-assign]
    runner.prepare(load_spec(spec), out)
    os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("after", [1, 3])
def test_a_sweep_killed_while_preparing_resumes_with_the_same_command(
    tmp_path: Path, fake_env: dict[str, str], after: int
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("defaults: {mode: sim, iterations: 1}\ngrid: {workload: [gpt2], oversub: [1.0, 2, 3, 4]}\n")
    out = tmp_path / "S"
    pid = os.fork()
    if pid == 0:
        _prepare_and_die(spec, out, after)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert (out / "spec.yaml").exists()
    assert main(["sweep", str(spec), "-o", str(out)]) == 0
    assert len(list((out / "runs").iterdir())) == 4


def test_a_sweep_killed_by_an_older_uvmlab_while_preparing_resumes(tmp_path: Path, fake_env: dict[str, str]) -> None:
    """The state an uvmlab before issue 42 left (spec.yaml copied, no sweep.json, no marker) is resumed too."""
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC_A)
    out = tmp_path / "S"
    (out / "runs").mkdir(parents=True)
    (out / "spec.yaml").write_bytes(spec.read_bytes())
    assert main(["sweep", str(spec), "-o", str(out)]) == 0
