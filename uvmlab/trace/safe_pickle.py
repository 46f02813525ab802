"""A restricted unpickler for untrusted files: only plain containers and scalars ever load.

Snapshot pickles come from other people's machines, so ``pickle.load`` is never used on them. Five layers:

1. ``find_class`` refuses EVERY global. In the pickle machine, a callable can only enter the stack through
   ``find_class`` (opcodes GLOBAL, STACK_GLOBAL, INST, and the EXT1/2/4 extension registry all go through it), so
   REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / BUILD have nothing to call: no code of the file's choosing runs.
2. ``persistent_load`` refuses persistent ids (PERSID/BINPERSID), which would otherwise hand control to us.
3. After loading, the object tree is checked: only dict, list, tuple, str, bytes, int, float, bool and None are
   accepted (e.g. a set or bytearray built by protocol-4/5 opcodes is refused too).
4. Before the unpickler runs, the opcode stream is scanned (:func:`scan_opcodes`): a walk over the opcodes that
   models the unpickler's stack and memo without building anything, so the limits hold WHILE the pickle is
   parsed: at most :data:`MAX_OPCODES` opcodes (each builds at most one object), a memo slot never beyond the
   opcodes read so far (the C unpickler grows its memo array to twice the index: a sparse 4 KB file naming slot
   290 M asked for 4.6 GB), dict keys that are strings only (their hashes are randomized per process, so no file
   can make them collide: 400,000 int keys hashing to 0 made building one dict quadratic), at most
   :data:`MAX_DICT_KEYS` keys per dict, an expanded size (objects and string bytes, shared references counted at
   every use; a lower bound here) within :data:`MAX_EXPANDED_OBJECTS` and :data:`MAX_EXPANDED_BYTES`, no str/bytes
   or int beyond the limits below, and :data:`PARSE_TIME_LIMIT_S` for the scan, the load and the tree check
   together. The file itself is read only if it is a regular file of at most :data:`MAX_PICKLE_BYTES`
   (:func:`uvmlab.files.inputs.read_input_bytes`).
5. Limits, counted exactly after loading and before anything is expanded: a pickle's memo lets one small object be
   referenced many times (a 400 KB file can name a list of 200,000 events 500 times), so the EXPANDED size is
   computed (every use of a shared object counts again, memoized per object so the count itself costs one visit
   per distinct object) and refused above :data:`MAX_EXPANDED_OBJECTS` objects or :data:`MAX_EXPANDED_BYTES`
   bytes of strings; a cycle (infinite expansion), nesting deeper than :data:`MAX_DEPTH`, a dict key that is not a
   str, a str/bytes over :data:`MAX_STRING_BYTES` or an int over :data:`MAX_INT_BITS` bits are refused too.
   Snapshot-level limits (devices, events, segments, blocks) live in :mod:`uvmlab.trace.snapshot`.

Every failure is an :class:`~uvmlab.errors.InputError` with one sentence naming the file and the reason. The
loader is the C unpickler (``pickle.Unpickler`` subclass), so it is fast (0.06 s for a 3.9 MB snapshot).
"""

from __future__ import annotations

import io
import pickle
import pickletools
import time
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
MAX_STRING_BYTES = 1 << 20
"""Longest str/bytes accepted (1 MiB; frames' file names and annotations are short: the longest string in the real
snapshots is 1,806 characters)."""
MAX_EXPANDED_BYTES = 1 << 30
"""Bytes of str/bytes an untrusted pickle may expand to, a shared string counted at every use (1 GiB; the real
snapshots reach 110,825,510, their file names shared by thousands of frames)."""
MAX_DICT_KEYS = 65_536
"""Keys of one dict (the real snapshots' dicts have at most 16); keys must be strings (see :func:`scan_opcodes`)."""
PARSE_TIME_LIMIT_S = 30.0
"""Seconds the scan, the load and the tree check of one pickle may take together (the largest real snapshot takes
about 2 s on a loaded 2-core machine)."""
MAX_INT_BITS = 128
"""Widest int accepted; addresses and sizes fit 64 bits, anything wider is not a snapshot value."""
MAX_PICKLE_BYTES = 128 << 20
"""Largest snapshot file read (128 MiB, read whole into memory; the largest real one in
../shared/real-data/snapshots is 3.9 MB)."""
MAX_OPCODES = 5_000_000
"""Opcodes a pickle may hold (the largest real snapshot has 1,082,789; each opcode builds at most one object of
~100 bytes and one memo slot of 16 bytes, so loading stays within ~600 MB whatever the file)."""


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


