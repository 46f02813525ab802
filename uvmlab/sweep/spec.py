"""Sweep specifications: a YAML grid of run configurations, validated before any run starts.

A spec (``experiments/*.yaml``, documented in docs/sweeps.md)::

    version: 1
    name: lin_jeon_2025
    defaults: {mode: sim, iterations: 3}          # applied to every configuration
    grid:                                         # Cartesian product of the axes
      workload: [{workload: alexnet, batch_size: 128}, gpt2]
      oversub: [1.0, 2, 4]
      pca: [on, off]
      sim.prefetch_threshold: [51, 100]           # a simulator knob (RunConfig.sim_options)
    include: [{workload: bert, oversub: 3}]       # extra configurations (lists inside expand as a small grid)
    exclude: [{workload: alexnet, oversub: [4]}]  # drop configurations matching every field given
    slurm: {partition: gpu, time_min: 60, gpus_per_task: 1, configs_per_task: 4}

The YAML is *composed* (not just loaded) so every error names the file, the line and the field
(``lin.yaml line 7, grid.oversubb: unknown field; known fields: ...``). Configurations become
:class:`uvmlab.config.RunConfig` objects; duplicates (same ``config_hash()``) are kept once.

Limits, checked before anything is built (docs/safety.md): the file is a regular file of at most
:data:`MAX_SPEC_BYTES`; the composed YAML has at most :data:`MAX_SPEC_NODES` nodes with every alias counted at
every use (a "billion laughs" of nested aliases is refused before it is expanded) and nests at most
:data:`MAX_SPEC_DEPTH` levels; the number of configurations (the product of the axis lengths, per grid and
include entry) is checked against ``max_configs`` (:data:`DEFAULT_MAX_CONFIGS`, ``--max-configs``) before the
product is expanded. Values quoted in error sentences are shortened (:func:`uvmlab.files.inputs.short`).

Command-line overrides (Hydra's multirun syntax, ``uvmlab sweep spec.yaml workload=gpt2,bert oversub=1,2,4``):
``KEY=V1,V2,...`` (:func:`parse_overrides`) replaces the grid axis KEY by these values, or adds it as an axis
when the grid has none (a value in ``defaults`` is overridden), and sets KEY to each value in every ``include``
entry. A ``workload`` value naming a bundled grid entry (``{workload: alexnet, batch_size: 128}``) keeps the
bundle. ``exclude`` rules still apply.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from uvmlab.config import ATTENTION_IMPLS, DTYPES, MODES, OPTIMIZERS, ZERO_GRAD_POSITIONS, RunConfig, WorkloadConfig
from uvmlab.config import check_oversub as _check_oversub
from uvmlab.errors import InputError
from uvmlab.files.inputs import read_input_text, short
from uvmlab.numbers import MAX_NUMBER_CHARS, parse_float, parse_int, prefix
from uvmlab.sweep.slurm import SLURM_FIELDS, SlurmOptions, check_slurm_field
from uvmlab.units import parse_bytes

SPEC_VERSION = 1
MAX_SPEC_BYTES = 1 << 20
"""Largest spec file read (1 MiB; the bundled specs in experiments/ are under 1.2 KB)."""
MAX_SPEC_NODES = 100_000
"""YAML nodes a spec may expand to, every alias counted at each use (lin_jeon_2025.yaml has about 60)."""
MAX_SPEC_DEPTH = 20
"""Nesting of a spec (sections > fields > lists > bundles > options: 6 levels at most in a real spec)."""
DEFAULT_MAX_CONFIGS = 10_000
"""Configurations a spec may expand to unless ``--max-configs`` says otherwise (lin_jeon_2025.yaml: 120; at a
minute a run, 10,000 are a week of one GPU)."""
MAX_CONFIGS = 100_000
"""The most ``--max-configs`` may allow: what one machine can prepare and hold. A sweep builds and checks every
configuration (0.3 to 2.4 ms each: 1 to 4 minutes for 100,000, measured on a 2-core machine idle and under load
16) and writes one run directory each before the first run; at a minute a run, 100,000 runs are 70 days of one
GPU. A dry run of any spec builds only the configurations it shows (:data:`SAMPLE_CONFIGS`)."""
SAMPLE_CONFIGS = 1_000
"""Configurations a dry run builds and shows at most; a larger spec is counted (the product of its axes) and the
first ones are shown."""
TOP_KEYS = ("version", "name", "description", "defaults", "grid", "include", "exclude", "slurm")

WORKLOAD_FIELDS = ("workload", "batch_size", "optimizer", "zero_grad", "attention", "dtype", "iterations", "options")
RUN_FIELDS = ("oversub", "pca", "mode", "gpu", "gpu_memory", "prefetch", "params_file", "sim_options")
CONFIG_FIELDS = WORKLOAD_FIELDS + RUN_FIELDS
"""Fields of one configuration; also ``sim.<knob>`` (into sim_options) and ``option.<key>`` (into options)."""


def known_workloads() -> tuple[str, ...]:
    """Built-in workload names (``workloads.registry.WORKLOADS``)."""
    from workloads.registry import WORKLOADS

    return tuple(WORKLOADS)


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: its configurations in a deterministic order, and Slurm options."""

    name: str
    configs: tuple[RunConfig, ...]
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    description: str = ""
    source: str = ""
    duplicates: int = 0
    """Configurations produced more than once by grid/include (kept once)."""
    overrides: tuple[str, ...] = ()
    """Command-line overrides applied (``KEY=V1,V2``), as given."""
    size: int = 0
    """Configurations the grid and include entries produce, before exclusions and duplicates (0: not counted)."""
    sampled: bool = False
    """True when ``configs`` holds only the first configurations (a dry run of a large spec: ``sample``)."""


