"""The sweep-level table ``DIR/results.parquet``: one row per complete run, rebuilt from run directories.

Columns: ``run_id`` (the run folder name, ``<workload>-x<F>-pca<on|off>-<hash8>``), ``run_dir``; the configuration as
``cfg_<field>`` (workload fields, run fields, ``cfg_option.<key>``, ``cfg_sim.<knob>``); every scalar of
result.json under its own name (uvmlab.stats.schema.RESULT_KEYS and any extra scalar key, nested mappings
flattened one level as ``key.sub``); scalars of env.json as ``env_<key>``; ``slowdown_vs_oversub1``
(:func:`slowdown_vs_oversub1`: the seed study's Figure 3 ratio). Runs without result.json (pending or
interrupted) are not rows; :func:`collect` never reads temporary files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_with
from uvmlab.files.inputs import read_parquet_file
from uvmlab.files.rundir import RunDir
from uvmlab.sweep.folder import SweepFolder

RESULTS_NAME = "results.parquet"
MAX_RESULTS_BYTES = 256 << 20
"""Largest results.parquet read (256 MiB; one row per run, ~1 KB a row: 100,000 runs are ~100 MB)."""
GROUP_KEYS = ("cfg_workload", "cfg_batch_size", "cfg_optimizer", "cfg_dtype", "cfg_gpu", "mode")
"""What identifies 'the same job' across factors and PCA settings."""


def slowdown_vs_oversub1(df: pd.DataFrame) -> pd.Series:
    """Iteration time / that of the same job (GROUP_KEYS) with the same PCA setting at factor <= 1.0 (seeds/003
    section 4.2, Figure 3); NaN without such a run, never another ratio in its place."""
    need = {"oversub", "pca", "outcome", "iteration_time_ns"}
    if df.empty or not need <= set(df.columns):
        return pd.Series(float("nan"), index=df.index, dtype=float)
    df = df.assign(
        oversub=pd.to_numeric(df["oversub"], errors="coerce"),
        iteration_time_ns=pd.to_numeric(df["iteration_time_ns"], errors="coerce"),
    )
    keys = [df[k].map(str) for k in (*(k for k in GROUP_KEYS if k in df.columns), "pca")]  # None -> 'None'
    at1 = df["iteration_time_ns"].where((df["oversub"] <= 1.0) & (df["outcome"] == "ok"))
    base = at1.groupby(keys).transform("mean")
    return (df["iteration_time_ns"] / base).astype(float)


def _scalars(d: dict[str, Any], prefix: str = "", depth: int = 1) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if depth > 0:
                row.update(_scalars(value, f"{name}.", depth - 1))
        elif isinstance(value, list | tuple):
            continue
        else:
            row[name] = value
    return row


def unwrap_config(data: Any) -> Any:
    """The RunConfig dict inside a config.json: bare, or wrapped as ``{"run": {...}}`` / ``{"config": {...}}``
    (``uvmlab run`` writes ``{"run": RunConfig dict, "mode": resolved mode}``)."""
    if isinstance(data, dict) and "workload" not in data:
        for key in ("run", "config"):
            if isinstance(data.get(key), dict):
                return data[key]
    return data


def _cell(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list | tuple) else value


def config_columns(cfg: dict[str, Any]) -> dict[str, Any]:
    """Flatten a RunConfig dict into ``cfg_*`` columns (nested values other than options become JSON text)."""
    row: dict[str, Any] = {}
    wl = dict(cfg.get("workload") or {})
    options = wl.pop("options", {}) or {}
    for key, value in wl.items():
        row[f"cfg_{key}"] = _cell(value)
    for key, value in cfg.items():
        if key in ("workload", "sim_options"):
            continue
        row[f"cfg_{key}"] = _cell(value)
    for key, value in sorted(options.items()):
        row[f"cfg_option.{key}"] = _cell(value)
    for key, value in sorted((cfg.get("sim_options") or {}).items()):
        row[f"cfg_sim.{key}"] = _cell(value)
    return row


def _read_json(path: Path) -> dict[str, Any] | None:
    """A run folder's JSON object, or None when it is missing or cannot be read (not UTF-8, not JSON, nested
    deeper than Python's decoder goes, too large, not an object: uvmlab.files.rundir.RunDir.read_json)."""
    return _json_or_why(path)[0]