_OPS = {op.name: ord(op.code) for op in pickletools.opcodes}
(_NONE, _STR, _SCALAR, _BYTES, _EMPTY, _MARKOP, _FROM_MARK, _DICT, _TUPLE1, _TUPLE2, _TUPLE3, _APPEND, _SETITEM,
 _APPENDS, _SETITEMS, _GET, _PUTOP, _MEMOIZE, _POP, _POP_MARK, _DUP, _STOPOP, _END) = range(23)  # fmt: skip
_ACTIONS = {
    _STR: ("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"),
    _SCALAR: ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "NONE", "NEWTRUE", "NEWFALSE", "FLOAT",
              "BINFLOAT", "NEXT_BUFFER"),
    _BYTES: ("STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"),
    _EMPTY: ("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET"),
    _MARKOP: ("MARK",), _FROM_MARK: ("LIST", "TUPLE", "FROZENSET"), _DICT: ("DICT",), _TUPLE1: ("TUPLE1",),
    _TUPLE2: ("TUPLE2",), _TUPLE3: ("TUPLE3",), _APPEND: ("APPEND",), _SETITEM: ("SETITEM",),
    _APPENDS: ("APPENDS", "ADDITEMS"), _SETITEMS: ("SETITEMS",), _GET: ("GET", "BINGET", "LONG_BINGET"),
    _PUTOP: ("PUT", "BINPUT", "LONG_BINPUT"), _MEMOIZE: ("MEMOIZE",), _POP: ("POP",), _POP_MARK: ("POP_MARK",),
    _DUP: ("DUP",), _STOPOP: ("STOP",),
    _END: ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
           "PERSID", "BINPERSID"),  # need a global or a persistent id: the restricted unpickler refuses them
}  # fmt: skip
_ACTION = bytearray(256)  # _NONE (PROTO, FRAME, READONLY_BUFFER: no effect on the model) unless listed
for _act, _names in _ACTIONS.items():
    for _name in _names:
        _ACTION[_OPS[_name]] = _act
_TEXT_MEMO = {_OPS["GET"], _OPS["PUT"]}
DEADLINE_STEPS = 65_536
"""Opcodes (and containers, in the tree check) between two looks at the clock."""


