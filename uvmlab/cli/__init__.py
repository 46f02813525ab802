"""The ``uvmlab`` command line: a thin registry of small commands (logic lives in uvmlab.api and below).

Each ``uvmlab/cli/*_cmds.py`` module exports ``COMMANDS``, a list of click commands or groups; they are
registered here in one place. Command modules import heavy libraries (torch, matplotlib) inside the command
function, so ``uvmlab --help`` stays fast. Errors: library code raises ``UvmlabError`` subclasses; ``main``
prints their one sentence to stderr and exits with the code they carry (2 for bad input).
"""

from __future__ import annotations

import errno
import functools
import importlib
import re
import signal
import sys
import threading
import warnings
from typing import Any

import click

from uvmlab import __version__
from uvmlab.cli.options import check_command_paths
from uvmlab.errors import UvmlabError

COMMAND_MODULES = (
    "trace_cmds",  # trace, trace show, workloads
    "estimate_cmds",  # estimate
    "replay_cmds",  # replay, snapshot
    "run_cmds",  # run
    "nsys_cmds",  # nsys summarize, compare, calibrate
    "sweep_cmds",  # sweep, report
    "gpu_cmds",  # shim, doctor, gpus, collect
    "eval_cmds",  # evaluate, fragmentation, colocate
    "validate_cmds",  # validate
    "advise_cmds",  # advise
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="uvmlab")
def cli() -> None:
    """uvmlab: GPU memory under CUDA Unified Memory oversubscription and PyTorch's caching allocator.

    Simulates on any machine (CPU only) and measures on a real NVIDIA GPU. Main command:

        uvmlab run gpt2 --oversub 4 --pca off
    """


def leaf_commands(group: click.Group = cli) -> list[click.Command]:
    """Every command that runs (groups walked), in registration order."""
    out: list[click.Command] = []
    for command in group.commands.values():
        out += leaf_commands(command) if isinstance(command, click.Group) else [command]
    return out


def _checked(command: click.Command) -> None:
    """Make ``command`` check its paths together before it starts (uvmlab.cli.options.check_command_paths)."""
    callback = command.callback
    if callback is None or getattr(callback, "paths_checked", False):
        return

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        check_command_paths(click.get_current_context())
        return callback(*args, **kwargs)

    run.paths_checked = True  # type: ignore[attr-defined]
    command.callback = run


def _register() -> None:
    from uvmlab.cli.options import harden_numbers

    for name in COMMAND_MODULES:
        module = importlib.import_module(f"uvmlab.cli.{name}")
        for command in module.COMMANDS:
            cli.add_command(command)
    for command in leaf_commands():
        _checked(command)
    harden_numbers(cli)  # every integer / real option of every command: uvmlab.numbers' checks


_register()


MAX_MESSAGE_CHARS = 1000
"""Longest error sentence printed (a message quoting a huge value is cut, never a screenful)."""
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EIO, errno.EDQUOT, errno.EFBIG})
"""OSErrors that are about the disk (full, read-only, failing), never a bug: one sentence even without a path."""


MAX_WORD_CHARS = 300
"""Longest word (a run without spaces: a path, a quoted value) printed whole in an error sentence; a longer one
keeps its first 120 characters and says how long it was."""
MAX_DIGITS_SHOWN = 40
"""Longest run of digits printed whole (an int64 has 19): a value quoted with thousands of digits keeps 20."""
_LONG_DIGITS = re.compile(rf"\d{{{MAX_DIGITS_SHOWN + 1},}}")
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1},}}")


def _one_line(text: str) -> str:
    """``text`` as one line of at most MAX_MESSAGE_CHARS, huge numbers and words cut (the last guard: the checks of
    uvmlab.numbers and uvmlab.files.inputs.short quote short prefixes already)."""
    text = " ".join(text.split())
    text = _LONG_DIGITS.sub(lambda m: f"{m.group()[:20]}... ({len(m.group()):,} digits)", text)
    text = _LONG_WORD.sub(lambda m: f"{m.group()[:120]}... ({len(m.group()):,} characters)", text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _show_warning(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
    """``warnings.showwarning`` for the CLI: one line on stderr, no file name or source line."""
    click.echo(_one_line(f"uvmlab: warning: {message} ({category.__name__})"), err=True)


class Terminated(BaseException):
    """SIGTERM arrived (raised by the CLI's handler, so that every ``with``/``finally`` of the command unwinds:
    the run directory's lock is released, the atomic writer removes its temporary, and the completeness file
    written last is never written)."""


TERMINATED_EXIT = 128 + signal.SIGTERM
"""Exit code of a command stopped by SIGTERM (143, the shell's code for it; sweeps count it as interrupted)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and with sys.exit, exit with) the command's exit code. SIGTERM stops the command with
    exit code 143 and one line, after its cleanup (nothing it was writing is left looking complete)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _main(argv)
    except Terminated:
        click.echo("uvmlab: terminated (SIGTERM): the command stopped; what it was writing is not complete", err=True)
        return TERMINATED_EXIT
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    try:
        cli.main(args=argv, prog_name="uvmlab", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.UsageError as exc:  # usage errors: one line, exit code 2
        where = exc.ctx.command_path if exc.ctx is not None else "uvmlab"
        click.echo(_one_line(f"uvmlab: error: {exc.format_message()} (see: {where} --help)"), err=True)
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(_one_line(f"uvmlab: error: {exc.format_message()}"), err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except UvmlabError as exc:
        click.echo(_one_line(f"uvmlab: error: {exc}"), err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.filename is None and exc.errno not in OUTPUT_ERRNOS:
            raise  # not about a path the user named nor the disk: a bug, keep the traceback
        from uvmlab.files.owned import os_error_sentence

        click.echo(_one_line(f"uvmlab: error: {os_error_sentence(exc, 'use')}"), err=True)
        return 2
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
