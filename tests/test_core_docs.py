"""The README stays true: its commands exist, its test command is what CI runs, its links resolve."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from uvmlab.cli import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _readme_commands() -> list[list[str]]:
    """Every `uvmlab ...` invocation inside fenced code blocks (one per line, after any `&&`)."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.strip().removeprefix("$ ")
                if part.startswith("uvmlab "):
                    commands.append(shlex.split(part.split(" #")[0]))
    return commands


def test_readme_has_the_main_command() -> None:
    assert "uvmlab run gpt2 --oversub 4 --pca off" in README


@pytest.mark.parametrize("argv", _readme_commands(), ids=lambda a: " ".join(a[:3]))
def test_every_readme_command_exists(argv: list[str]) -> None:
    # walk down the words until --help is accepted by a real (sub)command
    words = [w for w in argv[1:] if not w.startswith("-")]
    for n in range(min(len(words), 2), -1, -1):
        if main([*words[:n], "--help"]) == 0:
            assert n > 0, f"README command {argv} names no uvmlab subcommand"
            return
    pytest.fail(f"README command {argv} does not parse")


def test_ci_runs_the_readme_test_command() -> None:
    m = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```", README, flags=re.S)
    assert m, "README must mark its test command with <!-- test-command -->"
    quickstart_tail = m.group(1).split("&& ", 3)[-1]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.strip() == quickstart_tail.strip(), "the last line of .ci/run must be the README's test command"


def test_installs_go_through_the_lock() -> None:
    """CI and both README commands install with ``-c constraints.txt``, and the lock pins every package exactly."""
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-c constraints\.txt -e '\.\[test\]'", ci)
    quickstart = README.split("## Quickstart", 1)[1].split("## ", 1)[0]
    installs = re.findall(r"pip install [^&\n]*", quickstart)
    assert len(installs) >= 2 and all("-c constraints.txt" in i for i in installs[:2])
    lock = [ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lock and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s=]+", ln) for ln in lock)
    names = {ln.split("==")[0].lower() for ln in lock}
    assert {"torch", "transformers", "numpy", "pandas", "pytest", "hypothesis", "pytest-timeout"} <= names


def test_relative_links_resolve() -> None:
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def test_cli_reference_is_current() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_cli_docs.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
