"""Workload programs (workloads/program.py): what each call records, bad input, the trace round trip."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uvmlab.cli import main
from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.sim.uvm.advice import ADVICE
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.schema import ACCESS_ORDERS, KERNEL_OPTIONAL, read_trace, write_trace
from workloads.program import ADVICES, LOCATED, PATTERNS, Program
from workloads.registry import load_workload

MIB = 1 << 20


def program_file(tmp_path: Path, body: str, name: str = "prog", head: str = "") -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(head + "def program(uvm, cfg, options):\n    import torch\n\n" + textwrap.indent(body, "    "))
    return f


def capture(tmp_path: Path, body: str, iterations: int = 2, name: str = "prog", **kw: object):
    f = program_file(tmp_path, body, name)
    return capture_trace(WorkloadConfig(str(f), iterations=iterations, **kw))


# ---- what each call records -------------------------------------------------------------------------------
EVERY_CALL = """\
a = torch.empty(1 << 20, device=uvm.device)          # 4 MiB
b = torch.empty(1 << 20, device=uvm.device)
idx = torch.empty(1024, dtype=torch.int64, device=uvm.device)
uvm.host_write(a)
uvm.host_read(a, offset=4096, nbytes=8192)
uvm.prefetch(a, "gpu")
uvm.prefetch(b[1024:], "cpu")
uvm.advise(a, "set_read_mostly")
uvm.advise(b, "set_preferred_location", "cpu")
uvm.advise(b, "set_accessed_by", "gpu", offset=0, nbytes=1 << 20)
uvm.advise(b, "unset_accessed_by", "cpu")
uvm.advise(b, "unset_preferred_location")
uvm.advise(a, "unset_read_mostly")
for it in uvm.iterations():
    uvm.kernel("gather", reads=[idx, a], writes=[b], pattern="gather", threads=1024, warp_size=32,
               stride_bytes=4, seed=7, flops=1e6, touched_bytes=65536.0)
    c = a * 2.0
    uvm.host_write(a[::2])
