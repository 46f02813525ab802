"""The shipped program files (workloads/files: gcn, uvmbench, uvmbench_torch, abc) and the path that runs them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.uvm.simulate import shipped_config, shipped_workload

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("gcn", "uvmbench", "uvmbench_torch", "abc")


def _trace(name: str, options: dict, iterations: int = 2):
    """The orchestrated trace of a shipped file as ``uvmlab run`` prepares it (RTX 5090, PCA off)."""
    from uvmlab.uvm.simulate import prepare

    return prepare(shipped_config(name, options, "RTX5090", 33_669_316_608, iterations=iterations)).trace


def test_the_files_ship_as_package_data_and_are_found_by_name() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "files/*.py" in data["workloads"]
    for name in SHIPPED:
        path = shipped_workload(name)
        assert path.parent.name == "files" and path.read_text().lstrip().startswith('"""')
        code = path.read_text()
        assert not re.search(r"^\s*(import|from) uvmlab", code, re.M), name  # a file imports nothing from uvmlab
    with pytest.raises(InputError, match="no shipped workload file 'nope'"):
        shipped_workload("nope")


def test_gcn_file_follows_the_script() -> None:
    """4.2M edges at 200k nodes: 3 chunks per aggregation, 4 aggregations (2 forward, 2 backward) per epoch."""
    tr = _trace("gcn", {"nodes": 200_000})
    k = tr.kernels
    comp = k[k["iteration"] >= 0]
    assert sorted(comp["iteration"].unique()) == [0, 1]
    assert (comp["name"] == "aten::index_add_").sum() == 2 * 4 * 3
    assert not (k["api"] == "prefetch").any()


def test_gcn_file_prefetch_option_prefetches_every_new_tensor() -> None:
    """The with-user-prefetch allocator: a prefetch to the GPU after every cudaMallocManaged (no budget)."""
    tr = _trace("gcn", {"nodes": 200_000, "prefetch": True})
    pre = tr.kernels[tr.kernels["api"] == "prefetch"]
    assert len(pre) > 0 and set(pre["api_arg"]) == {"gpu"}
    prefetched = set(tr.accesses.loc[tr.accesses["kernel_id"].isin(pre["kernel_id"]), "alloc_id"])
    device = tr.allocations[tr.allocations["size_bytes"] > 0]
    assert prefetched >= set(device["alloc_id"]) - set(
        device.loc[device["category"].isin(["workspace"]), "alloc_id"]
    )  # every tensor the program made (CUDA's own workspaces are not the allocator's)


@pytest.mark.parametrize(
    ("mode", "api"),
    [
        ("uvm", {("host_write", "")}),
        ("device", {("prefetch", "gpu")}),
        ("uvm_prefetch", {("host_write", ""), ("prefetch", "gpu")}),
        ("uvm_advise_read", {("host_write", ""), ("advise", "set_read_mostly")}),
        ("uvm_advise_pref_gpu", {("host_write", ""), ("advise", "set_preferred_location:gpu")}),
        ("uvm_advise_pref_cpu", {("host_write", ""), ("advise", "set_preferred_location:cpu")}),
        ("uvm_advise_access", {("host_write", ""), ("advise", "set_accessed_by:gpu")}),
    ],
)
def test_uvmbench_modes_are_api_calls_before_the_warmups(mode: str, api: set) -> None:
    tr = _trace("uvmbench", {"kernel": "seq_stream", "mode": mode, "size_factor": 0.01}, iterations=3)
    k = tr.kernels.sort_values("seq")
    calls = k[k["api"] != ""]
    assert set(zip(calls["api"], calls["api_arg"], strict=True)) == api
    launches = k[k["api"] == ""]
    assert len(launches) == 2 + 3  # 2 warm-ups (setup), then the timed launches (iterations 0..2)
    assert launches["iteration"].tolist() == [-1, -1, 0, 1, 2]
    assert calls["seq"].max() < launches["seq"].min()  # hints after the initialisation, before the warm-ups
    assert set(launches["order"]) == {"sequential"} and set(launches["threads"]) == {65536}
    assert set(launches["stride_bytes"]) == {4096}


def test_uvmbench_kernels_and_bad_options() -> None:
    rand = _trace("uvmbench", {"kernel": "rand_stream", "size_factor": 0.01, "stride_bytes": 64}).kernels
    launch = rand[rand["api"] == ""]
    assert set(launch["order"]) == {"lcg"} and set(launch["seed"]) == {0x12345678}
    assert set(launch["stride_bytes"]) == {4096}  # rand_chunk_kernel probes one element per page whatever the stride
    chase = _trace("uvmbench", {"kernel": "pointer_chase", "size_factor": 0.01}).kernels
    assert chase.sort_values("seq")["order"].tolist()[0] == "address"  # init_chunks_kernel, grid-stride
    assert not (chase["api"] == "host_write").any()  # the nodes are written by a GPU kernel
    for bad, match in (
        ({"kernel": "zigzag"}, "unknown uvmbench kernel"),
        ({"mode": "uvm_magic"}, "unknown uvmbench mode"),
        ({"mode": "device", "size_factor": 0.9}, r"device mode above size_factor 0\.8"),
    ):
        with pytest.raises(InputError, match=match):
            _trace("uvmbench", {"size_factor": 0.01, **bad})


def test_abc_file_reproduces_the_logged_fault_counts_without_the_logs() -> None:
    """96 faults, 64 reads (a and b: two VA blocks) and 32 writes (c: one), through the path of uvmlab run."""
    from uvmlab.validate.titanv_checks import simulate_abc

    result, batches = simulate_abc()
    assert (result["fault_count"], result["read_fault_count"], result["write_fault_count"]) == (96, 64, 32)
    assert sum(b for k, _, b in batches if k == "read") == 2 and sum(b for k, _, b in batches if k == "write") == 1
    assert result["setup_fault_count"] == 0  # the host writes of setup are not GPU faults
