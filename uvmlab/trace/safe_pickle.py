"""A restricted unpickler for untrusted files: only plain containers and scalars ever load.

Snapshot pickles come from other people's machines, so ``pickle.load`` is never used on them. Three layers:

1. ``find_class`` refuses EVERY global. In the pickle machine, a callable can only enter the stack through
   ``find_class`` (opcodes GLOBAL, STACK_GLOBAL, INST, and the EXT1/2/4 extension registry all go through it), so
   REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / BUILD have nothing to call: no code of the file's choosing runs.
2. ``persistent_load`` refuses persistent ids (PERSID/BINPERSID), which would otherwise hand control to us.
3. After loading, the object tree is checked: only dict, list, tuple, str, bytes, int, float, bool and None are
   accepted (e.g. a set or bytearray built by protocol-4/5 opcodes is refused too).

Every failure is an :class:`~uvmlab.errors.InputError` with one sentence naming the file and the reason. The
loader is the C unpickler (``pickle.Unpickler`` subclass), so it is fast (0.06 s for a 3.9 MB snapshot).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError

ALLOWED_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))
"""The only Python types a restricted load may produce."""


class RefusedPickleError(pickle.UnpicklingError):
    """The pickle asked for a global or persistent object; it was refused before anything was called."""


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that refuses every global and persistent id (nothing from the file is ever called)."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickleError(f"it asks to import {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickleError("it uses a persistent id (PERSID)")


def _check_tree(obj: Any, max_depth: int = 200) -> None:
    """Raise TypeError if ``obj`` contains anything but plain containers and scalars (iterative walk)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if type(item) not in ALLOWED_TYPES:
            raise TypeError(type(item).__name__)
        if isinstance(item, (dict, list, tuple)):
            if id(item) in seen:  # memo references (shared sub-objects) are fine, visit once
                continue
            seen.add(id(item))
            if depth > max_depth:
                raise TypeError(f"nesting deeper than {max_depth}")
            if isinstance(item, dict):
                for k, v in item.items():
                    stack.append((k, depth + 1))
                    stack.append((v, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in item)


def safe_loads(data: bytes, source: str = "<bytes>") -> Any:
    """Load pickle ``data`` with :class:`RestrictedUnpickler`; raise InputError (one sentence) on any problem."""
    if not data:
        raise InputError(f"{source} is empty (0 bytes); expected a pickle file")
    if data[:1] != b"\x80" and data[:1] not in (b"(", b"]", b"}", b"c", b"l", b"d"):
        raise InputError(f"{source} is not a pickle file (it starts with {data[:8]!r}); expected a snapshot pickle")
    try:
        obj = RestrictedUnpickler(io.BytesIO(data)).load()
    except RefusedPickleError as exc:
        raise InputError(
            f"{source} was refused: {exc}, and uvmlab loads only plain data from untrusted pickles "
            "(nothing in the file was run)"
        ) from None
    except EOFError:
        raise InputError(f"{source} is truncated (the pickle ends early); copy the file again") from None
    except (pickle.UnpicklingError, ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError) as exc:
        text = str(exc)
        if "truncated" in text or "ran out of input" in text.lower():
            raise InputError(f"{source} is truncated (the pickle ends early); copy the file again") from None
        raise InputError(f"{source} is not a readable pickle ({text or type(exc).__name__})") from None
    except (MemoryError, RecursionError):
        raise InputError(f"{source} is too large or too deeply nested to load safely") from None
    try:
        _check_tree(obj)
    except TypeError as exc:
        raise InputError(
            f"{source} was refused: it contains a {exc} object, and uvmlab loads only dict/list/tuple/str/bytes/"
            "int/float/bool/None from untrusted pickles (nothing in the file was run)"
        ) from None
    return obj


def safe_load_file(path: str | Path) -> Any:
    """Read ``path`` and load it with :func:`safe_loads`; a missing or unreadable file is an InputError."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p} does not exist; pass the path of a snapshot pickle") from None
    except IsADirectoryError:
        raise InputError(f"{p} is a directory; pass the path of a snapshot pickle file") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror}") from None
    return safe_loads(data, str(p))