# -- YAML with line numbers --------------------------------------------------------------------------------


class _Where:
    """Formats 'FILE line N, FIELD: ' prefixes."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, node: yaml.Node | None, path: str, message: str) -> InputError:
        line = f" line {node.start_mark.line + 1}" if node is not None else ""
        where = f", {path}" if path else ""
        return InputError(f"{self.source}{line}{where}: {message}")


class _CheckedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader whose numbers pass uvmlab.numbers' checks: an integer literal longer than
    ``MAX_NUMBER_CHARS`` is refused before PyYAML converts it (a 5,000-digit one raised Python's int-conversion
    error), integers fit int64, and ``.inf`` / ``.nan`` are refused (no setting of a spec takes them)."""


def _yaml_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(node.value)
    if len(text) > MAX_NUMBER_CHARS:
        raise InputError(f"the integer {prefix(text)} does not fit 64 bits")
    return parse_int(yaml.SafeLoader.construct_yaml_int(loader, node), "the value")


def _yaml_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    return parse_float(yaml.SafeLoader.construct_yaml_float(loader, node), "the value")


_CheckedLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
_CheckedLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


def _construct(node: yaml.Node) -> Any:
    loader = _CheckedLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _mapping_items(node: yaml.Node, where: _Where, path: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise where.error(node, path, f"must be a mapping (key: value), not {_kind(node)}")
    items = []
    seen: set[str] = set()
    for key_node, value_node in node.value:
        key = _construct(key_node)
        if not isinstance(key, str):
            raise where.error(key_node, path, f"keys must be text, not {short(key)}")
        if key in seen:
            raise where.error(key_node, _join(path, key), "appears twice")
        seen.add(key)
        items.append((key, key_node, value_node))
    return items


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return short(_construct(node))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _seq(node: yaml.Node) -> list[yaml.Node]:
    """A list node's items; a single value counts as a one-item list."""
    return list(node.value) if isinstance(node, yaml.SequenceNode) else [node]


# -- field validation --------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_field(name: str, value: Any, base_dir: Path) -> Any:
    """Validate and normalize one configuration field; raise InputError(message) without location."""
    if name.startswith("sim."):
        if not name[4:]:
            raise InputError("a simulator knob needs a name after 'sim.'")
        if not isinstance(value, str | int | float | bool) and value is not None:
            raise InputError(f"simulator knobs take a number, text or true/false, not {short(value)}")
        return value
    if name.startswith("option."):
        if not name[7:]:
            raise InputError("a workload option needs a name after 'option.'")
        return value
    if name == "workload":
        if not isinstance(value, str) or not value:
            raise InputError(f"must be a workload name or a .py file, not {short(value)}")
        if value.endswith(".py"):
            path = Path(value) if Path(value).is_absolute() else base_dir / value
            if not path.is_file():
                raise InputError(f"workload file {short(str(path))} does not exist")
            return str(path.resolve())
        from workloads.registry import family

        known = known_workloads()
        if value not in known and family(value) is None:
            raise InputError(
                f"unknown workload {short(value)}; known workloads: {', '.join(known)}, a named model "
                "(torchvision:NAME, timm:NAME, hf:ARCH) or a .py file"
            )
        return value
    if name in ("batch_size", "iterations"):
        if value is None and name == "batch_size":
            return None
        if not _is_int(value) or value < 1:
            raise InputError(f"must be a whole number >= 1, not {short(value)}")
        return value
    choices = {"optimizer": OPTIMIZERS, "zero_grad": ZERO_GRAD_POSITIONS, "attention": ATTENTION_IMPLS}
    choices |= {"dtype": DTYPES, "mode": MODES}
    if name in choices:
        if value not in choices[name]:
            raise InputError(f"must be one of {', '.join(choices[name])}, not {short(value)}")
        return value
    if name == "oversub":
        if isinstance(value, bool):
            raise InputError(f"must be a number > 0, not {short(value)}")
        return _check_oversub(value)
    if name in ("pca", "prefetch"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("on", "off"):
            return value.lower() == "on"
        raise InputError(f"must be on/off or true/false, not {short(value)}")
    if name == "gpu":
        from uvmlab.gpus import get_gpu

        if not isinstance(value, str):
            raise InputError(f"must be a GPU name, not {short(value)}")
        get_gpu(value)
        return value
    if name == "gpu_memory":
        if value is None:
            return None
        return parse_bytes(value)
    if name == "params_file":
        if value is None:
            return None
        path = Path(str(value)) if Path(str(value)).is_absolute() else base_dir / str(value)
        if not path.is_file():
            raise InputError(f"parameter file {short(str(path))} does not exist")
        from uvmlab.sim.uvm.timing import read_params_file

        read_params_file(path)  # its costs checked once, before any configuration runs
        return str(path.resolve())
    if name in ("options", "sim_options"):
        if not isinstance(value, dict):
            raise InputError(f"must be a mapping, not {short(value)}")
        return value
    raise InputError(f"unknown field; known fields: {', '.join(CONFIG_FIELDS)}, sim.<knob>, option.<key>")


def _is_field(name: str) -> bool:
    return name in CONFIG_FIELDS or name.startswith(("sim.", "option."))


def _unknown_field(where: _Where, key_node: yaml.Node, path: str) -> InputError:
    return where.error(
        key_node, path, f"unknown field; known fields: {', '.join(CONFIG_FIELDS)}, sim.<knob>, option.<key>"
    )


def _field_value(where: _Where, key: str, key_node: yaml.Node, value_node: yaml.Node, path: str, base: Path) -> Any:
    if not _is_field(key):
        raise _unknown_field(where, key_node, path)
    try:
        return _check_field(key, _construct(value_node), base)
    except InputError as exc:
        raise where.error(value_node, path, str(exc)) from None


def _check_count(n: int, limit: int, where: _Where, node: yaml.Node | None, path: str) -> None:
    """Refuse ``n`` configurations above ``limit`` (called before a product is expanded)."""
    if n > limit:
        raise where.error(
            node,
            path,
            f"expands to {n:,} configurations, more than the {limit:,} allowed; split the spec or pass --max-configs",
        )


def _config_mapping(
    where: _Where, node: yaml.Node, path: str, base: Path, expand: bool, limit: int = DEFAULT_MAX_CONFIGS
) -> list[dict[str, Any]]:
    """A mapping of fields -> list of flat dicts (lists of values expand as a product when ``expand``; at most
    ``limit`` of them)."""
    axes: list[list[Any]] = []
    names: list[str] = []
    for key, key_node, value_node in _mapping_items(node, where, path):
        p = _join(path, key)
        if not _is_field(key):
            raise _unknown_field(where, key_node, p)
        if expand and isinstance(value_node, yaml.SequenceNode):
            values = [_field_value(where, key, key_node, v, p, base) for v in value_node.value]
            if not values:
                raise where.error(value_node, p, "an empty list selects nothing; remove the field or give values")
        else:
            values = [_field_value(where, key, key_node, value_node, p, base)]
        names.append(key)
        axes.append(values)
    _check_count(math.prod(len(a) for a in axes), limit, where, node, path)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


def build_config(flat: dict[str, Any]) -> RunConfig:
    """Turn validated flat fields (``workload``, ``oversub``, ``sim.knob``, ...) into a RunConfig."""
    wl: dict[str, Any] = {}
    run: dict[str, Any] = {}
    sim_options: dict[str, Any] = dict(flat.get("sim_options") or {})
    options: dict[str, Any] = dict(flat.get("options") or {})
    for key, value in flat.items():
        if key.startswith("sim."):
            sim_options[key[4:]] = value
        elif key.startswith("option."):
            options[key[7:]] = value
        elif key in ("options", "sim_options"):
            continue
        elif key == "gpu_memory":
            run["gpu_memory_bytes"] = value
        elif key in WORKLOAD_FIELDS:
            wl[key] = value
        else:
            run[key] = value
    if "workload" not in wl:
        raise InputError("no workload: give one in defaults, grid or include")
    return RunConfig(workload=WorkloadConfig(**wl, options=options), sim_options=sim_options, **run)


def _matches(flat: dict[str, Any], rule: dict[str, list[Any]]) -> bool:
    return all(flat.get(k) in values for k, values in rule.items())


def _parse_slurm(where: _Where, node: yaml.Node) -> SlurmOptions:
    values: dict[str, Any] = {}
    for key, key_node, value_node in _mapping_items(node, where, "slurm"):
        p = _join("slurm", key)
        if key not in SLURM_FIELDS:
            raise where.error(key_node, p, f"unknown field; known fields: {', '.join(SLURM_FIELDS)}")
        try:
            values[key] = check_slurm_field(key, _construct(value_node))
        except InputError as exc:
            raise where.error(value_node, p, str(exc)) from None
    return SlurmOptions(**values)


def load_spec(
    path: str | os.PathLike[str],
    overrides: list[str] | tuple[str, ...] = (),
    max_configs: int = DEFAULT_MAX_CONFIGS,
    sample: int | None = None,
) -> SweepSpec:
    """Read and validate a sweep spec and its ``KEY=V1,V2`` overrides; every error names the file, line and field
    (InputError, exit 2). More than ``max_configs`` configurations is an error, found before they are built.
    ``sample``: build only the first ``sample`` configurations (``SweepSpec.sampled``; a dry run)."""
    path = Path(path)
    text = read_input_text(path, MAX_SPEC_BYTES, "a sweep spec (a YAML file)")
    spec = parse_spec(
        text,
        source=str(path),
        base_dir=path.parent,
        overrides=parse_overrides(overrides),
        max_configs=max_configs,
        sample=sample,
    )
    return replace(spec, overrides=tuple(overrides))


def parse_overrides(items: list[str] | tuple[str, ...], base_dir: Path | None = None) -> dict[str, list[Any]]:
    """``["oversub=1,2,4", "pca=off"]`` -> ``{"oversub": [1, 2, 4], "pca": [False]}``, each value validated.

    Values are split on commas and read as YAML scalars (``2`` a number, ``gpt2`` text); errors name the override.
    """
    base = (base_dir or Path.cwd()).resolve()
    out: dict[str, list[Any]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"override {item!r} is not KEY=VALUE[,VALUE...] (e.g. oversub=1,2,4)")
        if not _is_field(key):
            raise InputError(
                f"override {item!r}: unknown field; known fields: {', '.join(CONFIG_FIELDS)}, sim.<knob>, option.<key>"
            )
        if key in out:
            raise InputError(f"override {item!r}: {key} is given twice")
        parts = [p.strip() for p in raw.split(",")]
        if not raw.strip() or any(not p for p in parts):
            raise InputError(f"override {item!r}: give one or more comma-separated values")
        values = []
        for part in parts:
            try:
                value = yaml.load(part, Loader=_CheckedLoader)  # a SafeLoader: plain values only
            except (yaml.YAMLError, RecursionError):
                value = part
            try:
                values.append(_check_field(key, value, base))
            except InputError as exc:
                raise InputError(f"override {key}={part}: {exc}") from None
        out[key] = values
    return out


def _apply_overrides(
    rows: list[dict[str, Any]], overrides: dict[str, list[Any]], limit: int = DEFAULT_MAX_CONFIGS
) -> list[dict[str, Any]]:
    """Every row once per combination of override values (include entries)."""
    n = len(rows) * math.prod(len(v) for v in overrides.values())
    if n > limit:
        raise InputError(f"the overrides expand an include entry to {n:,} configurations, more than {limit:,}")
    for key, values in overrides.items():
        rows = [{**row, key: v} for row in rows for v in values]
    return rows


def parse_spec(
    text: str,
    source: str = "<spec>",
    base_dir: Path | None = None,
    overrides: dict[str, list[Any]] | None = None,
    max_configs: int = DEFAULT_MAX_CONFIGS,
    sample: int | None = None,
) -> SweepSpec:
    """Validate the YAML text of a spec, with command-line ``overrides`` (see the module docstring); ``sample``:
    build only the first ``sample`` configurations (the count is still of the whole spec)."""
    if not _is_int(max_configs) or not 1 <= max_configs <= MAX_CONFIGS:
        raise InputError(f"--max-configs must be a whole number from 1 to {MAX_CONFIGS:,}, not {short(max_configs)}")
    try:
        return _parse_spec(text, source, base_dir, overrides or {}, max_configs, sample)
    except RecursionError:
        raise InputError(
            f"{source}: the YAML nests too deeply (a spec nests at most {MAX_SPEC_DEPTH} levels)"
        ) from None
    except yaml.YAMLError as exc:  # e.g. a !!python/... tag: SafeLoader refuses to construct it (nothing runs)
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{source}{line}: {problem} (specs hold plain YAML values only)") from None


def _check_nodes(root: yaml.Node, where: _Where) -> int:
    """Refuse a composed spec above MAX_SPEC_NODES nodes (an alias counts its node's whole size at every use) or
    MAX_SPEC_DEPTH levels, or with an alias inside itself; return the expanded node count.

    Iterative post-order walk, each distinct node visited once with its expanded size memoized (as
    :func:`uvmlab.trace.safe_pickle._check_tree` does for pickles), so the count costs one visit per node.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        key = id(node)
        if done:
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            open_.discard(key)
            if sizes[key] > MAX_SPEC_NODES:
                raise where.error(node, "", f"expands to more than {MAX_SPEC_NODES:,} YAML nodes (aliases count at "
                                  "every use); a spec is a small grid")  # fmt: skip
            continue
        if key in sizes:
            continue
        if key in open_:
            raise where.error(node, "", "an alias refers to a node that contains it (the spec would be infinite)")
        if depth > MAX_SPEC_DEPTH:
            raise where.error(node, "", f"nests deeper than {MAX_SPEC_DEPTH} levels")
        open_.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _parse_spec(
    text: str, source: str, base_dir: Path | None, overrides: dict[str, list[Any]], limit: int, sample: int | None
) -> SweepSpec:
    where = _Where(source)
    base = (base_dir or Path.cwd()).resolve()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = f" line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise InputError(f"{source}{line}: not valid YAML ({short(exc.problem)})") from None
    if root is None:
        raise InputError(f"{source}: the spec is empty; see experiments/README.md for the format")
    _check_nodes(root, where)
    top = {k: (kn, vn) for k, kn, vn in _mapping_items(root, where, "")}
    for key, (key_node, _) in top.items():
        if key not in TOP_KEYS:
            raise where.error(key_node, key, f"unknown section; known sections: {', '.join(TOP_KEYS)}")
    if "version" in top:
        version = _construct(top["version"][1])
        if version != SPEC_VERSION:
            raise where.error(top["version"][1], "version", f"must be {SPEC_VERSION}, not {short(version)}")
    name = str(_construct(top["name"][1])) if "name" in top else Path(source).stem
    description = str(_construct(top["description"][1])) if "description" in top else ""

    defaults: dict[str, Any] = {}
    if "defaults" in top:
        (defaults,) = _config_mapping(where, top["defaults"][1], "defaults", base, expand=False)

    sources: list[tuple[Iterable[dict[str, Any]], yaml.Node]] = []  # rows, lazily for the grid
    size = 0
    if "grid" in top:
        size, grid_rows = _grid(where, top["grid"][1], base, overrides, limit)
        sources.append((grid_rows, top["grid"][1]))
    if "include" in top:
        for i, item in enumerate(_seq(top["include"][1])):
            rows = _apply_overrides(
                _config_mapping(where, item, f"include[{i}]", base, expand=True, limit=limit), overrides, limit
            )
            size += len(rows)
            sources.append((rows, item))
            _check_count(size, limit, where, item, f"include[{i}] (with the grid and the entries before)")
    if not size:
        raise InputError(f"{source}: no configurations: give a 'grid' or an 'include' section")
    bases = ((row, node) for rows, node in sources for row in rows)

    excludes: list[dict[str, list[Any]]] = []
    if "exclude" in top:
        for i, item in enumerate(_seq(top["exclude"][1])):
            rule: dict[str, list[Any]] = {}
            for key, key_node, value_node in _mapping_items(item, where, f"exclude[{i}]"):
                p = f"exclude[{i}].{key}"
                rule[key] = [_field_value(where, key, key_node, v, p, base) for v in _seq(value_node)]
            excludes.append(rule)

    configs: dict[str, RunConfig] = {}
    duplicates = 0
    stopped = False  # a dry run's sample is full and rows are left
    for row, node in bases:
        if sample is not None and len(configs) >= sample:
            stopped = True
            break
        flat = {**defaults, **row}
        if any(_matches(flat, rule) for rule in excludes):
            continue
        try:
            cfg = build_config(flat)
        except InputError as exc:
            raise where.error(node, "", f"configuration {short(flat)} is invalid: {exc}") from None
        h = cfg.config_hash()
        if h in configs:
            duplicates += 1
        else:
            configs[h] = cfg
    if not configs:
        raise InputError(f"{source}: every configuration is excluded; nothing to run")
    slurm = _parse_slurm(where, top["slurm"][1]) if "slurm" in top else SlurmOptions()
    return SweepSpec(
        name=name,
        configs=tuple(configs.values()),
        slurm=slurm,
        description=description,
        source=source,
        duplicates=duplicates,
        size=size,
        sampled=stopped,
    )


def _grid(
    where: _Where,
    node: yaml.Node,
    base: Path,
    overrides: dict[str, list[Any]] | None = None,
    limit: int = DEFAULT_MAX_CONFIGS,
) -> tuple[int, Iterator[dict[str, Any]]]:
    """The grid's size and its rows, lazily (a product is never expanded ahead): each axis is a list; ``workload``
    items may be mappings bundling fields (batch size...). ``overrides`` replace (or add) axes; see the module
    docstring.
    """
    overrides = overrides or {}
    axes: list[list[dict[str, Any]]] = []
    for key, key_node, value_node in _mapping_items(node, where, "grid"):
        p = _join("grid", key)
        if not _is_field(key):
            raise _unknown_field(where, key_node, p)
        choices: list[dict[str, Any]] = []
        for i, item in enumerate(_seq(value_node)):
            if key == "workload" and isinstance(item, yaml.MappingNode):
                (bundle,) = _config_mapping(where, item, f"{p}[{i}]", base, expand=False)
                if "workload" not in bundle:
                    raise where.error(item, f"{p}[{i}]", "a workload entry given as a mapping needs 'workload:'")
                choices.append(bundle)
            else:
                choices.append({key: _field_value(where, key, key_node, item, p, base)})
        if not choices:
            raise where.error(value_node, p, "an empty list selects nothing; remove the axis or give values")
        if key in overrides:
            bundles = {c["workload"]: c for c in choices} if key == "workload" else {}
            choices = [bundles.get(v, {key: v}) for v in overrides[key]]
        axes.append(choices)
    grid_keys = {k for k, _, _ in _mapping_items(node, where, "grid")}
    axes.extend([{k: v} for v in vals] for k, vals in overrides.items() if k not in grid_keys)
    size = math.prod(len(a) for a in axes)
    _check_count(size, limit, where, node, "grid")

    def rows() -> Iterator[dict[str, Any]]:
        for combo in itertools.product(*axes):
            row: dict[str, Any] = {}
            for part in combo:
                row.update(part)
            yield row

    return size, rows()