def scan_opcodes(
    data: bytes,
    max_opcodes: int = MAX_OPCODES,
    deadline: float | None = None,
    max_dict_keys: int = MAX_DICT_KEYS,
    max_objects: int = MAX_EXPANDED_OBJECTS,
    max_bytes: int = MAX_EXPANDED_BYTES,
) -> int:
    """Walk the opcodes of pickle ``data`` without building anything; return how many there are.

    The walk keeps a model of the unpickler's stack and memo: per stack entry an object id, per id its expanded
    object count and bytes of strings (a lower bound: a container filled after it was shared counts what it held
    when it was shared), whether it is a str, and per dict the keys it received. So every limit holds WHILE the
    pickle is parsed, before the C unpickler builds a single object. Raises ValueError (the message says which
    limit) for: more than ``max_opcodes`` opcodes; a memo slot beyond the opcodes read so far (a pickler numbers
    its memo 0, 1, 2, ...; the C unpickler grows its memo array to twice the largest index, so a sparse 4 KB file
    naming slot 290 M asked for 4.6 GB); a dict key that is not a str (str hashes are randomized per process, so
    no file can make its keys collide; real snapshots have only str keys); a dict of more than ``max_dict_keys``
    keys; a container that expands (shared references counted at every use) to more than ``max_objects`` objects
    or ``max_bytes`` bytes of strings; a str/bytes longer than MAX_STRING_BYTES or an int wider than MAX_INT_BITS;
    bytes that are not a pickle opcode; a stack that does not match the opcodes. Raises TimeoutError when the walk
    is still running at ``deadline`` (``time.monotonic()``). Stops at STOP, as ``pickle.loads`` does, and at the
    first opcode that needs a global (the unpickler refuses it there).
    """
    n, pos, ops = len(data), 0, 0
    fixed, variable, action = _FIXED, _VARIABLE, _ACTION
    count, nbytes, is_str = [1], [0], bytearray(1)  # per object id; id 0 stands for every scalar
    dict_keys: dict[int, int] = {}
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[int, int] = {}

    def pop_mark() -> list[int]:
        if not marks:
            raise ValueError("it pops a mark it never set")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def new(c: int, b: int, text: bool = False) -> int:
        count.append(c)
        nbytes.append(b)
        is_str.append(text)
        return len(count) - 1

    def add(target: int, items: list[int], is_dict: bool) -> None:
        if is_dict:
            keys = items[0::2]
            if not all(is_str[k] for k in keys) or len(items) % 2:
                raise ValueError("a dict key that is not a string (real snapshots key every dict by strings)")
            got = dict_keys.get(target, 0) + len(keys)
            if got > max_dict_keys:
                raise ValueError(f"a dict of more than {max_dict_keys:,} keys")
            dict_keys[target] = got
        if target <= 0:
            raise ValueError("it adds items to something that is not a container")
        c = count[target] = count[target] + sum([count[i] for i in items])
        b = nbytes[target] = nbytes[target] + sum([nbytes[i] for i in items])
        if c > max_objects:
            raise ValueError(f"it expands to more than {max_objects:,} objects (shared references count at every use)")
        if b > max_bytes:
            raise ValueError(
                f"it expands to more than {max_bytes:,} bytes of strings (shared strings count at every use)"
            )

    binget, long_binget, memoize = _OPS["BINGET"], _OPS["LONG_BINGET"], _OPS["MEMOIZE"]
    try:
        while pos < n:
            code = data[pos]
            pos += 1
            ops += 1
            if not ops & 0xFFFF:
                if ops > max_opcodes:
                    raise ValueError(f"it holds more than {max_opcodes:,} opcodes")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
            if code in (long_binget, binget):  # three quarters of a real snapshot's opcodes
                if code == binget:
                    arg = data[pos]
                    pos += 1
                else:
                    arg = int.from_bytes(data[pos : pos + 4], "little")
                    pos += 4
                if arg not in memo:
                    raise ValueError(f"it reads memo slot {arg:,}, which it never filled")
                stack.append(memo[arg])
                continue
            if code == memoize:
                memo[len(memo)] = stack[-1]
                continue
            size = fixed[code]
            act = action[code]
            length = arg = 0
            if size is None:
                raise ValueError(f"byte {pos - 1} is not a pickle opcode ({code:#04x})")
            if size > 0:
                if act in (_GET, _PUTOP):
                    arg = int.from_bytes(data[pos : pos + size], "little")
                pos += size
            elif size < 0:
                prefix, signed, pair = variable[code]
                if prefix:
                    length = int.from_bytes(data[pos : pos + prefix], "little", signed=signed)
                    pos += prefix + max(0, length)
                    if code in _WIDE_INTS and length * 8 > MAX_INT_BITS + 8:
                        raise ValueError(f"an integer of {length * 8} bits (the limit is {MAX_INT_BITS})")
                    if length > MAX_STRING_BYTES:
                        raise ValueError(f"a string of {length:,} bytes (the limit is {MAX_STRING_BYTES:,})")
                else:
                    end = data.find(b"\n", pos)
                    if pair and end >= 0:
                        end = data.find(b"\n", end + 1)
                    if end < 0:
                        return ops  # truncated: the unpickler says so
                    length = end - pos
                    if code in (_INT, _LONG) and length > _MAX_INT_DIGITS + 1:
                        raise ValueError(f"an integer of {length} digits (the limit is {MAX_INT_BITS} bits)")
                    if code in _STRINGS and length > MAX_STRING_BYTES:
                        raise ValueError(f"a string of {length:,} bytes (the limit is {MAX_STRING_BYTES:,})")
                    if code in _TEXT_MEMO:
                        text = data[pos:end]
                        if not text.isdigit() or len(text) > 20:
                            raise ValueError(f"it names memo slot {text[:24]!r}, not a number")
                        arg = int(text)
                    pos = end + 1
            # the stack model, most frequent actions first
            if act == _STR:
                count.append(1)
                nbytes.append(length)
                is_str.append(1)
                stack.append(len(count) - 1)
            elif act in (_PUTOP, _MEMOIZE):
                index = len(memo) if act == _MEMOIZE else arg
                if index > ops:
                    raise ValueError(f"it names memo slot {index:,}, beyond the {ops:,} opcodes read so far")
                memo[index] = stack[-1]
            elif act == _SCALAR:
                stack.append(0)
            elif act == _GET:
                if arg not in memo:
                    raise ValueError(f"it reads memo slot {arg:,}, which it never filled")
                stack.append(memo[arg])
            elif act == _MARKOP:
                marks.append(len(stack))
            elif act == _EMPTY:
                stack.append(new(1, 0))
            elif act == _SETITEMS:
                items = pop_mark()
                add(stack[-1], items, True)
            elif act == _APPENDS:
                items = pop_mark()
                add(stack[-1], items, False)
            elif act == _APPEND:
                item = stack.pop()
                add(stack[-1], [item], False)
            elif act == _SETITEM:
                items = stack[-2:]
                del stack[-2:]
                add(stack[-1], items, True)
            elif act in (_TUPLE1, _TUPLE2, _TUPLE3):
                k = act - _TUPLE1 + 1
                if len(stack) < k:
                    raise IndexError
                items = stack[-k:]
                del stack[-k:]
                target = new(1, 0)
                add(target, items, False)
                stack.append(target)
            elif act in (_FROM_MARK, _DICT):
                items = pop_mark()
                target = new(1, 0)
                add(target, items, act == _DICT)
                stack.append(target)
            elif act == _BYTES:
                stack.append(new(1, length))
            elif act == _POP:
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif act == _POP_MARK:
                pop_mark()
            elif act == _DUP:
                stack.append(stack[-1])
            elif act in (_STOPOP, _END):
                break
    except IndexError:
        raise ValueError("its stack does not match its opcodes (a damaged pickle)") from None
    if ops > max_opcodes:
        raise ValueError(f"it holds more than {max_opcodes:,} opcodes")
    return ops


