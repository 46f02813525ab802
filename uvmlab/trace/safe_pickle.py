"""A restricted unpickler for untrusted files: only plain containers and scalars ever load.

Snapshot pickles come from other people's machines, so ``pickle.load`` is never used on them. Five layers:

1. ``find_class`` refuses EVERY global. In the pickle machine, a callable can only enter the stack through
   ``find_class`` (opcodes GLOBAL, STACK_GLOBAL, INST, and the EXT1/2/4 extension registry all go through it), so
   REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / BUILD have nothing to call: no code of the file's choosing runs.
2. ``persistent_load`` refuses persistent ids (PERSID/BINPERSID), which would otherwise hand control to us.
3. After loading, the object tree is checked: only dict, list, tuple, str, bytes, int, float, bool and None are
   accepted (e.g. a set or bytearray built by protocol-4/5 opcodes is refused too).
4. Before the unpickler runs, the opcode stream is scanned (:func:`scan_opcodes`, a walk over the opcodes and
   their argument lengths, ~0.2 s for the largest real snapshot): the file may hold at most
   :data:`MAX_OPCODES` opcodes (each builds at most one object, so this bounds what loading can allocate), a
   memo index (PUT/BINPUT/LONG_BINPUT) may not exceed the file's length (the C unpickler grows its memo array
   to twice the index: the 9-byte ``\\x80\\x04]r\\x00\\x46\\xc3\\x23.`` asked for ~9 GB), and no str/bytes or int
   may exceed the limits below. The file itself is read only if it is a regular file of at most
   :data:`MAX_PICKLE_BYTES` (:func:`uvmlab.files.inputs.read_input_bytes`).
5. Limits, counted after loading and before anything is expanded: a pickle's memo lets one small object be
   referenced many times (a 400 KB file can name a list of 200,000 events 500 times), so the EXPANDED size is
   computed (every use of a shared object counts again, memoized per object so the count itself costs one visit
   per distinct object) and refused above :data:`MAX_EXPANDED_OBJECTS`; a cycle (infinite expansion), nesting
   deeper than :data:`MAX_DEPTH`, a str/bytes over :data:`MAX_STRING_BYTES` or an int over :data:`MAX_INT_BITS`
   bits are refused too. Snapshot-level limits (devices, events, segments, blocks) live in :mod:`uvmlab.trace.snapshot`.

Every failure is an :class:`~uvmlab.errors.InputError` with one sentence naming the file and the reason. The
loader is the C unpickler (``pickle.Unpickler`` subclass), so it is fast (0.06 s for a 3.9 MB snapshot).
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.files.inputs import read_input_bytes

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
MAX_PICKLE_BYTES = 1 << 30
"""Largest snapshot file read (1 GiB; the largest real one in ../shared/real-data/snapshots is 3.9 MB)."""
MAX_OPCODES = 20_000_000
"""Opcodes a pickle may hold (the largest real snapshot has 1,082,789; each opcode builds at most one object of
~100 bytes, so loading stays within ~2 GB whatever the file)."""


class RefusedPickleError(pickle.UnpicklingError):
    """The pickle asked for a global or persistent object; it was refused before anything was called."""


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that refuses every global and persistent id (nothing from the file is ever called)."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickleError(f"it asks to import {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickleError("it uses a persistent id (PERSID)")


def _opcode_table() -> tuple[list[int | None], dict[int, tuple[int, bool, bool]]]:
    """Per opcode byte: its fixed argument length (None: not an opcode; -1: variable, see the second table:
    (bytes of the length prefix, or 0 for newline-terminated; signed prefix; two lines))."""
    fixed: list[int | None] = [None] * 256
    variable: dict[int, tuple[int, bool, bool]] = {}
    prefix = {
        pickletools.TAKEN_FROM_ARGUMENT1: 1,
        pickletools.TAKEN_FROM_ARGUMENT4: 4,
        pickletools.TAKEN_FROM_ARGUMENT4U: 4,
        pickletools.TAKEN_FROM_ARGUMENT8U: 8,
    }
    for op in pickletools.opcodes:
        code, arg = ord(op.code), op.arg
        if arg is None or arg.n >= 0:
            fixed[code] = 0 if arg is None else arg.n
        else:
            fixed[code] = -1
            pair = arg is pickletools.stringnl_noescape_pair  # GLOBAL and INST: module and name lines
            variable[code] = (prefix.get(arg.n, 0), arg.n == pickletools.TAKEN_FROM_ARGUMENT4, pair)
    return fixed, variable


_FIXED, _VARIABLE = _opcode_table()
_STOP = ord(pickle.STOP)
_MEMO_PUT = {ord(pickle.BINPUT): 1, ord(pickle.LONG_BINPUT): 4}
_PUT, _INT, _LONG = ord(pickle.PUT), ord(pickle.INT), ord(pickle.LONG)
_WIDE_INTS = {ord(pickle.LONG1), ord(pickle.LONG4)}
_STRINGS = {ord(c) for c in (pickle.BINUNICODE, pickle.BINUNICODE8, pickle.BINBYTES, pickle.BINBYTES8,
                             pickle.BYTEARRAY8, pickle.BINSTRING, pickle.STRING, pickle.UNICODE)}  # fmt: skip
_MAX_INT_DIGITS = len(str(2**MAX_INT_BITS)) + 1  # sign included


def scan_opcodes(data: bytes, max_opcodes: int = MAX_OPCODES) -> int:
    """Walk the opcodes of pickle ``data`` without building anything; return how many there are.

    Raises ValueError (the message says which limit) for more than ``max_opcodes`` opcodes, a memo index beyond
    the file's length, a str/bytes longer than MAX_STRING_BYTES or an int wider than MAX_INT_BITS, and for bytes
    that are not a pickle opcode (the unpickler would refuse them too). Stops at STOP, as ``pickle.loads`` does.
    """
    n, pos, ops = len(data), 0, 0
    fixed, variable = _FIXED, _VARIABLE
    while pos < n:
        code = data[pos]
        pos += 1
        ops += 1
        if ops > max_opcodes:
            raise ValueError(f"it holds more than {max_opcodes:,} opcodes")
        size = fixed[code]
        if size is None:
            raise ValueError(f"byte {pos - 1} is not a pickle opcode ({code:#04x})")
        if size > 0:
            if code in _MEMO_PUT:
                index = int.from_bytes(data[pos : pos + size], "little")
                if index > n:
                    raise ValueError(f"it names memo slot {index:,}, beyond anything a {n:,}-byte file can hold")
            pos += size
            continue
        if size == 0:
            if code == _STOP:
                return ops
            continue
        prefix, signed, pair = variable[code]
        if prefix:
            length = int.from_bytes(data[pos : pos + prefix], "little", signed=signed)
            pos += prefix
            if code in _WIDE_INTS and length * 8 > MAX_INT_BITS + 8:
                raise ValueError(f"an integer of {length * 8} bits (the limit is {MAX_INT_BITS})")
            if length > MAX_STRING_BYTES:
                raise ValueError(f"a string of {length:,} bytes (the limit is {MAX_STRING_BYTES:,})")
            pos += max(0, length)
            continue
        end = data.find(b"\n", pos)
        if pair and end >= 0:
            end = data.find(b"\n", end + 1)
        if end < 0:
            return ops  # truncated: the unpickler says so
        if code == _PUT:
            digits = data[pos:end]
            if not digits.isdigit() or len(digits) > 20 or int(digits) > n:
                raise ValueError(f"it names memo slot {digits[:24]!r}, not one a {n:,}-byte file can hold")
        if code in (_INT, _LONG) and end - pos > _MAX_INT_DIGITS + 1:
            raise ValueError(f"an integer of {end - pos} digits (the limit is {MAX_INT_BITS} bits)")
        if code in _STRINGS and end - pos > MAX_STRING_BYTES:
            raise ValueError(f"a string of {end - pos:,} bytes (the limit is {MAX_STRING_BYTES:,})")
        pos = end + 1
    return ops


_CONTAINERS = frozenset((dict, list, tuple))
_ALLOWED = frozenset(ALLOWED_TYPES)
_TEXT = frozenset((str, bytes))


def _check_leaves(values: list[Any] | tuple[Any, ...], types: set[type]) -> None:
    """Check the scalars among ``values`` (``types``: the types present, containers included): allowed types only,
    no str/bytes over MAX_STRING_BYTES, no int over MAX_INT_BITS bits. Each test runs over the whole list in C when
    the list holds one kind (a dict's keys, a list of ints) and filters in Python only when kinds are mixed."""
    for kind in types:
        if kind not in _ALLOWED:
            raise TypeError(kind.__name__)
    if not types.isdisjoint(_TEXT):
        texts = values if types <= _TEXT else [v for v in values if type(v) is str or type(v) is bytes]
        longest = max(map(len, texts))
        if longest > MAX_STRING_BYTES:
            raise ValueError(f"a string of {longest:,} characters (the limit is {MAX_STRING_BYTES:,})")
    if int in types:
        ints = values if len(types) == 1 else [v for v in values if type(v) is int]
        widest = max(map(int.bit_length, ints))
        if widest > MAX_INT_BITS:
            raise ValueError(f"an integer of {widest} bits (the limit is {MAX_INT_BITS})")


def _check_tree(obj: Any, max_objects: int = MAX_EXPANDED_OBJECTS, max_depth: int = MAX_DEPTH) -> int:
    """Check types and limits of ``obj``; return its expanded object count (shared objects counted per use).

    Raises TypeError (a refused type), or ValueError (a limit; the message says which). Iterative post-order walk
    over the containers: each distinct container is visited once, its scalars are checked in bulk
    (:func:`_check_leaves`) and its expanded size memoized, so a shared list counts at every use without being
    walked again; a container met again while still open is a cycle.
    """
    if type(obj) not in _CONTAINERS:
        _check_leaves([obj], {type(obj)})
        return 1
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    # (container, depth, its container children once visited (None before), its scalar count)
    stack: list[tuple[Any, int, list[Any] | None, int]] = [(obj, 0, None, 0)]
    while stack:
        item, depth, kids, n_scalars = stack.pop()
        key = id(item)
        if kids is not None:
            n = 1 + n_scalars + sum(map(sizes.__getitem__, map(id, kids)))
            if n > max_objects:
                raise ValueError(
                    f"it expands to more than {max_objects:,} objects (shared references count at every use)"
                )
            sizes[key] = n
            open_.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ValueError("it contains a cycle (an object that contains itself)")
        if depth > max_depth:
            raise ValueError(f"it nests deeper than {max_depth} levels")
        if type(item) is dict:
            keys, values = list(item), list(item.values())
            key_types, value_types = set(map(type, keys)), set(map(type, values))
            _check_leaves(keys, key_types)
            _check_leaves(values, value_types)
            types = key_types | value_types
            children = keys + values
        else:
            children = item
            types = set(map(type, children))
            _check_leaves(children, types)
        if types.isdisjoint(_CONTAINERS):
            kids = []
        elif types <= _CONTAINERS:
            kids = list(children)
        else:
            kids = [c for c in children if type(c) in _CONTAINERS]
        open_.add(key)
        stack.append((item, depth, kids, len(children) - len(kids)))
        stack.extend([(c, depth + 1, None, 0) for c in kids])
    return sizes[id(obj)]


def safe_loads(data: bytes, source: str = "<bytes>") -> Any:
    """Load pickle ``data`` with :class:`RestrictedUnpickler`; raise InputError (one sentence) on any problem."""
    if not data:
        raise InputError(f"{source} is empty (0 bytes); expected a pickle file")
    if data[:1] != b"\x80" and data[:1] not in (b"(", b"]", b"}", b"c", b"l", b"d"):
        raise InputError(f"{source} is not a pickle file (it starts with {data[:8]!r}); expected a snapshot pickle")
    try:
        scan_opcodes(data)
    except ValueError as exc:
        raise InputError(f"{source} was refused: {exc}; see the limits in docs/safety.md") from None
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
    return safe_loads(read_input_bytes(p, MAX_PICKLE_BYTES, "a snapshot pickle file"), str(p))
