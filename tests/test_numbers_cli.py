"""Issue 42 section 3: every number a user gives, on the command line or in a file, is one short sentence and exit 2
when uvmlab cannot take it (uvmlab.numbers; docs/safety.md "Numbers").

The cases are built from the click tree (tests/hostile.py runs them under a 1 GiB address space and a 60 s limit,
and hashes their surroundings): every integer and real option of every command, every option that takes a number
as text (classified below: a new text option fails :func:`test_every_text_option_is_classified` until it is), every
KEY=VALUE JSON option, and every file that holds numbers (``--params``, ``--base``, ``--stack``, ``--memory``,
sweep specs, evaluate's CSV). The values: integers of 5,000 digits (Python's int-conversion limit raised a
traceback; click echoed them whole), beyond int64, ``inf`` / ``nan`` / ``Infinity`` / ``1e400`` / ``1e308``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import click
import pytest

from tests.hostile import Probe, assert_refused, run_probes, tree_hashes
from uvmlab.cli import cli
from uvmlab.sim.uvm.timing import CostParams

BIG = "9" * 5000
"""An integer of 5,000 digits (over Python's 4,300-digit conversion limit)."""
OVER_INT64 = "9" * 30
REQUIRED = "required-out"
"""The value given to a required option (an output path): a probe may create it."""
SHOWN = BIG[:100]
"""No sentence may quote this much of the value."""


def _commands(cmd: click.Command = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def _placeholders(cmd: click.Command) -> list[str]:
    """A placeholder for each argument and required option (``-o REQUIRED``: a probe may create ``REQUIRED``)."""
    args = ["x" for p in cmd.params if isinstance(p, click.Argument)]
    return args + [a for p in cmd.params if isinstance(p, click.Option) and p.required for a in (p.opts[0], REQUIRED)]


def _numeric_options() -> list[tuple[tuple[str, ...], click.Command, click.Option]]:
    return [
        (path, cmd, p)
        for path, cmd in _commands()
        for p in cmd.params
        if isinstance(p, click.Option) and isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)
    ]


def _flag(p: click.Option) -> str:
    return max(p.opts, key=len)


# -- 1. every integer and real option of every command ------------------------------------------------------------
def _typed_cases(tmp: Path) -> list[tuple[Probe, list[str]]]:
    cases = []
    for path, cmd, p in _numeric_options():
        is_int = isinstance(p.type, click.types.IntParamType)
        values = [BIG] if is_int else [BIG, "nan", "inf"]  # int64's bounds: tests/test_numbers_unit.py
        for v in values:
            name = f"{' '.join(path)} {_flag(p)}={v[:12]}"
            argv = [*path, *_placeholders(cmd), _flag(p), v]
            cases.append((Probe(name, argv, cwd=tmp, root=tmp, outputs=(tmp / REQUIRED,)), [f"'{_flag(p)}'"]))
    return cases


def test_the_click_tree_has_numeric_options() -> None:
    """The walk finds what it should (so the probes below are not vacuous)."""
    found = {(" ".join(path), _flag(p)) for path, _, p in _numeric_options()}
    for want in [("run", "--iterations"), ("run", "--batch-size"), ("run", "--seq-len"), ("sweep run", "--jobs"),
                 ("fragmentation", "--device"), ("estimate", "--margin-mb"), ("evaluate", "--max-warm")]:  # fmt: skip
        assert want in found
    assert len(found) >= 40


# -- 2. options that take a number as text ----------------------------------------------------------------------
NUMERIC_TEXT = {
    ("run", "--oversub"): ["run", "gpt2", "--oversub"],
    ("advise", "--oversub"): ["advise", "gpt2", "--oversub"],
    ("run", "--gpu-memory"): ["run", "gpt2", "--gpu-memory"],
    ("advise", "--gpu-memory"): ["advise", "gpt2", "--gpu-memory"],
    ("estimate", "--gpu-memory"): ["estimate", "gpt2", "--gpu-memory"],
    ("colocate", "--gpu-memory"): ["colocate", "gpt2:8", "--gpu-memory"],
    ("evaluate", "--gpu-memory"): ["evaluate", "x", "--gpu-memory"],
    ("colocate", "--margin"): ["colocate", "gpt2:8", "--margin"],
    ("run", "--footprint"): ["run", "gpt2", "--mode", "gpu", "--dry-run", "--footprint"],
    ("collect", "--factors"): ["collect", "--dry-run", "-o", "collected", "--factors"],
    ("collect", "--budget"): ["collect", "--dry-run", "-o", "collected", "--budget"],
}
"""Text options whose value is (or holds) a number: (command, option) -> the command line before the value."""
TEXT_WITH_NUMBERS = {
    ("run", "--gpu"): (["run", "gpt2", "--gpu"], "A100-80GB@{}"),
    ("run", "--gpu-set"): (["run", "gpt2", "--gpu-set"], "sm_count={}"),
    ("advise", "--gpu"): (["advise", "gpt2", "--gpu"], "A100-80GB@{}"),
    ("collect", "--workload"): (["collect", "--dry-run", "--workload"], "gpt2@{}"),
    ("estimate", "--alloc-conf"): (["estimate", "gpt2", "--alloc-conf"], "max_split_size_mb:{}"),
    ("run", "--alloc-conf"): (["run", "gpt2", "--mode", "gpu", "--dry-run", "--alloc-conf"], "max_split_size_mb:{}"),
    ("replay", "--alloc-conf"): (["replay", "x.pickle", "--alloc-conf"], "max_split_size_mb:{}"),
}
"""Text options of which a number is a part: the number goes where ``{}`` is."""
JSON_OPTIONS = {"--option": "n_layer", "--sim-option": "prefetch_threshold", "--shard-option": "bucket_cap_mb"}
"""KEY=VALUE options whose values are JSON (tested in section 3), with a key every command knows."""
NOT_NUMERIC = {
    "--pca", "--policy", "-o", "--checkpoint", "--what", "--gpu", "--snapshot", "--timeline", "--params", "--table",
    "--iteration-pattern", "--partition", "--check", "--lora-targets",
}  # fmt: skip
"""Text options that take no number (names, paths, patterns, on/off): a bad value is the command's own sentence."""


def _text_options() -> set[tuple[str, str]]:
    return {
        (" ".join(path), p.opts[0])
        for path, cmd in _commands()
        for p in cmd.params
        if isinstance(p, click.Option) and p.type is click.STRING and not p.is_flag
    }


def test_every_text_option_is_classified() -> None:
    """A new text option must say here whether it takes a number (and then get the probes below)."""
    classified = set(NUMERIC_TEXT) | set(TEXT_WITH_NUMBERS)
    unclassified = sorted(
        (c, o)
        for c, o in _text_options()
        if (c, o) not in classified and o not in JSON_OPTIONS and o not in NOT_NUMERIC
    )
    assert not unclassified, (
        f"classify these text options in NUMERIC_TEXT / TEXT_WITH_NUMBERS / NOT_NUMERIC: {unclassified}"
    )
    assert classified <= _text_options() | {(c, o) for c, o in classified if o == "--gpu"}


def _text_cases(tmp: Path) -> list[tuple[Probe, list[str]]]:
    cases = []
    for (command, option), argv in NUMERIC_TEXT.items():
        for v in (BIG, "inf", "nan"):
            cases.append((Probe(f"{command} {option}={v[:8]}", [*argv, v], cwd=tmp, root=tmp), []))
    for (command, option), (argv, pattern) in TEXT_WITH_NUMBERS.items():
        for v in (BIG, "inf", "nan"):
            cases.append((Probe(f"{command} {option}~{v[:8]}", [*argv, pattern.format(v)], cwd=tmp, root=tmp), []))
    return cases


# -- 3. KEY=VALUE JSON options and colocate's job specs ---------------------------------------------------------
def _json_cases(tmp: Path) -> list[tuple[Probe, list[str]]]:
    cases = []
    for path, cmd in _commands():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.opts[0] not in JSON_OPTIONS:
                continue
            key = JSON_OPTIONS[p.opts[0]]
            head = [
                *path,
                *(["gpt2:8"] if path == ("colocate",) else [a if a != "x" else "gpt2" for a in _placeholders(cmd)]),
            ]
            for v in (BIG, "-" + OVER_INT64, "Infinity", "NaN", "1e400"):
                name = f"{' '.join(path)} {p.opts[0]} {key}={v[:10]}"
                argv = [*head, p.opts[0], f"{key}={v}"]
                cases.append((Probe(name, argv, cwd=tmp, root=tmp, outputs=(tmp / REQUIRED,)), [key]))
    for job in (f"gpt2:{BIG}", f"gpt2:8,n_layer={BIG}", "gpt2:8,n_layer=Infinity", "gpt2:8,n_layer=NaN"):
        cases.append((Probe(f"colocate job {job[:20]}", ["colocate", job], cwd=tmp, root=tmp), []))
    return cases


def test_json_options_found() -> None:
    found = {(" ".join(path), p.opts[0]) for path, cmd in _commands() for p in cmd.params if p.opts[0] in JSON_OPTIONS}
    assert {("run", "--option"), ("run", "--sim-option"), ("estimate", "--option"), ("colocate", "--option")} <= found


# -- 4. numbers in files ------------------------------------------------------------------------------------------
COSTS = [f.name for f in fields(CostParams)]


def _params_files(d: Path) -> dict[str, Path]:
    """Cost parameter files a user could hand over: each holds numbers no run can use."""
    raw = {
        "bigint": '{"schema_version": 1, "params": {"batch_turnaround_ns": ' + BIG + "}}",
        "e308": '{"schema_version": 1, "params": {"batch_turnaround_ns": 1e308}}',
        "e400": '{"schema_version": 1, "params": {"block_service_ns": 1e400}}',
        "infinity": '{"schema_version": 1, "params": {"fault_entry_ns": Infinity}}',
        "nan": '{"schema_version": 1, "params": {"link_bytes_per_s": NaN}}',
        "negative": '{"schema_version": 1, "params": {"evict_fixed_ns": -1}}',
        "zeros": json.dumps({"schema_version": 1, "params": dict.fromkeys(COSTS, 0)}),
        "zero-link": '{"schema_version": 1, "params": {"link_bytes_per_s": 0}}',
        "fast-link": '{"schema_version": 1, "params": {"link_bytes_per_s": 656249e9}}',
        "efficiency": '{"schema_version": 1, "params": {"compute_efficiency": 3.5}}',
        "schema-big": '{"schema_version": ' + BIG + ', "params": {}}',
    }
    out = {}
    for name, text in raw.items():
        p = d / f"{name}.json"
        p.write_text(text)
        out[name] = p
    return out


def _file_cases(tmp: Path) -> list[tuple[Probe, list[str]]]:
    d = tmp / "files"
    d.mkdir()
    cases: list[tuple[Probe, list[str]]] = []
    for name, p in _params_files(d).items():
        cases.append((Probe(f"run --params {name}", ["run", "gpt2", "--params", str(p)], cwd=tmp, root=tmp), []))
        out = tmp / f"base-{name}.json"
        argv = ["calibrate", str(tmp / "none.sqlite"), "--base", str(p), "-o", str(out)]
        cases.append((Probe(f"calibrate --base {name}", argv, cwd=tmp, root=tmp, outputs=(out,)), []))
        spec = d / f"spec-{name}.yaml"
        spec.write_text(f"version: 1\nname: t\ndefaults: {{workload: gpt2}}\ngrid:\n  params_file: [{p}]\n")
        sw = tmp / f"sweep-{name}"
        argv = ["sweep", "run", str(spec), "-o", str(sw), "--dry-run"]
        cases.append((Probe(f"sweep params_file {name}", argv, cwd=tmp, root=tmp, outputs=(sw,)), []))
    for name, value in {"bigint": BIG, "inf": ".inf", "nan": ".nan", "hexbig": "0x" + "f" * 5000}.items():
        for field in ("batch_size", "oversub", "sim.prefetch_threshold", "option.n_layer", "gpu_memory"):
            spec = d / f"spec-{name}-{field}.yaml"
            spec.write_text(f"version: 1\nname: t\ndefaults: {{workload: gpt2}}\ngrid:\n  {field}: [{value}]\n")
            sw = tmp / f"sw-{name}-{field}"
            argv = ["sweep", "run", str(spec), "-o", str(sw), "--dry-run"]
            cases.append((Probe(f"sweep {field}={name}", argv, cwd=tmp, root=tmp, outputs=(sw,)), []))
    for name, value in {"bigint": BIG, "infinity": "Infinity", "e308": "1e308", "nan": "NaN"}.items():
        p = d / f"stack-{name}.json"
        p.write_text(
            '{"schema": "uvmlab.memory.stack/1", "gpu": "A100-40GB", "module_loading": "lazy", '
            f'"fixed_bytes": {value}}}'
        )
        cases.append(
            (Probe(f"estimate --stack {name}", ["estimate", "gpt2", "--stack", str(p)], cwd=tmp, root=tmp), [])
        )
    for name, value in {"bigint": BIG, "inf": "inf", "nan": "nan", "e308": "1e308"}.items():
        p = d / f"memory-{name}.csv"
        p.write_text(f"workload,batch,measured_mib\ngpt2,8,{value}\n")
        out = tmp / f"stack-out-{name}.json"
        argv = ["calibrate", "--memory", str(p), "-o", str(out)]
        cases.append((Probe(f"calibrate --memory {name}", argv, cwd=tmp, root=tmp, outputs=(out,)), []))
    for name, (config, gpu) in {
        "config-bigint": (f'{{""n_layer"": {BIG}}}', "80GiB"),
        "config-infinity": ('{""n_layer"": Infinity}', "80GiB"),
        "gpu-bigint": ("{}", BIG),
        "gpu-inf": ("{}", "inf"),
    }.items():
        p = d / f"truth-{name}.csv"
        p.write_text(f'id,source,config,gpu_memory,measured_peak_bytes,oom\na,gpt2,"{config}",{gpu},1000,false\n')
        cases.append((Probe(f"evaluate {name}", ["evaluate", str(p)], cwd=tmp, root=tmp), []))
    return cases


# -- the run ----------------------------------------------------------------------------------------------------
def _all_cases(tmp: Path) -> list[tuple[Probe, list[str]]]:
    return [*_typed_cases(tmp), *_text_cases(tmp), *_json_cases(tmp), *_file_cases(tmp)]


def isolated(cases: list[tuple[Probe, list[str]]], tmp: Path) -> list[tuple[Probe, list[str]]]:
    """Each probe in a folder of its own (its cwd and its hashed surroundings), so that what one case leaves (a
    default ``runs/`` folder) is charged to that case only; the input files stay in ``tmp/files``."""
    out = []
    for i, (p, words) in enumerate(cases):
        d = tmp / "cases" / str(i)
        d.mkdir(parents=True)
        out.append((Probe(p.name, p.argv, cwd=d, root=d, outputs=(d / REQUIRED,)), words))
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, list[str]]]:
    tmp = tmp_path_factory.mktemp("numbers")
    cases = isolated(_all_cases(tmp), tmp)
    inputs = tree_hashes(tmp / "files")
    results = run_probes([p for p, _ in cases])
    assert tree_hashes(tmp / "files") == inputs  # no case changed an input file
    return {p.name: (results[p.name], words) for p, words in cases}


def test_every_case_is_one_short_sentence_and_exit_2(outcomes: dict[str, tuple[object, list[str]]]) -> None:
    """Each case: exit 2, one line of at most 500 characters that names the option where click reports it, no
    traceback, nothing outside its outputs changed (tests/hostile.py), and never the whole value."""
    failures = []
    for name, (outcome, words) in outcomes.items():
        try:
            line = assert_refused(outcome, words=words)  # type: ignore[arg-type]
            assert SHOWN not in line, f"{name}: quotes 100 digits of the value: {line[:200]}"
        except AssertionError as exc:
            failures.append(str(exc)[:400])
    assert not failures, f"{len(failures)} of {len(outcomes)} cases failed:\n" + "\n".join(failures[:40])


def test_case_count(outcomes: dict[str, tuple[object, list[str]]]) -> None:
    assert len(outcomes) >= 190