_CONTAINERS = frozenset((dict, list, tuple))
_ALLOWED = frozenset(ALLOWED_TYPES)
_TEXT = frozenset((str, bytes))


def _check_leaves(values: list[Any] | tuple[Any, ...], types: set[type]) -> int:
    """Check the scalars among ``values`` (``types``: the types present, containers included): allowed types only,
    no str/bytes over MAX_STRING_BYTES, no int over MAX_INT_BITS bits. Each test runs over the whole list in C when
    the list holds one kind (a dict's keys, a list of ints) and filters in Python only when kinds are mixed."""
    for kind in types:
        if kind not in _ALLOWED:
            raise TypeError(kind.__name__)
    total = 0
    if not types.isdisjoint(_TEXT):
        texts = values if types <= _TEXT else [v for v in values if type(v) is str or type(v) is bytes]
        lengths = list(map(len, texts))
        longest, total = max(lengths), sum(lengths)
        if longest > MAX_STRING_BYTES:
            raise ValueError(f"a string of {longest:,} characters (the limit is {MAX_STRING_BYTES:,})")
    if int in types:
        ints = values if len(types) == 1 else [v for v in values if type(v) is int]
        widest = max(map(int.bit_length, ints))
        if widest > MAX_INT_BITS:
            raise ValueError(f"an integer of {widest} bits (the limit is {MAX_INT_BITS})")
    return total


