"""``python -m uvmlab``."""

from uvmlab.cli import entry

entry()
