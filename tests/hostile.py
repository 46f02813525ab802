"""Hostile-input harness: run uvmlab command lines under a memory and a time limit, and check what they left.

Not a test file: a helper the bad-input tests share (issue 42). A probe is a :class:`Probe`: a command line, the
folder it runs in, the folder whose contents must not change (``root``: the probe's surroundings), and the paths
that may change there (``outputs``: the command's output folder or file). :func:`run_probes` runs many probes in
ONE supervisor process whose address space is limited (``RLIMIT_AS``, :data:`MEMORY_LIMIT` = 1 GiB, set before
uvmlab is imported); the supervisor forks one child per probe (so each probe pays no interpreter start and a probe
that hangs or dies cannot take the others with it), and kills a child that runs past :data:`TIME_LIMIT_S` (60 s).
:func:`run_fresh` runs one probe in its own ``python -m uvmlab`` process under the same limits, for contracts that
need a whole process (signals, exit codes set by the interpreter).

Every probe's ``root`` is hashed before and after (files by SHA-256, folders, links by target and FIFOs, devices
and sockets by kind, never opened), so :func:`assert_refused` can say that nothing outside the outputs changed.

    probes = [Probe("fifo-as-csv", ["calibrate", "--memory", str(fifo), "-o", str(out)], cwd=d, root=d,
                    outputs=(out,))]
    for outcome in run_probes(probes).values():
        assert_refused(outcome, words="regular file")
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UVMLAB_ROOT = Path(os.environ.get("HOSTILE_UVMLAB_ROOT", REPO))
"""The checkout whose uvmlab the probes run (``HOSTILE_UVMLAB_ROOT``: e.g. an export of main, to see the probes
fail on the code before a fix); the test helpers always come from this checkout's tests/."""
MEMORY_LIMIT = 1 << 30
"""Address space of every probe (``RLIMIT_AS``): 1 GiB (issue 42's acceptance)."""
TIME_LIMIT_S = 60.0
"""Wall-clock limit of every probe: a child still running after it is killed (outcome code ``"timeout"``)."""
MAX_LINE_CHARS = 500
"""Longest error line a refusal may print (a bounded sentence, never a 5,000-character value)."""
PREFIX = "uvmlab: error: "
LARGE_FILE_BYTES = 64 << 20
"""Files above this size (the sparse 1 GB probes) are identified by their first and last MiB, size, modification and
change times and inode instead of a full hash (any write changes the times)."""


@dataclass(frozen=True)
class Probe:
    """One command line to run under the limits.

    ``root``: the probe's surroundings, hashed before and after (everything under it but ``outputs`` must stay the
    same). ``outputs``: paths under ``root`` the command may create or change (its output folder or files).
    ``env``: variables set for this probe only.
    """

    name: str
    argv: Sequence[str]
    cwd: Path
    root: Path
    outputs: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a probe did: exit code (an int, ``"timeout"``, or ``"raised TYPE: ..."`` for an exception that escaped
    ``uvmlab.cli.main``), its output, wall time, and the paths outside its outputs that changed."""

    name: str
    code: int | str
    stdout: str
    stderr: str
    seconds: float
    changed: list[str]

    @property
    def lines(self) -> list[str]:
        """The non-empty stderr lines."""
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def describe(self) -> str:
        """A short account for an assertion message."""
        tail = self.stderr[-800:]
        return f"{self.name}: code {self.code!r} after {self.seconds:.1f} s; changed {self.changed[:5]}; stderr: {tail}"


def _entry(p: Path) -> str:
    """The identity of one directory entry, without following links or opening anything but a regular file."""
    st = p.lstat()
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "link:" + os.readlink(p)
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            if st.st_size <= LARGE_FILE_BYTES:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            else:  # a large (often sparse) probe file: its ends, and what any write changes (size, times, inode)
                h.update(fh.read(1 << 20))
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read(1 << 20))
                h.update(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}".encode())
        return h.hexdigest()
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return f"special:{stat.S_IFMT(mode):o}"


def tree_hashes(root: Path, skip: Iterable[Path] = ()) -> dict[str, str]:
    """Every entry under ``root`` (links not followed, special files never opened) by relative name: regular files
    by SHA-256, folders, links (by target), FIFOs, sockets and devices by kind. Entries at or under a path in ``skip``
    are left out."""
    root = Path(root)
    skipped = {os.path.abspath(s) for s in skip}
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        keep = []
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if os.path.abspath(p) in skipped:
                continue
            out[str(p.relative_to(root))] = _entry(p)
            if name in dirnames and not p.is_symlink():
                keep.append(name)
        dirnames[:] = keep
    return out


def changed_entries(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Names added, removed or changed between two :func:`tree_hashes`."""
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


def _skips(probe: Probe) -> list[Path]:
    return [Path(o) if Path(o).is_absolute() else probe.cwd / o for o in probe.outputs]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    paths = [str(UVMLAB_ROOT), str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "NO_COLOR": "1", **(extra or {})}


