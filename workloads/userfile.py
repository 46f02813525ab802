"""Load a user workload from a Python file (``uvmlab trace ./my_workload.py``).

The file defines (see docs/workloads.md and docs/examples/tiny_mlp.py)::

    DEFAULT_BATCH_SIZE = 64                 # optional, default 1
    OPTIONS = {"hidden": 512}               # optional: the --option keys it accepts, with defaults
    DESCRIPTION = "a tiny MLP"              # optional, default: the module docstring's first line

    def build(cfg, device, options):        # or build(cfg, device)
        ...
        return Workload(name, model, make_batch, loss_fn, torch.device(device))

``cfg`` is the WorkloadConfig with ``batch_size`` resolved (the configured one, else ``DEFAULT_BATCH_SIZE``),
``device`` the device to build the model on, ``options`` OPTIONS merged with ``cfg.options`` (unknown keys are
refused before build runs).

A file that fails while it is imported, while ``build`` runs or while its model trains (trace capture) is an
input error: one sentence naming the file, the phase and the exception (:func:`failure`), exit 2.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError, UvmlabError
from uvmlab.files.inputs import read_input_bytes
from workloads.base import Workload, WorkloadSpec

MAX_MESSAGE = 300
"""Longest exception message quoted in a failure sentence (characters)."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""Largest workload file read (16 MiB; the examples are a few KB): a file is read only if it is a regular file."""


def _existing(path: str | Path) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"workload file {file} does not exist; give a built-in name (uvmlab workloads) or a .py file")
    return file


def file_identity(path: str | Path) -> dict[str, str]:
    """The resolved path and SHA-256 of the file at ``path`` (reads it; imports nothing)."""
    file = _existing(path)
    return {"path": str(file.resolve()), "sha256": hashlib.sha256(_read(file)).hexdigest()}


def _read(file: Path) -> bytes:
    return read_input_bytes(file, MAX_FILE_BYTES, "a Python workload file")


def failure(what: str, phase: str, exc: BaseException) -> InputError:
    """One sentence: ``what`` failed while ``phase``, with the exception's type and first line (shortened)."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip() if lines else ""
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 3] + "..."
    return InputError(f"{what} failed while {phase}: {type(exc).__name__}" + (f": {text}" if text else ""))


def load_user_workload(path: str | Path) -> WorkloadSpec:
    """Import the workload file at ``path`` and describe it as a WorkloadSpec."""
    file = _existing(path)
    data = _read(file)
    digest = hashlib.sha256(data).hexdigest()
    mod_name = f"uvmlab_user_workload_{digest[:16]}"
    module = sys.modules.get(mod_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(mod_name, file)
        if spec is None or spec.loader is None:
            raise InputError(f"cannot import workload file {file}: it is not a Python module")
        module = importlib.util.module_from_spec(spec)
        bytecode = sys.dont_write_bytecode
        sys.dont_write_bytecode = True  # no __pycache__ beside the user's file: uvmlab writes nothing among inputs
        try:
            spec.loader.exec_module(module)
        except SystemExit as exc:  # the file's own sys.exit(): not a successful run of anything
            raise InputError(f"workload file {file} called sys.exit({exc.code!r}) while being imported") from None
        except Exception as exc:  # anything the user's module raises: one sentence, exit 2
            raise failure(f"workload file {file.resolve()}", "importing it", exc) from None
        finally:
            sys.dont_write_bytecode = bytecode
        sys.modules[mod_name] = module
    build = getattr(module, "build", None)
    program = getattr(module, "program", None)
    if callable(program) and callable(build):
        raise InputError(f"workload file {file} defines both build() and program(); a workload is one or the other")
    if not callable(build) and not callable(program):
        raise InputError(
            f"workload file {file} must define build(cfg, device, options) returning a workloads.base.Workload, "
            "or program(uvm, cfg, options) (docs/workloads.md)"
        )
    options = getattr(module, "OPTIONS", {})
    default_batch = getattr(module, "DEFAULT_BATCH_SIZE", 1)
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise InputError(f"workload file {file}: OPTIONS must be a dict of option name -> default value")
    if isinstance(default_batch, bool) or not isinstance(default_batch, int) or default_batch < 1:
        raise InputError(f"workload file {file}: DEFAULT_BATCH_SIZE must be a whole number >= 1")
    description = getattr(module, "DESCRIPTION", None) or (module.__doc__ or "").strip().split("\n")[0]
    if callable(program):
        return _program_spec(file, program, options, default_batch, description)
    n_params = len(inspect.signature(build).parameters)

    def build_fn(cfg: Any, device: str, opts: dict[str, Any]) -> Workload:
        try:
            wl = build(cfg, device, opts) if n_params >= 3 else build(cfg, device)
        except UvmlabError:
            raise
        except Exception as exc:
            raise failure(f"workload file {file.resolve()}", "building its model", exc) from None
        if not isinstance(wl, Workload):
            raise InputError(f"workload file {file}: build() returned {type(wl).__name__}, not a Workload")
        return wl

    return WorkloadSpec(
        name=file.stem,
        description=description or f"user workload {file.name}",
        default_batch_size=default_batch,
        build_fn=build_fn,
        options=dict(options),
        source=str(file.resolve()),
    )


def _program_spec(
    file: Path, program: Any, options: dict[str, Any], default_batch: int, description: str
) -> WorkloadSpec:
    """The WorkloadSpec of a workload program (workloads.program): ``build`` refuses, ``program_fn`` runs it."""
    if len(inspect.signature(program).parameters) != 3:
        raise InputError(f"workload file {file}: program must take (uvm, cfg, options)")

    def build_fn(cfg: Any, device: str, opts: dict[str, Any]) -> Workload:
        raise InputError(f"workload file {file} is a program (it defines program(), not build()): it has no model")

    return WorkloadSpec(
        name=file.stem,
        description=description or f"user program {file.name}",
        default_batch_size=default_batch,
        build_fn=build_fn,
        options=dict(options),
        source=str(file.resolve()),
        program_fn=program,
    )
