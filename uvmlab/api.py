"""The public Python API: everything the CLI does, callable from Python.

Names resolve lazily (PEP 562), so ``import uvmlab.api`` is cheap and torch is imported only by the
functions that capture traces or run on a GPU. Example::

    from uvmlab import api
    from uvmlab.config import RunConfig, WorkloadConfig

    result = api.run(RunConfig(WorkloadConfig("gpt2"), oversub=4, pca=False, mode="sim"), out="runs/gpt2-x4")
    result = api.run("gpt2", oversub=4, pca="off", batch_size=8)  # the CLI's form: a name and its settings
    result.table("iterations")                     # a pandas DataFrame; result.tables: all of them
    est = api.estimate("resnet50", "A100-80GB")    # a workload name or WorkloadConfig, a GPU name or GpuSpec
    api.summarize("report.sqlite")                 # a path, or an export opened with api.open_export

Conventions every function here follows (the functions of the modules themselves stay strict):

- ``run`` takes a ``RunConfig``, or a workload (name, file or ``WorkloadConfig``) with the fields of
  ``RunConfig`` and ``WorkloadConfig`` as keywords (``oversub=4, pca="off", batch_size=8``), as ``uvmlab run`` does.
- Files and folders: a path (str or os.PathLike) or the opened object alike: an nsys export (``open_export``),
  a snapshot (``read_snapshot``), a trace (``read_trace``), a run (``RunResult`` / ``RunDir``), a sweep spec
  (``load_spec``); a GPU as its name or a ``GpuSpec``; a workload as its name or a ``WorkloadConfig``.
- Errors are uvmlab.errors exceptions; their messages name Python parameters (``force=True``), not CLI flags.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
from collections.abc import Callable
from typing import Any

_EXPORTS: dict[str, str] = {
    # configs and GPUs
    "WorkloadConfig": "uvmlab.config",
    "RunConfig": "uvmlab.config",
    "get_gpu": "uvmlab.gpus",
    "custom_gpu": "uvmlab.gpus",
    "read_gpu_file": "uvmlab.files.gpu_file",
    "RunDir": "uvmlab.files.rundir",
    # traces (capture needs torch)
    "capture_trace": "uvmlab.trace.capture",
    "get_trace": "uvmlab.trace.cache",
    "read_trace": "uvmlab.trace.schema",
    "write_trace": "uvmlab.trace.schema",
    "to_cuda": "uvmlab.trace.orchestrate",
    "read_snapshot": "uvmlab.trace.snapshot",
    "write_snapshot": "uvmlab.trace.snapshot",
    # allocator simulation and estimation
    "place": "uvmlab.sim.allocator.placement",
    "estimate": "uvmlab.memory.estimate",
    "replay_snapshot": "uvmlab.memory.replay",
    # UVM simulation and runs
    "simulate_run": "uvmlab.run",
    "footprint_bytes": "uvmlab.uvm.simulate",
    "run": "uvmlab.run",
    # measurement
    "open_export": "uvmlab.measure.nsys.read",
    "summarize": "uvmlab.measure.nsys.stats",
    "import_export": "uvmlab.measure.nsys.measured",
    "compare_runs": "uvmlab.measure.compare",
    "calibrate": "uvmlab.measure.calibrate",
    # sweeps and reports
    "load_spec": "uvmlab.sweep.spec",
    "run_sweep": "uvmlab.sweep.runner",
    "collect": "uvmlab.sweep.aggregate",
    "build_report": "uvmlab.report.build",
    # evaluation, fragmentation, collocation
    "evaluate": "uvmlab.evaluate.harness",
    "characterize_source": "uvmlab.evaluate.fragmentation",
    "colocate_workloads": "uvmlab.memory.colocate",
    # fidelity scorecard
    "validate": "uvmlab.validate.scorecard",
    # the evidence kit (uvmlab collect): records on a GPU what validate reads
    "CollectOptions": "uvmlab.measure.gpu.kit.plan",
    "collect_evidence": "uvmlab.measure.gpu.kit.runner",
}

__all__ = sorted(_EXPORTS)


# -- arguments: a path or the opened object alike ---------------------------------------------------------------
def _is_path(x: Any) -> bool:
    return isinstance(x, str | os.PathLike)


def _path_of(x: Any) -> Any:
    """The path behind an opened object (export, snapshot, run, run directory), or ``x`` itself."""
    value = getattr(x, "path", None)
    return value if _is_path(value) else x


def _gpu(x: Any) -> Any:
    """A GpuSpec of a listed GPU's name, a GPU file (``.json``), or the spec itself."""
    from uvmlab.files.gpu_file import resolve_gpu
    from uvmlab.gpus import get_gpu

    if not isinstance(x, str):
        return x
    base, spec = resolve_gpu(x)
    return get_gpu(base, spec=spec)