uvm.kernel("tile", reads=[a, b], writes=[c], pattern="tiled")
uvm.host_read(c)
"""


@pytest.fixture(scope="module")
def every_call(tmp_path_factory: pytest.TempPathFactory):
    return capture(tmp_path_factory.mktemp("every"), EVERY_CALL, iterations=2)


def test_each_call_is_one_row_with_its_api_columns(every_call) -> None:
    k = every_call.kernels
    calls = k[k["api"] != ""]
    expected = [
        ("host_write", "host_write", ""),
        ("host_read", "host_read", ""),
        ("cudaMemPrefetchAsync", "prefetch", "gpu"),
        ("cudaMemPrefetchAsync", "prefetch", "cpu"),
        ("cudaMemAdvise", "advise", "set_read_mostly"),
        ("cudaMemAdvise", "advise", "set_preferred_location:cpu"),
        ("cudaMemAdvise", "advise", "set_accessed_by:gpu"),
        ("cudaMemAdvise", "advise", "unset_accessed_by:cpu"),
        ("cudaMemAdvise", "advise", "unset_preferred_location"),
        ("cudaMemAdvise", "advise", "unset_read_mostly"),
        ("host_write", "host_write", ""),  # iteration 0
        ("host_write", "host_write", ""),  # iteration 1
        ("host_read", "host_read", ""),
    ]
    assert list(zip(calls["name"], calls["api"], calls["api_arg"], strict=True)) == expected
    assert set(calls.loc[calls["api"] == "advise", "api_arg"]) <= set(ADVICE)
    # API rows carry no access order or launch shape
    assert (calls["order"] == "").all() and (calls["threads"] == 0).all()


def test_phases_and_iteration_numbers(every_call) -> None:
    k = every_call.kernels
    setup = k[k["phase"] == "setup"]
    assert (setup["iteration"] == -1).all() and len(setup[setup["api"] != ""]) == 10
    compute = k[k["phase"] == "compute"]
    assert set(compute["iteration"]) == {0, 1}
    g = compute[compute["name"] == "gather"]
    assert list(g["iteration"]) == [0, 1]
    # after the loop: the last iteration's number and phase
    tail = k[k["name"].isin(["tile"]) | ((k["api"] == "host_read") & (k["phase"] == "compute"))]
    assert list(tail["iteration"]) == [1, 1]


def test_a_declared_kernel_carries_its_launch_columns_and_accesses(every_call) -> None:
    t = every_call
    g = t.kernels[t.kernels["name"] == "gather"].iloc[0]
    assert (g["order"], g["threads"], g["warp_size"], g["stride_bytes"], g["seed"]) == ("gather", 1024, 32, 4, 7)
    assert g["flops"] == 1e6 and g["touched_bytes"] == 65536.0 and g["api"] == ""
    acc = t.accesses[t.accesses["kernel_id"] == g["kernel_id"]]
    sizes = dict(zip(acc["alloc_id"], acc["size_bytes"], strict=True))
    assert list(acc["is_write"]) == [False, False, True]  # reads then writes, in the order given
    assert sorted(sizes.values()) == [8192, 4 * MIB, 4 * MIB]
    tile = t.kernels[t.kernels["name"] == "tile"].iloc[0]
    # defaults: threads 0 (derived), one warp of 32, one access per 4 KiB page, touched bytes NaN (the rule's)
    assert (tile["order"], tile["threads"], tile["warp_size"], tile["stride_bytes"]) == ("tiled", 0, 32, 4096)
    assert math.isnan(tile["touched_bytes"])
    # torch ops keep the derived order ""
    assert set(t.kernels.loc[t.kernels["name"] == "aten::mul", "order"]) == {""}


def test_byte_ranges_follow_views_and_offsets(every_call) -> None:
    t = every_call
    k, acc = t.kernels, t.accesses

    def ranges(kid: int) -> list[tuple[int, int]]:
        a = acc[acc["kernel_id"] == kid]
        return list(zip(a["offset_bytes"], a["size_bytes"], strict=True))

    calls = k[k["api"] != ""].reset_index(drop=True)
    assert ranges(calls.loc[0, "kernel_id"]) == [(0, 4 * MIB)]  # host_write(a)
    assert ranges(calls.loc[1, "kernel_id"]) == [(4096, 8192)]  # host_read(a, offset=4096, nbytes=8192)
    assert ranges(calls.loc[3, "kernel_id"]) == [(4096, 4 * MIB - 4096)]  # prefetch(b[1024:]): a view's bytes
    assert ranges(calls.loc[6, "kernel_id"]) == [(0, MIB)]  # advise(..., nbytes=1 << 20)
    # a strided view (a[::2]): from its first element to the end of its last one
    assert ranges(calls.loc[10, "kernel_id"]) == [(0, 4 * MIB - 4)]


def test_categories_of_program_allocations(every_call) -> None:
    al = every_call.allocations.set_index("alloc_id")
    k, acc = every_call.kernels, every_call.accesses
    hw = k[k["api"] == "host_write"].iloc[0]["kernel_id"]
    a_id = acc[acc["kernel_id"] == hw]["alloc_id"].iloc[0]
    assert al.loc[a_id, "category"] == "other"  # made in setup, alive at its end
    # c = a * 2.0: alive at the end of its iteration (iteration 0's until iteration 1 rebinds c; the last one's
    # until the program returns, after the loop's end)
    for it in (0, 1):
        mul = k[(k["name"] == "aten::mul") & (k["iteration"] == it)].iloc[0]["kernel_id"]
        c = acc[(acc["kernel_id"] == mul) & acc["is_write"]]["alloc_id"].iloc[0]
        assert al.loc[c, "category"] == "activation" and al.loc[c, "iteration"] == it
    made_in_0 = al[(al["phase"] == "compute") & (al["iteration"] == 0)]
    assert set(made_in_0["category"]) <= {"temporary", "activation"} and len(made_in_0)
    assert every_call.header["parameter_count"] == 0


def test_the_last_iteration_ends_where_the_loop_ends(tmp_path: Path) -> None:
    """A tensor made in the last iteration and alive when the loop ends is an activation like the others (the loop's
    end, not the program's return, ends it), also when the loop is left by ``break``; one made after the loop is
    not (it was made in no iteration)."""
    t = capture(
        tmp_path,
        "for it in uvm.iterations(5):\n    c = torch.empty(1024, device=uvm.device)\n    uvm.host_write(c)\n"
        "    if it == 2:\n        break\nd = torch.empty(2048, device=uvm.device)\nuvm.host_write(d)\n",
        iterations=5,
    )
    al = t.allocations
    made = al[al["phase"] == "compute"].sort_values("alloc_seq")
    assert list(made["size_bytes"]) == [4096, 4096, 4096, 8192]
    assert list(made["iteration"]) == [0, 1, 2, 2]  # d: after the loop, labelled with the last iteration's number
    assert list(made["category"]) == ["activation", "activation", "activation", "temporary"]
    assert t.kernels["iteration"].max() == 2


def test_prefetch_new_allocations_adds_a_prefetch_row_after_each_allocation(tmp_path: Path) -> None:
    t = capture(
        tmp_path,
        "uvm.prefetch_new_allocations(True)\na = torch.empty(1024, device=uvm.device)\n"
        "b = torch.empty(2048, device=uvm.device)\nuvm.prefetch_new_allocations(False)\n"
        "c = torch.empty(4096, device=uvm.device)\nfor it in uvm.iterations():\n"
        '    uvm.kernel("k", reads=[a, b, c])\n',
        iterations=1,
    )
    pf = t.kernels[t.kernels["api"] == "prefetch"]
    assert list(pf["api_arg"]) == ["gpu", "gpu"]
    sizes = t.accesses[t.accesses["kernel_id"].isin(pf["kernel_id"])]["size_bytes"].tolist()
    assert sizes == [4096, 8192]


# ---- bad input: one sentence, InputError ------------------------------------------------------------------
BAD_CALLS = {
    "unknown advice": ('uvm.advise(a, "set_fast")', "unknown advice 'set_fast'"),
    "missing location": ('uvm.advise(a, "set_accessed_by")', "needs location 'gpu' or 'cpu', not None"),
    "bad location": ('uvm.advise(a, "set_preferred_location", "disk")', "needs location 'gpu' or 'cpu'"),
    "extra location": ('uvm.advise(a, "set_read_mostly", "gpu")', "takes no location (got 'gpu')"),
    "prefetch target": ('uvm.prefetch(a, "disk")', "must be 'gpu' or 'cpu', not 'disk'"),
    "unknown pattern": ('uvm.kernel("k", reads=[a], pattern="zigzag")', "pattern must be one of"),
    "zero threads": ('uvm.kernel("k", reads=[a], threads=0)', "threads must be a whole number >= 1, not 0"),
    "float threads": ('uvm.kernel("k", reads=[a], threads=2.5)', "threads must be a whole number >= 1, not 2.5"),
    "bad stride": ('uvm.kernel("k", reads=[a], stride_bytes=-4)', "stride_bytes must be a whole number >= 1"),
    "bad warp": ('uvm.kernel("k", reads=[a], warp_size=True)', "warp_size must be a whole number >= 1"),
    "bad seed": ('uvm.kernel("k", reads=[a], seed=-1)', "seed must be a whole number >= 0, not -1"),
    "no name": ('uvm.kernel("", reads=[a])', "needs a name"),
    "no tensors": ('uvm.kernel("k")', "reads and writes nothing"),
    "not a tensor": ("uvm.host_write([1, 2])", "takes a torch tensor, not list"),
    "cpu tensor": ('uvm.prefetch(torch.empty(4), "gpu")', "the tensor is on cpu, not on uvm.device (meta)"),
    "past the end": ("uvm.host_read(a, offset=4096, nbytes=1)", "bytes 4096..4097 lie outside the tensor's 4096 bytes"),
    "negative offset": ("uvm.host_write(a, offset=-4)", "lie outside the tensor's 4096 bytes"),
    "bad iterations": ("list(uvm.iterations(-1))", "uvm.iterations(n) needs a whole number n >= 0, not -1"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_calls_are_one_sentence(case: str, tmp_path: Path) -> None:
    call, message = BAD_CALLS[case]
    with pytest.raises(InputError) as info:
        capture(tmp_path, f"a = torch.empty(1024, device=uvm.device)\n{call}\n", iterations=1)
    text = str(info.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize("case", ["unknown advice", "unknown pattern", "past the end", "cpu tensor"])
def test_bad_calls_exit_2_through_the_cli(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    call, message = BAD_CALLS[case]
    f = program_file(tmp_path, f"a = torch.empty(1024, device=uvm.device)\n{call}\n")
    assert main(["trace", str(f), "-n", "1", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("uvmlab: error: ") and message in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_file_with_both_build_and_program_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = program_file(tmp_path, "pass\n", head="def build(cfg, device, options):\n    return None\n\n\n")
    with pytest.raises(InputError, match="defines both build\\(\\) and program\\(\\)"):
        load_workload(str(f))
    assert main(["run", str(f), "-n", "1", "--mode", "sim", "-o", str(tmp_path / "run")]) == 2
    assert "defines both build() and program()" in capsys.readouterr().err


@pytest.mark.parametrize("signature", ["uvm, cfg", "uvm, cfg, options, extra", ""])
def test_a_program_with_the_wrong_signature_is_refused(signature: str, tmp_path: Path) -> None:
    f = tmp_path / "wrong.py"
    f.write_text(f"def program({signature}):\n    pass\n")
    with pytest.raises(InputError, match="program must take \\(uvm, cfg, options\\)"):
        load_workload(str(f))


def test_checkpoint_on_a_program_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = "a = torch.empty(1024, device=uvm.device)\nuvm.host_write(a)\n"
    with pytest.raises(InputError, match="--checkpoint applies to a model's training loop"):
        capture(tmp_path, body, iterations=1, checkpoint="auto")
    f = program_file(tmp_path, body, name="ck")
    assert main(["trace", str(f), "-n", "1", "--checkpoint", "auto", "-o", str(tmp_path / "o")]) == 2
    assert "--checkpoint applies to a model's training loop" in capsys.readouterr().err


def test_a_program_has_no_model_to_build(tmp_path: Path) -> None:
    spec = load_workload(str(program_file(tmp_path, "pass\n")))
    assert spec.is_program
    with pytest.raises(InputError, match="is a program"):
        spec.build(WorkloadConfig(str(tmp_path / "prog.py")), "meta")


def test_program_constants_agree_with_the_schema_and_the_driver_model() -> None:
    assert set(PATTERNS) == set(ACCESS_ORDERS) - {""}
    located = {f"{a}:{loc}" for a in LOCATED for loc in ("gpu", "cpu")}
    assert located | (set(ADVICES) - set(LOCATED)) == set(ADVICE)


# ---- the trace round trip ---------------------------------------------------------------------------------
def test_write_and_read_keep_the_optional_columns(every_call, tmp_path: Path) -> None:
    out = write_trace(every_call, tmp_path / "trace")
    back = read_trace(out)
    cols = list(KERNEL_OPTIONAL)
    a, b = every_call.kernels[cols], back.kernels[cols]
    for c in cols:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), c
        else:
            assert list(x) == list(y), c
    assert (back.kernels["order"] == "gather").sum() == 2


def test_an_older_trace_without_the_optional_columns_reads_with_defaults(every_call, tmp_path: Path) -> None:
    out = write_trace(every_call, tmp_path / "old")
    path = out / "kernels.parquet"
    table = pq.read_table(path)
    old = table.drop_columns([c for c in KERNEL_OPTIONAL if c in table.column_names])
    pq.write_table(old.replace_schema_metadata(table.schema.metadata), path)
    back = read_trace(out)
    for col, (_, default) in KERNEL_OPTIONAL.items():
        values = back.kernels[col]
        if isinstance(default, float) and math.isnan(default):
            assert values.isna().all(), col
        else:
            assert (values == default).all(), col
    assert len(back.kernels) == len(every_call.kernels)


# ---- property: one row per call, ranges inside their allocation --------------------------------------------
@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[tuple]]:
    """Tensors (elements, slice step) and a sequence of valid calls on them with random byte windows."""
    tensors = draw(st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 3)), min_size=1, max_size=3))
    calls = []
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(tensors) - 1))
        kind = draw(st.sampled_from(["host_write", "host_read", "prefetch", "advise", "kernel"]))
        frac = draw(st.tuples(st.floats(0, 0.99), st.floats(0.01, 1)))
        extra = draw(st.sampled_from(ADVICE)) if kind == "advise" else draw(st.sampled_from(["gpu", "cpu"]))
        calls.append((kind, i, frac, extra))
    return tensors, calls


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prog=programs())
def test_any_valid_call_sequence_records_one_row_per_call_inside_its_allocation(prog, tmp_path: Path) -> None:
    import torch

    from uvmlab.trace.recorder import Recorder

    tensors, calls = prog
    rec = Recorder("meta")
    with rec:
        uvm = Program("meta", WorkloadConfig("x.py", iterations=1), recorder=rec)
        base = [torch.empty(n * step, device="meta") for n, step in tensors]
        views = [b[::step] for b, (_, step) in zip(base, tensors, strict=True)]
        for kind, i, (f0, f1), extra in calls:
            v = views[i]
            span = (v.numel() - 1) * v.stride(0) * 4 + 4
            off = int(f0 * span) // 4 * 4
            nbytes = max(1, int(f1 * (span - off)))
            if kind == "host_write":
                uvm.host_write(v, offset=off, nbytes=nbytes)
            elif kind == "host_read":
                uvm.host_read(v, offset=off, nbytes=nbytes)
            elif kind == "prefetch":
                uvm.prefetch(v, extra, offset=off, nbytes=nbytes)
            elif kind == "advise":
                advice, _, loc = extra.partition(":")
                uvm.advise(v, advice, loc or None, offset=off, nbytes=nbytes)
            else:
                uvm.kernel("k", reads=[v], writes=[views[0]], pattern="sequential")
    rec.close()
    sizes = rec.a_size
    n_rows = len(rec.k_seq)
    assert n_rows == len(calls)
    per_kernel = {}
    for kid, aid, off, size in zip(rec.x_kernel, rec.x_alloc, rec.x_offset, rec.x_size, strict=True):
        per_kernel[kid] = per_kernel.get(kid, 0) + 1
        assert off >= 0 and size > 0 and off + size <= sizes[aid]
    for kid, (kind, *_rest) in enumerate(calls):
        assert per_kernel[kid] == (2 if kind == "kernel" else 1)


def test_a_capture_leaves_the_heap_freeze_as_it_found_it(tmp_path: Path) -> None:
    """A capture freezes the heap that existed before it (so the gc.collect at each iteration end scans only the
    capture's objects) and unfreezes it after, unless an enclosing frozen_heap() (the evaluation loops) is open."""
    import gc

    from uvmlab.trace.heap import frozen_heap

    body = "x = torch.empty(1024, device=uvm.device)\nfor _ in uvm.iterations():\n    x.add_(1)\n"
    assert gc.get_freeze_count() == 0
    t = capture(tmp_path, body, iterations=3)
    assert len(t.kernels) >= 3 and gc.get_freeze_count() == 0
    with frozen_heap():
        frozen = gc.get_freeze_count()
        capture(tmp_path, body, iterations=3, name="again")
        assert gc.get_freeze_count() >= frozen > 0  # the enclosing freeze is the enclosing one's to undo
    assert gc.get_freeze_count() == 0