def _check_tree(
    obj: Any,
    max_objects: int = MAX_EXPANDED_OBJECTS,
    max_depth: int = MAX_DEPTH,
    max_bytes: int = MAX_EXPANDED_BYTES,
    deadline: float | None = None,
) -> int:
    """Check types and limits of ``obj``; return its expanded object count (shared objects counted per use).

    Raises TypeError (a refused type), ValueError (a limit; the message says which) or TimeoutError (past
    ``deadline``). Iterative post-order walk over the containers: each distinct container is visited once, its
    scalars are checked in bulk (:func:`_check_leaves`) and its expanded size (objects, and bytes of strings)
    memoized, so a shared list counts at every use without being walked again; a container met again while still
    open is a cycle. Dict keys must be strings.
    """
    if type(obj) not in _CONTAINERS:
        n_bytes = _check_leaves([obj], {type(obj)})
        if n_bytes > max_bytes:
            raise ValueError(f"it expands to more than {max_bytes:,} bytes of strings")
        return 1
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    # (container, depth, its container children once visited (None before), its scalar count, its scalars' bytes)
    stack: list[tuple[Any, int, list[Any] | None, int, int]] = [(obj, 0, None, 0, 0)]
    steps = 0
    while stack:
        item, depth, kids, n_scalars, n_bytes = stack.pop()
        steps += 1
        if deadline is not None and not steps % DEADLINE_STEPS and time.monotonic() > deadline:
            raise TimeoutError
        key = id(item)
        if kids is not None:
            parts = [sizes[id(k)] for k in kids]
            n = 1 + n_scalars + sum(c for c, _ in parts)
            b = n_bytes + sum(b for _, b in parts)
            if n > max_objects:
                raise ValueError(
                    f"it expands to more than {max_objects:,} objects (shared references count at every use)"
                )
            if b > max_bytes:
                raise ValueError(
                    f"it expands to more than {max_bytes:,} bytes of strings (shared strings count at every use)"
                )
            sizes[key] = (n, b)
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
            if key_types and key_types != {str}:
                raise ValueError("a dict key that is not a string (real snapshots key every dict by strings)")
            if len(keys) > MAX_DICT_KEYS:
                raise ValueError(f"a dict of more than {MAX_DICT_KEYS:,} keys")
            scalar_bytes = _check_leaves(keys, key_types) + _check_leaves(values, value_types)
            types = key_types | value_types
            children = keys + values
        else:
            children = item
            types = set(map(type, children))
            scalar_bytes = _check_leaves(children, types)
        if types.isdisjoint(_CONTAINERS):
            kids = []
        elif types <= _CONTAINERS:
            kids = list(children)
        else:
            kids = [c for c in children if type(c) in _CONTAINERS]
        open_.add(key)
        stack.append((item, depth, kids, len(children) - len(kids), scalar_bytes))
        stack.extend([(c, depth + 1, None, 0, 0) for c in kids])
    return sizes[id(obj)][0]


def safe_loads(data: bytes, source: str = "<bytes>") -> Any:
    """Load pickle ``data`` with :class:`RestrictedUnpickler`; raise InputError (one sentence) on any problem."""
    if not data:
        raise InputError(f"{source} is empty (0 bytes); expected a pickle file")
    if data[:1] != b"\x80" and data[:1] not in (b"(", b"]", b"}", b"c", b"l", b"d"):
        raise InputError(f"{source} is not a pickle file (it starts with {data[:8]!r}); expected a snapshot pickle")
    deadline = time.monotonic() + PARSE_TIME_LIMIT_S
    slow = f"{source} was refused: reading it took more than {PARSE_TIME_LIMIT_S:g} s; see the limits in docs/safety.md"
    try:
        scan_opcodes(data, deadline=deadline)
    except ValueError as exc:
        raise InputError(f"{source} was refused: {exc}; see the limits in docs/safety.md") from None
    except TimeoutError:
        raise InputError(slow) from None
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
        _check_tree(obj, deadline=deadline)
    except TimeoutError:
        raise InputError(slow) from None
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