def _workload(x: Any) -> Any:
    from uvmlab.config import WorkloadConfig

    return WorkloadConfig(os.fspath(x)) if _is_path(x) else x


def _trace(x: Any) -> Any:
    from uvmlab.trace.schema import read_trace

    return read_trace(x) if _is_path(x) else x


def _rundir(x: Any) -> Any:
    from uvmlab.files.rundir import RunDir

    return x if isinstance(x, RunDir) else RunDir(_path_of(x))


def _cases(x: Any) -> Any:
    """Ground-truth cases: a CSV or snapshot folder path (the CLI's defaults), or the list of EvalCase itself."""
    from uvmlab.evaluate.ground_truth import load_ground_truth

    return load_ground_truth(x)[0] if _is_path(x) else x


def _spec(x: Any) -> Any:
    from uvmlab.sweep.spec import load_spec

    return load_spec(x) if _is_path(x) else x


_ARGS: dict[str, dict[int, Callable[[Any], Any]]] = {
    "calibrate": {0: _path_of},
    "import_export": {0: _path_of},
    "replay_snapshot": {0: _path_of},
    "compare_runs": {0: _path_of, 1: _path_of},
    "collect": {0: _path_of},
    "build_report": {0: _path_of},
    "estimate": {0: _workload, 1: _gpu},
    "get_trace": {0: _workload},
    "capture_trace": {0: _workload},
    "colocate_workloads": {1: _gpu},
    "to_cuda": {0: _trace, 1: _gpu},
    "place": {0: _trace},
    "simulate_run": {1: _rundir},
    "run_sweep": {0: _spec},
    "evaluate": {0: _cases},
}
"""Per function: positional index -> how to turn a path (or name) into what the module function takes."""

_KWARGS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "estimate": {"cfg": _workload, "gpu": _gpu},
    "colocate_workloads": {"gpu": _gpu},
    "compare_runs": {"run_a": _path_of, "run_b": _path_of},
    "simulate_run": {"rundir": _rundir},
    "run_sweep": {"spec": _spec},
    "replay_snapshot": {"path": _path_of},
    "evaluate": {"cases": _cases},
}

_ACCEPTS: dict[Callable[[Any], Any], tuple[str, str]] = {
    _gpu: ("uvmlab.gpus.GpuSpec", "a GPU name (uvmlab gpus) or a GpuSpec"),
    _workload: ("uvmlab.config.WorkloadConfig", "a workload name or file path, or a WorkloadConfig"),
    _trace: ("uvmlab.trace.schema.Trace", "a trace folder's path or a Trace (read_trace)"),
    _rundir: ("uvmlab.files.rundir.RunDir", "a run directory's path, a RunDir or a RunResult"),
    _cases: ("collections.abc.Sequence", "a ground-truth CSV or snapshot folder path, or a list of EvalCase"),
    _spec: ("uvmlab.sweep.spec.SweepSpec", "a sweep spec's path or a SweepSpec (load_spec)"),
    _path_of: ("", "a path (str or os.PathLike) or an object opened from one (an export, a run, a RunDir)"),
}
"""Per converter: the type it passes through unchanged ('': none) and what the parameter takes, in words."""

_REPLACED_TAKES: dict[tuple[str, str], tuple[str, str]] = {
    ("summarize", "ex"): (
        "uvmlab.measure.nsys.read.Export",
        "an nsys export's path (str or os.PathLike) or an export opened with open_export",
    ),
    ("characterize_source", "source"): (
        "uvmlab.trace.schema.Trace",
        "a workload name, a snapshot or trace folder path, a read snapshot or a Trace",
    ),
}
"""Parameters of the functions in ``_REPLACED`` that take a path besides their annotated type."""

