"""Installed package versions, read from their metadata without importing them (workload identities, notes)."""

from __future__ import annotations

import importlib.metadata


def package_version(name: str) -> str:
    """The installed version of package ``name`` from its metadata (no import), or ``none``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"
