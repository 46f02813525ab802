"""Run uvmlab command lines in ONE process under an address-space limit (``resource.setrlimit(RLIMIT_AS)``).

Usage: ``python tests/badinput_memory.py LIMIT_BYTES < cases.json``, where cases.json is ``[[name, argv, cwd], ...]``.
Each command runs in-process (``uvmlab.cli.main``) with its stdout and stderr captured; one JSON object is printed:
``{name: {"code": exit code or "raised TYPE: ...", "stderr": ...}}``. The limit is set before uvmlab is imported,
so a probe that would allocate past it fails here (a MemoryError or an import that cannot map) instead of taking
the machine's memory: ``tests/test_badinput_cli.py::test_untrusted_formats_stay_below_the_memory_limit``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys


def main() -> int:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cases = json.load(sys.stdin)
    from uvmlab.cli import main as cli

    results = {}
    for name, argv, cwd in cases:
        err = io.StringIO()
        here = os.getcwd()
        os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code: object = cli(argv)
            except BaseException as exc:  # reported to the test, which fails on it
                code = f"raised {type(exc).__name__}: {str(exc)[:300]}"
        os.chdir(here)
        results[name] = {"code": code, "stderr": err.getvalue()[-4000:]}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
