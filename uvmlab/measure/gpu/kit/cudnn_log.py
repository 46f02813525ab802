"""cuDNN API logs parsed into one row per call of interest: which algorithm (or engine) and how much workspace.

Enabling the log (cuDNN documentation, "Error Reporting And API Logging"): cuDNN 7/8 read ``CUDNN_LOGINFO_DBG=1``
and ``CUDNN_LOGDEST_DBG=<file|stdout|stderr>``; cuDNN 9 reads ``CUDNN_LOGLEVEL_DBG=3`` (info, warning and error)
with the same destination variable, and still honours the legacy variables "during the v9 grace period".
:data:`LOG_ENV` sets both, so the same step logs on any version. The variables are read when the library loads.

Format (the same block layout in v7 to v9; real examples: real-data/cudnn/rai-project_lib_log_parser (cuDNN
7.5.1/7.6.3), the v8.2.4 log in NVIDIA/cudnn-frontend issue #39 and the v9.12 log in pytorch/pytorch issue #167242)::

    I! CuDNN (v7501) function cudnnConvolutionForward() called:        v9: "(v91200 46)": version and build
    i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM (0);
    i!     workSpaceSizeInBytes: type=size_t; val=0;
    i!     xDesc: type=cudnnTensorDescriptor_t:                         nested fields are indented 4 more
    i!         dimA: type=int; val=[1,3,224,224];
    i! Time: 2019-06-04T18:09:15.727893 (0d+0h+0m+5s since start)
    i! Process=18690; Thread=18798; GPU=0; Handle=0x7fa5880ddba0; StreamId=0x7fa5880083d0.

(``W!``/``E!`` and ``w!``/``e!`` for warnings and errors.) The rows kept (:data:`KEPT_CALLS`): the legacy
convolution calls (algorithm enum and ``workSpaceSizeInBytes``), the legacy algorithm and workspace queries, and
the backend API's ``cudnnBackendExecute`` (cuDNN 8/9's graph API, which PyTorch 2 uses for convolutions), plus
``cudnnBackendSetAttribute`` calls that set ``CUDNN_ATTR_ENGINE_GLOBAL_INDEX`` (the engine chosen). The log
reports each call's *inputs*; a backend execution plan's workspace size is an output of
``cudnnBackendGetAttribute`` and may not appear, so ``workspace_bytes`` is empty for backend calls unless a field
named like a workspace size is in the block [unverified on a v9 log of a PyTorch run: the field names of the
backend descriptors are read generically]. The per-call workspaces PyTorch allocates for cuDNN are in the memory
snapshot of the same iteration (uvmlab.measure.gpu.kit.memory_step, ``workspaces.csv``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError

LOG_ENV = {"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGLEVEL_DBG": "3"}
"""Logging on for cuDNN 7/8 (LOGINFO) and 9 (LOGLEVEL 3 = info); ``CUDNN_LOGDEST_DBG`` names the file."""
DEST_ENV = "CUDNN_LOGDEST_DBG"

_HEADER = re.compile(r"^([IWE])! CuDNN \(v(\d+)(?:\s+(\d+))?\) function (\w+)\(\) called:")
_FIELD = re.compile(r"^[iwe]!( +)([^:]+?):(?: (.*))?$")
_TIME = re.compile(r"^[iwe]! Time: (\S+)")
_PROC = re.compile(r"^[iwe]! Process=(\d+); Thread=(\d+); GPU=([^;]*); Handle=([^;]*); StreamId=(.*?)\.?$")
_VAL = re.compile(r"val=(.*?);")
_ENUM = re.compile(r"^([A-Z0-9_]+)(?: \(-?\d+\))?$")

KEPT_CALLS = re.compile(
    r"^cudnn(Convolution(Forward|BackwardData|BackwardFilter)"
    r"|(Find|Get)Convolution\w*Algorithm\w*|GetConvolution\w*WorkspaceSize|BackendExecute)$"
)
CALL_COLUMNS = (
    "case",
    "index",
    "cudnn_version",
    "severity",
    "api",
    "kind",
    "algo",
    "workspace_bytes",
    "x_dims",
    "w_dims",
    "y_dims",
    "time",
    "process",
    "thread",
)
_KINDS = {
    "cudnnConvolutionForward": "forward",
    "cudnnConvolutionBackwardData": "backward_data",
    "cudnnConvolutionBackwardFilter": "backward_filter",
    "cudnnBackendExecute": "backend_execute",
    "cudnnBackendSetAttribute": "engine_choice",
}
_X = ("xDesc", "srcDesc", "dyDesc")
_W = ("wDesc", "filterDesc", "dwDesc")
_Y = ("yDesc", "destDesc", "dxDesc")
_ENGINE_KEYS = ("engine_id", "globalIndex", "engineGlobalIndex")


@dataclass
class Call:
    """One logged call: header, fields as (depth, key, rest of the line), trailer."""

    index: int
    severity: str
    version: int
    api: str
    fields: list[tuple[int, str, str]] = field(default_factory=list)
    time: str | None = None
    process: int | None = None
    thread: int | None = None

    def top(self, key: str) -> str | None:
        """The raw text after ``key:`` of a top-level field (depth 0)."""
        return next((rest for d, k, rest in self.fields if d == 0 and k == key), None)

    def nested(self, parents: tuple[str, ...], key: str) -> str | None:
        """The text after ``key:`` of the first field named ``key`` under a top-level field in ``parents``."""
        inside = False
        for d, k, rest in self.fields:
            if d == 0:
                inside = k in parents
            elif inside and k == key:
                return rest
        return None


def value(rest: str | None) -> str | None:
    """The ``val=...`` of a field's text, without an enum's number: ``CUDNN_..._GEMM (0)`` -> ``CUDNN_..._GEMM``."""
    if rest is None:
        return None
    m = _VAL.search(rest + ";")
    if not m:
        return None
    v = m.group(1).strip()
    e = _ENUM.match(v)
    return e.group(1) if e else v


def parse_calls(text: str) -> list[Call]:
    """Every logged call of a cuDNN API log, in order. Lines outside a block are ignored."""
    calls: list[Call] = []
    cur: Call | None = None
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h:
            cur = Call(len(calls), h.group(1), int(h.group(2)), h.group(4))
            calls.append(cur)
            continue
        if cur is None:
            continue
        t = _TIME.match(line)
        if t:
            cur.time = t.group(1)
            continue
        p = _PROC.match(line)
        if p:
            cur.process, cur.thread = int(p.group(1)), int(p.group(2))
            continue
        f = _FIELD.match(line)
        if f:
            depth = max(0, (len(f.group(1)) - 5) // 4)  # top-level fields are indented 5 spaces after "i!"
            cur.fields.append((depth, f.group(2).strip(), (f.group(3) or "").strip()))
    return calls


def _int(v: str | None) -> int | None:
    try:
        return None if v is None else int(v)
    except ValueError:
        return None


def _engine(call: Call) -> str | None:
    for _d, k, rest in call.fields:
        if k in _ENGINE_KEYS:
            v = value(rest)
            if v is not None:
                return f"engine {v}"
    return None


def _workspace(call: Call) -> int | None:
    ws = _int(value(call.top("workSpaceSizeInBytes")))
    if ws is not None:
        return ws
    for _d, k, rest in call.fields:
        if "workspace" in k.lower() and "size" in k.lower():
            v = _int(value(rest))
            if v is not None:
                return v
    return None


def call_row(call: Call) -> dict[str, Any] | None:
    """The row of a kept call (None for the others)."""
    engine_choice = call.api == "cudnnBackendSetAttribute" and "CUDNN_ATTR_ENGINE_GLOBAL_INDEX" in (
        call.top("attributeName") or ""
    )
    if not (KEPT_CALLS.match(call.api) or engine_choice):
        return None
    if engine_choice:
        raw = value(call.top("arrayOfElements")) or value(call.top("[0]"))
        algo = f"engine {raw.strip('[]')}" if raw else None
    else:
        algo = value(call.top("algo")) or _engine(call)
    return {
        "index": call.index,
        "cudnn_version": call.version,
        "severity": call.severity,
        "api": call.api,
        "kind": _KINDS.get(call.api, "query"),
        "algo": algo,
        "workspace_bytes": _workspace(call),
        "x_dims": next((value(call.nested((p,), "dimA")) for p in _X if call.top(p) is not None), None),
        "w_dims": next((value(call.nested((p,), "dimA")) for p in _W if call.top(p) is not None), None),
        "y_dims": next((value(call.nested((p,), "dimA")) for p in _Y if call.top(p) is not None), None),
        "time": call.time,
        "process": call.process,
        "thread": call.thread,
    }


def parse_log(source: str | Path, case: str = "") -> pd.DataFrame:
    """The kept calls of a cuDNN API log file (or its text) as a DataFrame with :data:`CALL_COLUMNS`."""
    if isinstance(source, Path):
        try:
            text = source.read_text(errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read the cuDNN log {source}: {exc.strerror}") from None
    else:
        text = source
    rows = [r for r in (call_row(c) for c in parse_calls(text)) if r is not None]
    df = pd.DataFrame(rows, columns=[c for c in CALL_COLUMNS if c != "case"])
    df.insert(0, "case", case)
    df["workspace_bytes"] = df["workspace_bytes"].astype("Int64")
    return df


def summarize(calls: pd.DataFrame) -> dict[str, Any]:
    """Per kind: number of calls, the algorithms (or engines) seen, and the largest workspace (bytes)."""
    out: dict[str, Any] = {}
    for kind, g in calls.groupby("kind"):
        ws = g["workspace_bytes"].dropna()
        out[str(kind)] = {
            "calls": len(g),
            "algorithms": sorted({str(a) for a in g["algo"].dropna()}),
            "max_workspace_bytes": int(ws.max()) if len(ws) else None,
        }
    return out