_WORDS = {
    "str": "text",
    "int": "a whole number",
    "float": "a number",
    "bool": "True or False",
    "PathLike": "a path (str or os.PathLike)",
    "Path": "a path (str or os.PathLike)",
    "NoneType": "None",
    "GpuSpec": "a GPU name (uvmlab gpus) or a GpuSpec",
    "WorkloadConfig": "a workload name or file path, or a WorkloadConfig",
    "RunConfig": "a RunConfig (run also takes a workload name)",
}


def _klass(dotted: str) -> type | None:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name, None) if module else None


def _classes(annotation: Any) -> tuple[type, ...] | None:
    """The runtime classes an annotation admits, or None where it cannot be checked (Any, a type variable)."""
    import types
    import typing

    if annotation is None or annotation is type(None):
        return (type(None),)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        parts = [_classes(a) for a in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else tuple(c for p in parts if p for c in p)
    if origin is not None:
        return (origin,) if isinstance(origin, type) else None
    if annotation is float:
        return (float, int)
    return (annotation,) if isinstance(annotation, type) and annotation is not typing.Any else None


def _annotation(fn: Callable[..., Any], param: inspect.Parameter) -> tuple[type, ...] | None:
    """``param``'s annotation of ``fn`` as runtime classes (None when absent or not resolvable here)."""
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return None
    if isinstance(ann, str):
        try:
            ann = eval(ann, getattr(fn, "__globals__", {}), {})  # the module's own annotation text, never user input
        except Exception:  # a name imported for type checkers only: not checked here
            return None
    return _classes(ann)


def _words(classes: tuple[type, ...]) -> str:
    if str in classes and any(issubclass(c, os.PathLike) or c is os.PathLike for c in classes):
        classes = tuple(c for c in classes if c is not str)  # "a path (str or os.PathLike)" says it
    names = list(dict.fromkeys(_WORDS.get(c.__name__, f"a {c.__name__}") for c in classes))
    return " or ".join(names)


def _check_arguments(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse (InputError, one sentence naming the function and the parameter) an argument of a type the function
    cannot take, before it runs: a parameter with a converter takes a path (or a name) or the converter's type, any
    other the classes of its annotation. An unknown GPU type lists the known GPUs, as the CLI does."""
    try:
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return  # a call of the wrong shape: Python's own TypeError when the function is called
    names = list(sig.parameters)
    by_name = {names[i]: c for i, c in _ARGS.get(name, {}).items() if i < len(names)} | _KWARGS.get(name, {})
    for pname, value in bound.arguments.items():
        param = sig.parameters[pname]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or (value is None and param.default is None):
            continue
        conv = by_name.get(pname)
        taken = _ACCEPTS.get(conv) if conv is not None else _REPLACED_TAKES.get((name, pname))
        if taken is not None:
            passes, words = taken
            klass = _klass(passes) if passes else None
            has_path = conv in (_path_of, _rundir, None) and _is_path(getattr(value, "path", None))
            if _is_path(value) or has_path or (klass is not None and isinstance(value, klass)):
                continue
        else:
            classes = _annotation(fn, param)
            if classes is None or isinstance(value, classes):
                continue
            words = _words(classes)
        from uvmlab.errors import InputError
        from uvmlab.gpus import GPUS
        from uvmlab.numbers import prefix

        known = f"; known GPUs: {', '.join(GPUS)}" if "GPU name" in words else ""
        raise InputError(f"{name}(): {pname} must be {words}, not {prefix(value)}{known}")


def _summarize(ex: Any, *args: Any, **kwargs: Any) -> Any:
    """``summarize`` of an opened export, or of a path (opened and closed here)."""
    from uvmlab.measure.nsys.read import open_export
    from uvmlab.measure.nsys.stats import summarize

    if _is_path(ex):
        with open_export(ex) as opened:
            return summarize(opened, *args, **kwargs)
    return summarize(ex, *args, **kwargs)


def _characterize_source(source: Any, *args: Any, **kwargs: Any) -> Any:
    """``characterize_source`` of a workload name, snapshot or trace path, a read snapshot, or a Trace object."""
    from uvmlab.evaluate.fragmentation import characterize, characterize_source
    from uvmlab.trace.schema import Trace

    if isinstance(source, Trace):
        grouping = kwargs.get("grouping", args[2] if len(args) > 2 else "best")
        return characterize(source, name=str(source.header.get("workload", "trace")), grouping=grouping)
    return characterize_source(_path_of(source), *args, **kwargs)


def _run(cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """``run`` of a RunConfig, or of a workload name / file / WorkloadConfig with config fields as keywords
    (``run("gpt2", oversub=4, pca="off")``); config keywords given with a RunConfig replace its fields."""
    import inspect
    from dataclasses import fields, replace

    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.errors import InputError
    from uvmlab.run import run

    run_fields = {f.name for f in fields(RunConfig)} - {"workload"}
    workload_fields = {f.name for f in fields(WorkloadConfig)} - {"workload"}
    run_params = set(inspect.signature(run).parameters) - {"cfg"}
    unknown = sorted(set(kwargs) - run_fields - workload_fields - run_params)
    if unknown:
        raise InputError(
            f"run() got unknown parameters {unknown}; it takes {', '.join(sorted(run_params))}, the RunConfig fields "
            f"{', '.join(sorted(run_fields))} and the WorkloadConfig fields {', '.join(sorted(workload_fields))}"
        )
    rkw = {k: kwargs.pop(k) for k in list(kwargs) if k in run_fields}
    wkw = {k: kwargs.pop(k) for k in list(kwargs) if k in workload_fields}
    if isinstance(rkw.get("gpu"), str):  # a GPU file: its base GPU and its fields (uvmlab.files.gpu_file)
        from uvmlab.files.gpu_file import resolve_gpu

        base, spec = resolve_gpu(rkw["gpu"])
        rkw["gpu"] = base
        if spec:
            rkw["gpu_spec"] = {**spec, **dict(rkw.get("gpu_spec") or {})}
    if isinstance(cfg, RunConfig):
        workload = replace(cfg.workload, **wkw) if wkw else cfg.workload
        cfg = replace(cfg, workload=workload, **rkw)
    else:
        workload = cfg if isinstance(cfg, WorkloadConfig) else WorkloadConfig(cfg)
        cfg = RunConfig(workload=replace(workload, **wkw) if wkw else workload, **rkw)
    return run(cfg, *args, **kwargs)


_UNCHECKED = frozenset({"run"})
"""Functions whose arguments are checked by their own replacement (``_run``: a RunConfig or a workload and its
settings, checked by RunConfig and WorkloadConfig)."""

_REPLACED: dict[str, Callable[..., Any]] = {
    "summarize": _summarize,
    "characterize_source": _characterize_source,
    "run": _run,
}


# -- errors: Python names, not CLI flags ------------------------------------------------------------------------
_FLAG_WORDS = {
    "--force": "force=True",
    "--mode gpu": "mode='gpu'",
    "--mode sim": "mode='sim'",
    "--device meta": "device='meta'",
    "--executor local": "executor='local'",
    "--gpu-memory": "a GPU memory size (get_gpu(name, memory))",
    "--option": "WorkloadConfig options",
    "--sim-option": "RunConfig sim_options",
    "--params": "RunConfig params_file",
}
_FLAG = re.compile("|".join(re.escape(k) for k in sorted(_FLAG_WORDS, key=len, reverse=True)) + r"|--([a-z][a-z0-9-]*)")


def python_message(message: str) -> str:
    """``message`` with uvmlab's CLI flags named as Python parameters; shell commands in backquotes stay as they are.

    ``"... without --force"`` -> ``"... without force=True"``; ``"--jobs must be >= 1"`` -> ``"jobs must be >= 1"``.
    """

    def fix(part: str) -> str:
        return _FLAG.sub(lambda m: _FLAG_WORDS.get(m.group(0)) or m.group(1).replace("-", "_"), part)

    parts = message.split("`")
    return "`".join(fix(p) if i % 2 == 0 else p for i, p in enumerate(parts))


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    from uvmlab.errors import UvmlabError

    target = _REPLACED.get(name, fn)
    pos, kw = _ARGS.get(name, {}), _KWARGS.get(name, {})

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            if name not in _UNCHECKED:
                _check_arguments(name, fn, args, kwargs)
            args = tuple(pos[i](a) if i in pos else a for i, a in enumerate(args))
            kwargs = {k: kw[k](v) if k in kw else v for k, v in kwargs.items()}
            return target(*args, **kwargs)
        except UvmlabError as exc:
            exc.args = (python_message(str(exc)), *exc.args[1:])
            raise

    return call


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"uvmlab.api has no {name!r}; public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    if callable(value) and not isinstance(value, type):
        value = _wrap(name, value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