def run_probes(
    probes: Sequence[Probe], limit_bytes: int = MEMORY_LIMIT, timeout_s: float = TIME_LIMIT_S
) -> dict[str, Outcome]:
    """Run every probe in one supervisor process under ``RLIMIT_AS = limit_bytes``, one forked child per probe,
    each killed after ``timeout_s``; return {name: Outcome} with the changes outside each probe's outputs."""
    names = [p.name for p in probes]
    assert len(set(names)) == len(names), "probe names must be unique"
    before = {p.name: tree_hashes(p.root, _skips(p)) for p in probes}
    jobs = [{"name": p.name, "argv": [str(a) for a in p.argv], "cwd": str(p.cwd), "env": dict(p.env)} for p in probes]
    with tempfile.TemporaryDirectory(prefix="hostile-") as work:
        request = Path(work) / "probes.json"
        request.write_text(json.dumps({"limit": limit_bytes, "timeout": timeout_s, "work": work, "probes": jobs}))
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(request)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s * len(probes) + 120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the hostile-probe supervisor failed ({proc.returncode}): {proc.stderr[-3000:]}")
        results = json.loads((Path(work) / "results.json").read_text())
    out = {}
    for p in probes:
        r = results[p.name]
        changed = changed_entries(before[p.name], tree_hashes(p.root, _skips(p)))
        out[p.name] = Outcome(p.name, r["code"], r["stdout"], r["stderr"], r["seconds"], changed)
    return out


def run_fresh(probe: Probe, limit_bytes: int = MEMORY_LIMIT, timeout_s: float = TIME_LIMIT_S) -> Outcome:
    """Run one probe as its own ``python -m uvmlab`` process under the same limits (a whole interpreter)."""
    before = tree_hashes(probe.root, _skips(probe))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "uvmlab", *map(str, probe.argv)],
            cwd=probe.cwd,
            env=_env(probe.env),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            preexec_fn=limit,
        )
        code: int | str = proc.returncode
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        stdout = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
    seconds = time.monotonic() - start
    changed = changed_entries(before, tree_hashes(probe.root, _skips(probe)))
    return Outcome(probe.name, code, stdout, stderr, seconds, changed)


def assert_refused(outcome: Outcome, words: str | Sequence[str] = (), max_chars: int = MAX_LINE_CHARS) -> str:
    """Assert the issue-42 contract: exit 2, exactly one stderr line ``uvmlab: error: ...`` of at most
    ``max_chars`` characters (containing each of ``words``), no traceback, and nothing outside the probe's outputs
    changed. Return the line."""
    lines = outcome.lines
    assert outcome.code == 2, outcome.describe()
    assert "Traceback" not in outcome.stderr, outcome.describe()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), outcome.describe()
    assert len(lines[0]) <= max_chars, f"{outcome.name}: a {len(lines[0]):,}-character line: {lines[0][:300]}..."
    for w in [words] if isinstance(words, str) else words:
        assert w in lines[0], f"{outcome.name}: {w!r} not in: {lines[0]}"
    assert not outcome.changed, f"{outcome.name}: changed outside its outputs: {outcome.changed[:10]}"
    return lines[0]


def assert_all(checks: dict[str, Callable[[], object]]) -> None:
    """Run every check (a case name -> a callable that asserts) and fail once, listing every case that failed: one
    test per matrix, so a parallel test run never runs a matrix's probes twice."""
    failures = []
    for name, check in checks.items():
        try:
            check()
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0][:400]}")
    assert not failures, f"{len(failures)} of {len(checks)} cases failed:\n" + "\n".join(failures[:40])


def make_fifo(path: Path) -> Path:
    """A named pipe at ``path`` with no writer (opening it for reading blocks a careless reader forever)."""
    os.mkfifo(path)
    return path


def link_to_urandom(path: Path) -> Path:
    """A symbolic link at ``path`` to ``/dev/urandom`` (endless bytes, reported size 0)."""
    path.symlink_to("/dev/urandom")
    return path


# -- the supervisor (this file run as a script) -------------------------------------------------------------------


def _child(job: dict, out_path: str, err_path: str) -> None:
    """In a forked child: redirect fds 1 and 2, run the command line in-process, exit with its code."""
    code: object = 99
    try:
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        from uvmlab.cli import main

        code = main(job["argv"])
    except BaseException as exc:  # escaped uvmlab.cli.main: reported as such, the test fails on it
        import traceback

        with contextlib.suppress(Exception):
            sys.stderr.write(traceback.format_exc())
        with contextlib.suppress(Exception):
            Path(out_path + ".raised").write_text(f"raised {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 99)


def _read(path: str, limit: int = 200_000) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if len(data) <= limit else text[:limit] + "...(cut)"


def _supervise(request: Path) -> int:
    spec = json.loads(request.read_text())
    limit, timeout, work = int(spec["limit"]), float(spec["timeout"]), spec["work"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import uvmlab.cli  # noqa: F401  (imported once, under the limit; every child shares it)

    results = {}
    for i, job in enumerate(spec["probes"]):
        out_path, err_path = os.path.join(work, f"{i}.out"), os.path.join(work, f"{i}.err")
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(job, out_path, err_path)
        code: int | str = "timeout"
        while time.monotonic() - start < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            select.select([], [], [], 0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        seconds = time.monotonic() - start
        raised = _read(out_path + ".raised")
        results[job["name"]] = {
            "code": raised or code,
            "stdout": _read(out_path),
            "stderr": _read(err_path),
            "seconds": seconds,
        }
    Path(work, "results.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_supervise(Path(sys.argv[1])))
