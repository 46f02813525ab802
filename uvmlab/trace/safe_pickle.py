"""A restricted unpickler for untrusted files: only plain containers and scalars ever load.

Snapshot pickles come from other people's machines, so ``pickle.load`` is never used on them. Three layers:

1. ``find_class`` refuses EVERY global. In the pickle machine, a callable can only enter the stack through
   ``find_class`` (opcodes GLOBAL, STACK_GLOBAL, INST, and the EXT1/2/4 extension registry all go through it), so
   REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / BUILD have nothing to call: no code of the file's choosing runs.
2. ``persistent_load`` refuses persistent ids (PERSID/BINPERSID), which would otherwise hand control to us.
3. After loading, the object tree is checked: only dict, list, tuple, str, bytes, int, float, bool and None are
   accepted (e.g. a set or bytearray built by protocol-4/5 opcodes is refused too).
4. Limits, counted before anything is expanded: a pickle's memo lets one small object be referenced many times
   (a 400 KB file can name a list of 200,000 events 500 times), so the EXPANDED size is computed (every use of a
   shared object counts again, memoized per object so the count itself costs one visit per distinct object) and
   refused above :data:`MAX_EXPANDED_OBJECTS`; a cycle (infinite expansion), nesting deeper than
   :data:`MAX_DEPTH`, a str/bytes over :data:`MAX_STRING_BYTES` or an int over :data:`MAX_INT_BITS` bits are
   refused too. Snapshot-level limits (devices, events, segments, blocks) live in :mod:`uvmlab.trace.snapshot`.

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
MAX_EXPANDED_OBJECTS = 50_000_000
"""Objects an untrusted pickle may expand to (shared references counted at every use). The largest count among
the real snapshots in ../shared/real-data/snapshots is 7,214,581 (cranberrii__ftcourse__9f4902cf, 2.6 MB); 50
million is ~7x that."""
MAX_DEPTH = 200
"""Nesting depth (real snapshots nest about 6 deep: dict > list > dict > list > dict > str)."""
MAX_STRING_BYTES = 16 * 1024 * 1024
"""Longest str/bytes accepted (frames' file names and annotations are short)."""
MAX_INT_BITS = 128
"""Widest int accepted; addresses and sizes fit 64 bits, anything wider is not a snapshot value."""


class RefusedPickleError(pickle.UnpicklingError):
    """The pickle asked for a global or persistent object; it was refused before anything was called."""


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that refuses every global and persistent id (nothing from the file is ever called)."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickleError(f"it asks to import {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickleError("it uses a persistent id (PERSID)")


def _check_tree(obj: Any, max_objects: int = MAX_EXPANDED_OBJECTS, max_depth: int = MAX_DEPTH) -> int:
    """Check types and limits of ``obj``; return its expanded object count (shared objects counted per use).

    Raises TypeError (a refused type), or ValueError (a limit; the message says which). Iterative post-order walk:
    each distinct container is visited once and its expanded size memoized, so a shared list counts at every use
    without being walked again; a container met again while still open is a cycle.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]
    total = 0
    while stack:
        item, depth, done = stack.pop()
        kind = type(item)
        if kind not in ALLOWED_TYPES:
            raise TypeError(kind.__name__)
        if kind is str or kind is bytes:
            if len(item) > MAX_STRING_BYTES:
                raise ValueError(f"a string of {len(item):,} characters (the limit is {MAX_STRING_BYTES:,})")
            continue
        if kind is int and item.bit_length() > MAX_INT_BITS:
            raise ValueError(f"an integer of {item.bit_length()} bits (the limit is {MAX_INT_BITS})")
        if kind not in (dict, list, tuple):
            continue
        key = id(item)
        children = list(item.keys()) + list(item.values()) if kind is dict else item
        if done:
            n = 1 + sum(sizes.get(id(c), 1) for c in children)
            sizes[key] = n
            open_.discard(key)
            if depth == 0:
                total = n
            if n > max_objects:
                raise ValueError(
                    f"it expands to more than {max_objects:,} objects (shared references count at every use)"
                )
            continue
        if key in sizes:
            if depth == 0:
                total = sizes[key]
            continue
        if key in open_:
            raise ValueError("it contains a cycle (an object that contains itself)")
        if depth > max_depth:
            raise ValueError(f"it nests deeper than {max_depth} levels")
        open_.add(key)
        stack.append((item, depth, True))
        stack.extend((c, depth + 1, False) for c in children if type(c) in (dict, list, tuple) and id(c) not in sizes)
        stack.extend((c, depth + 1, False) for c in children if type(c) not in (dict, list, tuple))
    return total if sizes else 1


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
    except ValueError as exc:
        raise InputError(f"{source} was refused: {exc}; see the limits in docs/safety.md") from None
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
