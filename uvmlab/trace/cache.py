"""On-disk cache of captured traces, so sweeps and runs capture each workload once.

Location: ``$UVMLAB_CACHE/traces/<key>`` if ``UVMLAB_CACHE`` is set, else ``$XDG_CACHE_HOME/uvmlab/traces/<key>``
(``~/.cache/uvmlab/traces/<key>`` without XDG_CACHE_HOME).
The key is a stable hash of the WorkloadConfig, the capture device, the torch version, the uvmlab trace schema
version, ``CAPTURE_VERSION`` (bumped when capture's rules change) and the workload's identity
(``workloads.registry.workload_identity``: for user workload files, the resolved path and SHA-256; for named
models, the defining package's version). Entries are written to a temporary folder and renamed into place,
so a killed capture leaves no entry; an entry that cannot be read (corrupt, truncated, older schema) is
captured again and replaced, with a one-line warning. One writer per entry: a miss takes ``<key>.lock``
(filelock) and checks again, so concurrent processes asking for one uncached configuration capture it once
(the others wait and then read it).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uvmlab import SCHEMA_VERSION
from uvmlab.config import WorkloadConfig
from uvmlab.trace.schema import Trace, read_trace, write_trace

ProgressFn = Callable[[int, int], None]
CAPTURE_VERSION = 9
"""Version of the capture rules (recorder, categories, emulation); part of the cache key.
2: dropout keeps CUDA's 1-byte mask, data-dependent ops emulated, named models, parameters registered on meta.
3: kernels carry what the CUDA kernel allocates inside itself (``temporaries``, uvmlab.trace.internal_rules).
4: the header's parameter map (uvmlab.trace.param_map), LoRA/QLoRA (workloads.peft_adapt).
5: a kernel's temporaries made under ``uvm.prefetch_new_allocations`` are marked, and prefetched like the outputs.
6: data-dependent scalars from CPU values of the seeded inputs (uvmlab.trace.known_values), ``--dtype auto``
(the header's ``compute_dtype``), fewer layers that keep every kind of layer (workloads.hf_config).
7: in-place and ``out=`` GEMMs counted as GEMMs (uvmlab.trace.flops), the kernel ``dtype`` column recorded.
8: a 2-D GEMM's operand layouts (the kernel ``layout`` column, uvmlab.sim.uvm.tile_order).
9: the ``layout`` of batched GEMMs (``bmm``, ``baddbmm``) too."""


def cache_root() -> Path:
    """The folder holding cached traces: ``$UVMLAB_CACHE``, else the XDG cache folder (``$XDG_CACHE_HOME``, else
    ``~/.cache``) + ``uvmlab`` (what platformdirs.user_cache_dir gives on Linux, without the dependency)."""
    env = os.environ.get("UVMLAB_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(env).expanduser() if env else (Path(xdg) if xdg else Path.home() / ".cache") / "uvmlab"
    return base / "traces"


def cache_key(cfg: WorkloadConfig, device: str = "meta", emulate_cuda: bool = True) -> str:
    """Stable hash naming the cache entry of ``cfg`` captured on ``device``.

    Cheap: imports neither torch nor the workload (``workloads.registry.workload_identity``): a user file is
    keyed by its resolved path and content hash, so a warm hit never imports it and the same file named by
    another path hits the same entry. Built-ins and named models are keyed by their resolved batch size and
    options (``--seq-len 2048`` and the default 2048 share an entry); a user file by the options as given.
    """
    from workloads.registry import is_path, load_workload, workload_identity

    identity = workload_identity(cfg.workload)
    config = {**cfg.to_dict(), "workload": identity["workload"]}
    if not is_path(cfg.workload):  # built-ins and named models: specs are cheap, so key on what is built
        spec = load_workload(cfg.workload)
        common = {k: v for k, v in cfg.options.items() if k not in spec.options}
        config.update(batch_size=spec.batch_size(cfg), options={**spec.resolve_options(cfg), **common})
    blob = {
        "config": config,
        "identity": identity,
        "device": device,
        "emulate_cuda": emulate_cuda,
        "torch": _torch_version(),
        "schema": SCHEMA_VERSION,
        "capture": CAPTURE_VERSION,
    }
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _torch_version() -> str:
    """The installed torch version from its package metadata, without importing torch (~5 s on a cold start)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


LOCK_TIMEOUT_S = 3600.0
"""How long a process waits for another one capturing the same entry (a large workload captures in minutes)."""


def _read_valid(entry: Path) -> Trace | None:
    """The entry's trace, or None if absent; a bad entry (also a file or link where a folder belongs) is removed
    with a one-line warning, then captured again."""
    if not entry.exists() and not entry.is_symlink():
        return None
    try:
        if entry.is_symlink() or not entry.is_dir():
            raise ValueError("it is not a folder")
        return read_trace(entry)
    except Exception as exc:  # any damage (InputError, a malformed header, ...) means "rebuild"
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        _warn_line(f"uvmlab: warning: trace cache entry {entry} is unreadable ({reason}); capturing it again")
        _remove_entry(entry)
        return None


def _remove_entry(entry: Path) -> None:
    """Remove a cache entry: a folder with what it holds, or a file or link in its place (the link itself)."""
    if entry.is_symlink() or (entry.exists() and not entry.is_dir()):
        with contextlib.suppress(OSError):
            entry.unlink()
    else:
        shutil.rmtree(entry, ignore_errors=True)


def _warn_line(message: str) -> None:
    import sys

    print(message, file=sys.stderr)


def get_trace(
    cfg: WorkloadConfig, device: str = "meta", emulate_cuda: bool = True, progress: ProgressFn | None = None
) -> Trace:
    """The trace of ``cfg`` from the cache, capturing (and storing) it if absent or unreadable.

    A data-parallel job (``cfg.shard``) is its single-GPU capture (cached once for every world size) made into one
    rank's trace by ``uvmlab.trace.shard.job_trace``."""
    from uvmlab.trace.shard import job_trace

    return job_trace(cfg, _single_gpu_trace(cfg.single_gpu, device, emulate_cuda, progress))


def _single_gpu_trace(cfg: WorkloadConfig, device: str, emulate_cuda: bool, progress: ProgressFn | None) -> Trace:
    """The cached capture of the single-GPU job ``cfg``, captured and stored if absent or unreadable."""
    entry = cache_root() / cache_key(cfg, device, emulate_cuda)
    trace = _read_valid(entry)
    if trace is not None:
        return trace
    lock = _entry_lock(entry)
    with lock if lock is not None else contextlib.nullcontext():
        trace = _read_valid(entry)  # another process may have captured it while we waited
        if trace is not None:
            return trace
        from uvmlab.trace.capture import capture_trace  # imports torch: only on a cache miss

        trace = capture_trace(cfg, device=device, progress=progress, emulate_cuda=emulate_cuda)
        try:
            _store(trace, entry)
        except OSError as exc:  # caching is an optimization: an unwritable cache must not fail the run
            reason = exc.strerror or type(exc).__name__
            _warn_line(
                f"uvmlab: warning: trace cache {entry.parent} is not writable ({reason}); the trace was not cached"
            )
    return trace


def _entry_lock(entry: Path) -> Any:
    """The filelock of a cache entry (``<key>.lock`` beside it), or None if the cache folder is not writable."""
    from filelock import FileLock

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return FileLock(str(entry.parent / f"{entry.name}.lock"), timeout=LOCK_TIMEOUT_S)


def _store(trace: Trace, entry: Path) -> None:
    """Write ``trace`` into a temporary folder next to ``entry`` and rename it into place."""
    if entry.exists() or entry.is_symlink():
        _remove_entry(entry)  # an incomplete entry (no trace.json), or a file in its place
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        write_trace(trace, tmp, durable=False)  # the folder is renamed into place below: that is the atomic step
        # another process may have stored the same entry first (a non-empty folder cannot be replaced)
        with contextlib.suppress(OSError):
            os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
