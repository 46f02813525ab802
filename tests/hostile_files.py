"""Builders of hostile input files (issue 42), shared by the hostile-input tests.

Each builder writes one file (or folder) under the folder it is given and returns its path. None of them is large
on disk: a "1 GB line" is a sparse file, a "290 M memo index" pickle is 4 KB of data in a sparse file, SQLite
views compute their rows when read.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
from pathlib import Path

GB = 1 << 30


def fifo(d: Path, name: str) -> Path:
    """A named pipe with no writer."""
    path = d / name
    os.mkfifo(path)
    return path


def urandom_link(d: Path, name: str) -> Path:
    """A symbolic link to /dev/urandom."""
    path = d / name
    path.symlink_to("/dev/urandom")
    return path


def sparse_line(d: Path, name: str, size: int = GB, head: bytes = b"") -> Path:
    """A file of ``size`` bytes that is one line: ``head`` and then zeros (a sparse file: nothing on disk)."""
    path = d / name
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def sparse_json_line(d: Path, name: str, size: int = GB) -> Path:
    """A 'JSON' file of one ``size``-byte line: a string that never closes."""
    return sparse_line(d, name, size, b'{"data": ["' + b"x" * 4096)


# -- pickles ---------------------------------------------------------------------------------------------------------


def sparse_memo_pickle(d: Path, name: str = "memo.pickle", index: int = 290_000_000) -> Path:
    """Issue 42: a 4 KB sparse pickle naming memo slot 290 M (a file longer than the index, so 'index <= file
    length' holds): the C unpickler grows its memo array to twice the index (~4.6 GB)."""
    data = b"\x80\x04]r" + index.to_bytes(4, "little") + b"."
    return sparse_line(d, name, index + 4096, data)


def colliding_keys_pickle(d: Path, name: str = "collide.pickle", n: int = 400_000) -> Path:
    """Issue 42: a snapshot-shaped pickle whose allocator_settings dict has ``n`` int keys that all hash to 0
    (multiples of 2**61 - 1, Python's int hash modulus): building it is quadratic. Written opcode by opcode (the
    dict itself would take as long to build here); ~5 MB for 400,000 keys."""
    head = pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4)[:-1]  # without STOP: the dict is open
    body = bytearray(head)
    body += b"\x8c\x12allocator_settings}("  # SHORT_BINUNICODE key, EMPTY_DICT, MARK
    for k in range(n):
        key = k * (2**61 - 1)
        raw = key.to_bytes((key.bit_length() + 8) // 8 or 1, "little", signed=True)
        body += b"\x8a" + bytes([len(raw)]) + raw + b"K\x00"  # LONG1 key, BININT1 0
    body += b"us."  # SETITEMS (the keys), SETITEM (allocator_settings into the top dict), STOP
    path = d / name
    path.write_bytes(bytes(body))
    return path


def _event(addr: int, action: str = "alloc") -> dict[str, object]:
    return {"action": action, "addr": addr, "size": 512, "stream": 0, "frames": [], "time_us": 1}


def shared_events_pickle(d: Path, name: str = "shared.pickle", n: int = 1_980_000) -> Path:
    """Issue 42: ``n`` trace events that are two dicts referenced again and again (an alloc and its free)."""
    pair = [_event(4096), _event(4096, "free_completed")]
    doc = {"segments": [], "device_traces": [pair * (n // 2)]}
    path = d / name
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return path


def shared_strings_pickle(d: Path, name: str = "strings.pickle", mib: int = 15, n: int = 400) -> Path:
    """Issue 42: ``n`` events whose frames share two ``mib`` MiB strings (file name and function name)."""
    filename, func = "f" * (mib << 20), "g" * (mib << 20)
    events = [{**_event(4096 * (i + 1)), "frames": [{"filename": filename, "name": func, "line": i}]} for i in range(n)]
    doc = {"segments": [], "device_traces": [events]}
    path = d / name
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return path


# -- SQLite ----------------------------------------------------------------------------------------------------------


def export(d: Path, name: str = "v.sqlite") -> Path:
    """A valid synthetic nsys export."""
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    write_synthetic_export(d / name, faults=40, migrations=20, iterations=2, kernels_per_iteration=5)
    return d / name


ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT {cols} FROM r"
MANY = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 40000000) SELECT {cols} FROM r"


def view_export(d: Path, table: str, endless: bool = True, name: str | None = None) -> Path:
    """A valid export whose ``table`` is replaced by a VIEW with the same columns: an endless recursive CTE, or
    one that generates 40 million rows."""
    path = export(d, name or f"view-{table}-{'endless' if endless else '40m'}.sqlite")
    conn = sqlite3.connect(path)
    cols = [str(r[1]) for r in conn.execute(f'PRAGMA table_info("{table}")')]
    conn.execute(f'DROP TABLE "{table}"')
    select = (ENDLESS if endless else MANY).format(cols=", ".join(f'x AS "{c}"' for c in cols))
    conn.execute(f'CREATE VIEW "{table}" AS {select}')
    conn.commit()
    conn.close()
    return path


def huge_string_export(d: Path, name: str = "bigname.sqlite", size: int = 300_000_000) -> Path:
    """A valid export whose first kernel's name (a StringIds value) is ``size`` bytes (a real, 300 MB file)."""
    from uvmlab.measure.nsys import schema as S

    path = export(d, name)
    conn = sqlite3.connect(path)
    conn.execute(
        f"UPDATE {S.STRING_IDS} SET value = printf('%.*c', {int(size)}, 'k') "
        f"WHERE id = (SELECT min(demangledName) FROM {S.KERNEL})"
    )
    conn.commit()
    conn.close()
    return path


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst
