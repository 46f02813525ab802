"""Read a GPU description file (``--gpu FILE.json``): a GPU that is not in uvmlab's list.

The file holds the keys of ``uvmlab.gpus.SPEC_KEYS`` (every number a simulated run uses: memory, bandwidth, FLOP/s,
SMs, link, driver...), starting from the listed GPU named by ``base`` (default A100-80GB) for the keys it leaves
out. Example (docs/examples/gpus/rtx4060ti.json)::

    {"name": "RTX4060Ti", "base": "RTX4060", "memory": "16GiB", "hbm_bytes_per_s": "288GB/s",
     "fp32_flops": "22.1TFLOPS", "tensor_flops": "88.4TFLOPS", "sm_count": 34, "link": "PCIe 4.0 x8"}

A file that cannot be read or parsed is an InputError (one sentence); unknown keys and bad values are refused by
``uvmlab.gpus.custom_gpu``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.files.inputs import parse_options, read_json_file
from uvmlab.gpus import DEFAULT_GPU

MAX_GPU_FILE_BYTES = 1024 * 1024
"""Largest GPU file read (1 MiB; a description is a few hundred bytes)."""
GPU_FILE_SUFFIXES = (".json",)


def is_gpu_file(value: str) -> bool:
    """``--gpu`` names a file (a path ending in .json) rather than a listed GPU."""
    return value.lower().endswith(GPU_FILE_SUFFIXES)


def read_gpu_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The fields of a GPU file, with ``base`` set (default: ``uvmlab.gpus.DEFAULT_GPU``)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"GPU file {p} not found; give a listed GPU (uvmlab gpus) or a .json description")
    doc = read_json_file(p, MAX_GPU_FILE_BYTES, "a GPU file (JSON)")  # numbers checked (uvmlab.numbers)
    if not isinstance(doc, dict):
        raise InputError(f"GPU file {p} must hold a mapping of keys to values (uvmlab.gpus.SPEC_KEYS)")
    return {"base": DEFAULT_GPU, **doc}


def parse_gpu_sets(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--gpu-set KEY=VALUE`` pairs: a JSON value (number, true/false, quoted text) or else the text as given, with
    every ``--option`` limit (:func:`uvmlab.files.inputs.parse_options`: depth, size, numbers checked)."""
    return parse_options(tuple(items), "--gpu-set")


def resolve_gpu(gpu: str, sets: tuple[str, ...] | list[str] = ()) -> tuple[str, dict[str, Any]]:
    """(the listed GPU to start from, the GPU fields) of ``--gpu VALUE`` and ``--gpu-set`` items: a file's fields
    (its ``base`` as the listed GPU), then the ``--gpu-set`` ones over them."""
    spec = read_gpu_file(gpu) if is_gpu_file(gpu) else {}
    spec.update(parse_gpu_sets(sets))
    base = str(spec.get("base", gpu)) if spec else gpu
    return base, spec


__all__ = ["is_gpu_file", "parse_gpu_sets", "read_gpu_file", "resolve_gpu"]