def _json_or_why(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the JSON object in ``path``, '') or (None, why it cannot be read)."""
    try:
        data = RunDir(path.parent).read_json(path)
    except InputError as exc:
        return None, str(exc)
    return (data, "") if isinstance(data, dict) else (None, f"{path} holds no JSON object")


BROKEN = "broken"
"""Outcome of a run whose result.json cannot be read: listed (with why) in results.parquet and the report, left out
of every figure and statistic; the other runs still count."""


def run_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """Run directories of a sweep folder (``DIR/runs/*``), sorted by name."""
    runs = Path(out) / "runs"
    if not runs.is_dir():
        raise InputError(f"{out} is not a sweep folder (no runs/ inside); run `uvmlab sweep SPEC -o {out}` first")
    return sorted(p for p in runs.iterdir() if p.is_dir())


def collect(out: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per complete run of sweep folder ``out`` (see the module docstring for the columns)."""
    rows = []
    unreadable: list[str] = []
    for path in run_dirs(out):
        rundir = RunDir(path)
        if not rundir.is_complete():
            continue
        result, why = _json_or_why(rundir.result_json)
        row: dict[str, Any] = {"run_id": path.name, "run_dir": str(path)}
        cfg = unwrap_config(_read_json(rundir.config_json))
        if isinstance(cfg, dict):
            row.update(config_columns(cfg))
        if result is None:  # not written by uvmlab (its writes are atomic): a broken run, said and counted as such
            unreadable.append(path.name)
            rows.append({**row, "outcome": BROKEN, "error": why[:500]})
            continue
        row.update(_scalars(result))
        env = _read_json(rundir.env_json)
        if env is not None:
            row.update({f"env_{k}": v for k, v in _scalars(env, depth=0).items()})
        rows.append(row)
    if unreadable:
        from uvmlab.console import note

        note(
            f"warning: {len(unreadable)} run(s) of {out} have an unreadable result.json: outcome {BROKEN}, left out "
            f"of the figures (e.g. runs/{unreadable[0]}); `uvmlab sweep SPEC -o {out}` redoes them"
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame({"run_id": pd.Series(dtype="string"), "outcome": pd.Series(dtype="string")})
    for col in df.columns:
        if df[col].dtype == object:
            kinds = {type(v) for v in df[col] if v is not None and v == v}
            if len(kinds) > 1 and not kinds <= {int, float}:
                df[col] = df[col].map(lambda v: None if v is None or v != v else str(v))
    df["slowdown_vs_oversub1"] = slowdown_vs_oversub1(df)
    return df


def _refuse_non_file(path: Path) -> None:
    """results.parquet is replaced only where it is a regular file (or absent): never a link, FIFO or device."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError(f"{path} is not a regular file; uvmlab writes results.parquet only in place of its own")


def write_results(out: str | os.PathLike[str]) -> Path:
    """Rebuild ``out/results.parquet`` from the run directories (atomic); return its path."""
    path = Path(out) / RESULTS_NAME
    _refuse_non_file(path)
    folder = SweepFolder(out)
    if folder.is_owned():
        folder.check()  # a folder uvmlab may not write in is refused before the runs are read
    df = collect(out)
    if folder.is_owned():  # listed with its content: a results.parquet of the user's is never replaced
        folder.write_file_with(path, lambda tmp: df.to_parquet(tmp, index=False))
    else:
        _refuse_foreign_results(path)
        atomic_write_with(path, lambda tmp: df.to_parquet(tmp, index=False))
    return path


def _refuse_foreign_results(path: Path) -> None:
    """In a folder without uvmlab's ownership record (a sweep of an older uvmlab), an existing results.parquet is
    replaced only when it reads as the table uvmlab writes there (a Parquet file with a ``run_id`` column): a file of
    the user's at that name is never overwritten."""
    if not path.exists():
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError, pa.ArrowException):  # not Parquet: not ours
        names = set()
    if "run_id" not in names:
        raise InputError(f"{path} is not a results table uvmlab wrote (no run_id column); move it away to collect")


def read_results(out: str | os.PathLike[str]) -> pd.DataFrame:
    """``out/results.parquet``, rebuilt first when missing or older than a run's result.json."""
    path = Path(out) / RESULTS_NAME
    _refuse_non_file(path)
    newest = 0.0
    for p in run_dirs(out):
        r = RunDir(p).result_json
        if r.is_file():
            newest = max(newest, r.stat().st_mtime)
    if not path.is_file() or path.stat().st_mtime < newest:
        write_results(out)
    try:
        return read_parquet_file(path, MAX_RESULTS_BYTES, "a sweep's results.parquet")
    except InputError:  # derived data: a damaged results.parquet is moved aside (kept) and rebuilt from the runs
        import time

        from uvmlab.console import note

        aside = path.with_name(f"{RESULTS_NAME}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        os.replace(path, aside)
        note(f"warning: {path} is unreadable; moved to {aside.name} and rebuilt from {Path(out) / 'runs'}")
        return pd.read_parquet(write_results(out))
