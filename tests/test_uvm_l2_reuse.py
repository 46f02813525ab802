"""Relaunches served from the L2 (uvmlab.sim.uvm.l2_reuse): the rule, its native time, the replay's check that the
pages did not move, and uvmbench's pointer chase through ``uvmlab run``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.test_native_time import one, work
from tests.uvm_program import Program
from uvmlab.cli import main
from uvmlab.gpus import GPUS, custom_gpu, spec_dict
from uvmlab.sim.uvm.l2_reuse import L2_OVER_DRAM, LINE_BYTES, l2_lines, l2_relaunches
from uvmlab.sim.uvm.timing import CostParams

MiB = 1 << 20
A100 = GPUS["A100-80GB"]
FILES = Path(__file__).resolve().parents[1] / "workloads" / "files"
NO_FLOOR = CostParams(kernel_min_ns=1.0)


def test_catalogue_gpus_have_their_l2() -> None:
    assert GPUS["RTX5090"].l2_bytes == 96 * MiB and A100.l2_bytes == 40 * MiB
    assert GPUS["H200"].l2_bytes == 50 * MiB and GPUS["V100-32GB"].l2_bytes == 6 * MiB
    assert all(g.l2_bytes > 0 for g in GPUS.values())
    mine = custom_gpu(A100, {"l2_bytes": "8MiB"})
    assert mine.l2_bytes == 8 * MiB and spec_dict(mine)["l2_bytes"] == 8 * MiB


def test_a_lone_sector_takes_a_whole_line() -> None:
    assert l2_lines(np.array([32_000.0, 128_000.0]), np.array([True, False])).tolist() == [1000, 1000]


def _relaunches(names, rows, touched, plain=None, lone=None, gpu=A100) -> list[bool]:
    n = len(names)
    plain = np.ones(n, dtype=bool) if plain is None else np.asarray(plain)
    lone = np.zeros(n, dtype=bool) if lone is None else np.asarray(lone)
    found = l2_relaunches(names, lambda i: rows[i], np.asarray(touched, dtype=float), plain, lone, gpu)
    return [i in found for i in range(n)]


def test_a_relaunch_is_the_same_launch_right_after_itself_within_the_l2() -> None:
    x, y = [(0, 0, MiB, False)], [(1, 0, MiB, False)]
    assert _relaunches(["k", "k", "k"], [x, x, x], [MiB] * 3) == [False, True, True]
    assert _relaunches(["k", "j"], [x, x], [MiB] * 2) == [False, False]  # another kernel
    assert _relaunches(["k", "k"], [x, y], [MiB] * 2) == [False, False]  # other data
    assert _relaunches(["k", "k"], [x, x], [MiB, MiB / 2]) == [False, False]  # other bytes
    assert _relaunches(["k", "h", "k"], [x, x, x], [MiB] * 3, plain=[True, False, True]) == [False] * 3  # API between
    big = A100.l2_bytes + LINE_BYTES
    assert _relaunches(["k", "k"], [x, x], [big] * 2) == [False, False]  # lines beyond the L2
    lone = A100.l2_bytes // LINE_BYTES * 32 + 32  # one line per 32 B sector: one line too many
    assert _relaunches(["k", "k"], [x, x], [lone] * 2, lone=[True, True]) == [False, False]
    assert _relaunches(["k", "k"], [x, x], [lone - 32] * 2, lone=[True, True]) == [False, True]
    assert _relaunches(["k", "k"], [x, x], [MiB] * 2, gpu=custom_gpu(A100, {"l2_bytes": 0})) == [False, False]


def test_a_relaunch_moves_its_bytes_at_the_l2_rate() -> None:
    nbytes = 32 * MiB
    t_dram, c_dram = one(work(nbytes=nbytes), costs=NO_FLOOR)
    t_l2, c_l2 = one(work(nbytes=nbytes, l2=True), costs=NO_FLOOR)
    assert (c_dram, c_l2) == ("memory", "l2")
    assert t_l2 == pytest.approx(nbytes / (A100.hbm_bytes_per_s * L2_OVER_DRAM) * 1e9)
    assert t_l2 < t_dram / L2_OVER_DRAM * 1.0001
    t, cls = one(work(nbytes=nbytes, efficiency=0.25, l2=True), costs=NO_FLOOR)  # a declared efficiency wins
    assert cls == "memory" and t == pytest.approx(nbytes / (A100.hbm_bytes_per_s * 0.25) * 1e9)
    t, cls = one(work(nbytes=MiB, l2=True))  # the launch floor still holds
    assert (t, cls) == (CostParams().kernel_min_ns, "launch")


def _relaunch_program(between: str = "") -> Program:
    p = Program({"x": 16 * MiB, "y": 16 * MiB})
    p.kernel(reads=("x",), writes=("y",))
    if between:
        p.api(between, "x")
    p.kernel(reads=("x",), writes=("y",))
    return p


def test_the_replay_serves_a_resident_relaunch_from_the_l2() -> None:
    _, k = _relaunch_program().run(1 << 30, costs=NO_FLOOR)
    assert k["kernel_class"].tolist() == ["memory", "l2"]
    mem = NO_FLOOR.for_gpu(A100).memory_efficiency
    assert k["native_ns"].iloc[1] == pytest.approx(k["native_ns"].iloc[0] * mem / L2_OVER_DRAM)
    _, k = _relaunch_program("host_write").run(1 << 30, costs=NO_FLOOR)  # the host changed x between
    assert k["kernel_class"].tolist() == ["memory", "api", "memory"]
    _, k = _relaunch_program().run(1 << 30, gpu=custom_gpu(A100, {"l2_bytes": "16MiB"}), costs=NO_FLOOR)
    assert k["kernel_class"].tolist() == ["memory", "memory"]  # 32 MiB of lines in a 16 MiB L2


def test_a_relaunch_whose_pages_moved_is_a_dram_kernel() -> None:
    """16 MiB of GPU memory for 32 MiB of data: the second launch faults its evicted pages back (new physical
    lines), so it is timed at the DRAM rate like the first."""
    _, k = _relaunch_program().run(16 * MiB, costs=NO_FLOOR)
    assert k["fault_count"].iloc[1] > 0
    assert k["kernel_class"].tolist() == ["memory", "memory"]
    assert k["native_ns"].iloc[1] == pytest.approx(k["native_ns"].iloc[0])


def _chase(tmp_path: Path, gpu: str) -> pd.DataFrame:
    out = tmp_path / gpu
    args = ["run", str(FILES / "uvmbench.py"), "--option", "kernel=pointer_chase", "--option", "size_factor=0.25"]
    args += ["--gpu", gpu, "--oversub", "0.25", "-n", "3", "--sim-option", "sim_scale=64", "-o", str(out)]
    assert main(args) == 0
    k = pd.read_parquet(out / "tables" / "kernels.parquet")
    return k[k["name"] == "pointer_chunk_kernel"]


def test_uvmbench_pointer_chase_relaunches_from_the_l2_where_its_lines_fit(tmp_path: Path) -> None:
    """Through ``uvmlab run`` on the shipped file: the chase's 589,824 lone sectors take 72 MiB of lines, within the
    RTX 5090's 96 MiB L2 (every launch after the first at the launch floor: measured 0.009 ms) and beyond the
    A100's 40 MiB (the lone-sector DRAM rate). Before the rule both were DRAM kernels (0.082 ms on the RTX 5090)."""
    rtx = _chase(tmp_path, "RTX5090")
    assert rtx["kernel_class"].iloc[1:].eq("launch").all()
    assert rtx["duration_ns"].iloc[1:].max() == pytest.approx(CostParams().kernel_min_ns)
    a100 = _chase(tmp_path, "A100-80GB")
    assert a100["kernel_class"].eq("sector").all()
    assert a100["duration_ns"].iloc[-1] > 2 * CostParams().kernel_min_ns
