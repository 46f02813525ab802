"""The one exception hierarchy of uvmlab; the exit code travels with the exception.

Library code raises these; only ``uvmlab.cli`` catches them and prints one sentence.
Genuine bugs are not caught and still show a traceback.
"""

from __future__ import annotations


class UvmlabError(Exception):
    """A valid request that failed while running (exit code 1)."""

    exit_code = 1


class InputError(UvmlabError):
    """Bad user input: unknown workload, malformed file, impossible factor (exit code 2)."""

    exit_code = 2


class OutputError(UvmlabError):
    """An output that could not be written: a full disk, a read-only file system, an I/O error (exit code 2).

    Raised by the atomic writer (uvmlab.files.atomic) with one sentence naming the file; nothing partial is left."""

    exit_code = 2


class UnavailableError(UvmlabError):
    """A mode or tool this machine does not have, e.g. ``--mode gpu`` without a GPU (exit code 2)."""

    exit_code = 2


class OutOfMemoryError(UvmlabError):
    """A simulated (or real) device allocation did not fit (exit code 1)."""

    exit_code = 1


class SimulationStalledError(UvmlabError):
    """A simulator loop stopped making progress (a bug in uvmlab's model, never a property of the workload)."""

    exit_code = 3


class InvariantError(UvmlabError):
    """A simulator's internal state broke one of its documented invariants (a bug in uvmlab)."""

    exit_code = 3
