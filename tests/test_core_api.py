"""uvmlab.api: every public name resolves to a callable or class, and importing it is torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

from uvmlab import api


@pytest.mark.parametrize("name", api.__all__)
def test_every_api_name_resolves(name: str) -> None:
    assert callable(getattr(api, name))


def test_unknown_name_lists_the_public_ones() -> None:
    with pytest.raises(AttributeError, match="public names"):
        api.no_such_thing  # noqa: B018


def test_import_is_torch_free() -> None:
    code = "import sys, uvmlab.api\nsys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
