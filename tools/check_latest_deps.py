"""Install the newest releases pyproject.toml allows into a scratch environment, run the suite, and name the culprit.

Not part of CI (CI installs through constraints.txt, the versions the suite passed with). Run it before refreshing
the lock, or on a schedule, to learn early which new release breaks uvmlab:

    python tools/check_latest_deps.py                 # whole suite (about 15 minutes on 2 cores)
    python tools/check_latest_deps.py -- tests/test_advise_shape.py -k kv_cache    # a subset (pytest arguments)

Steps:
1. a fresh virtual environment under a temporary folder (``--venv`` to keep one), ``pip install --upgrade -e
   '.[test]'`` without the constraints file: each dependency at the newest release its range admits;
2. the versions that differ from constraints.txt, printed as a table;
3. the test suite (or the pytest arguments after ``--``) in that environment;
4. for each failing test, each package that differs from the lock is put back to its locked version alone and the
   failing tests are run again: a package whose downgrade makes a test pass is named as that test's cause (then
   the package is restored). A failure that no single downgrade fixes is reported as "no single package".

Exit code: 0 when the suite passes on the newest releases, 1 when it fails (with the culprits printed), 2 when the
environment could not be built.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "constraints.txt"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


def canonical(name: str) -> str:
    """PEP 503 name normalisation (pip freeze and the lock may spell names differently)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a requirements/constraints text, by canonical name."""
    pins = {}
    for line in text.splitlines():
        m = PIN.match(line.strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, text=True, cwd=REPO, **kw)  # type: ignore[call-overload]


def failed_tests(output: str) -> list[str]:
    """Node ids of failed/errored tests in pytest's ``-rfE`` short summary."""
    return sorted({m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", output, re.M)})


def pytest(python: str, args: list[str]) -> tuple[int, str]:
    proc = run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *args], capture_output=True)
    out = proc.stdout + proc.stderr
    tail = out.strip().splitlines()[-1:] or [""]
    print(tail[0], flush=True)
    return proc.returncode, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="build (or reuse) the scratch environment here")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (after --); default: the whole suite")
    opts = parser.parse_args()
    env_dir = opts.venv or Path(tempfile.mkdtemp(prefix="uvmlab-latest-")) / "venv"
    if not (env_dir / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    if run([python, "-m", "pip", "install", "-q", "--upgrade", "-e", ".[test]"]).returncode:
        print("could not install the newest releases (see pip's message above)", file=sys.stderr)
        return 2
    locked = read_pins(LOCK.read_text())
    newest = read_pins(run([python, "-m", "pip", "freeze"], capture_output=True).stdout)
    changed = {n: (locked.get(n, "(not locked)"), v) for n, v in newest.items() if locked.get(n) != v}
    print(f"\n{len(changed)} of {len(newest)} installed packages differ from {LOCK.name}:")
    for name, (old, new) in sorted(changed.items()):
        print(f"  {name:32s} {old:>16s} -> {new}")
    code, out = pytest(python, opts.pytest_args)
    if code == 0:
        print("\nthe suite passes on the newest releases")
        return 0
    failures = failed_tests(out)
    print(f"\n{len(failures)} test(s) fail on the newest releases:")
    for test in failures:
        print("  " + test)
    if not failures:
        print(out[-3000:])
        return 1
    causes: dict[str, list[str]] = {}
    for name, (old, new) in sorted(changed.items()):
        if old == "(not locked)":
            continue
        if run([python, "-m", "pip", "install", "-q", "--no-deps", f"{name}=={old}"]).returncode:
            continue
        _, again = pytest(python, failures)
        still = set(failed_tests(again))
        for test in failures:
            if test not in still:
                causes.setdefault(test, []).append(f"{name} {new} (passes with {old})")
        run([python, "-m", "pip", "install", "-q", "--no-deps", f"{name}=={new}"])
    print("\nculprits (a package whose locked version alone makes the test pass):")
    for test in failures:
        print(f"  {test}: {', '.join(causes.get(test, ['no single package']))}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
