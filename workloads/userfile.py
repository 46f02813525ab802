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
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from workloads.base import Workload, WorkloadSpec


def load_user_workload(path: str | Path) -> WorkloadSpec:
    """Import the workload file at ``path`` and describe it as a WorkloadSpec."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"workload file {file} does not exist; give a built-in name (uvmlab workloads) or a .py file")
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    mod_name = f"uvmlab_user_workload_{digest[:16]}"
    module = sys.modules.get(mod_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(mod_name, file)
        if spec is None or spec.loader is None:
            raise InputError(f"cannot import workload file {file}: it is not a Python module")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except (SyntaxError, ImportError) as exc:
            raise InputError(f"cannot import workload file {file}: {type(exc).__name__}: {exc}") from None
        except SystemExit as exc:  # the file's own sys.exit(): not a successful run of anything
            raise InputError(f"workload file {file} called sys.exit({exc.code!r}) while being imported") from None
        except Exception as exc:  # the user's code raised: one sentence, not a traceback
            raise InputError(f"workload file {file} raised {type(exc).__name__} while being imported: {exc}") from None
        sys.modules[mod_name] = module
    build = getattr(module, "build", None)
    if not callable(build):
        raise InputError(
            f"workload file {file} must define build(cfg, device, options) returning a workloads.base.Workload"
        )
    options = getattr(module, "OPTIONS", {})
    default_batch = getattr(module, "DEFAULT_BATCH_SIZE", 1)
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise InputError(f"workload file {file}: OPTIONS must be a dict of option name -> default value")
    if isinstance(default_batch, bool) or not isinstance(default_batch, int) or default_batch < 1:
        raise InputError(f"workload file {file}: DEFAULT_BATCH_SIZE must be a whole number >= 1")
    description = getattr(module, "DESCRIPTION", None) or (module.__doc__ or "").strip().split("\n")[0]
    n_params = len(inspect.signature(build).parameters)

    def build_fn(cfg: Any, device: str, opts: dict[str, Any]) -> Workload:
        wl = build(cfg, device, opts) if n_params >= 3 else build(cfg, device)
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
        source_digest=digest,
    )
