"""Conservation invariants of the UVM simulator (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvm_synth import make_trace, nocache_placement, pool_placement

from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs
from uvmlab.sim.uvm.replay import peak_managed_bytes, replay

MiB = 1 << 20
GPU = GPUS["A100-80GB"]

op = st.one_of(
    st.tuples(st.just("map"), st.integers(1, 6 * MiB)),
    st.tuples(st.just("unmap"), st.integers(0, 20)),
    st.tuples(st.just("access"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB), st.booleans()),
    st.tuples(st.just("memcpy"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB)),
    st.tuples(st.just("host"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, MiB)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity_mib=st.integers(2, 12),
    prefetch=st.booleans(),
    per_batch=st.integers(1, 300),
    ops=st.lists(op, min_size=1, max_size=40),
)
def test_random_operations_keep_invariants(capacity_mib: int, prefetch: bool, per_batch: int, ops: list) -> None:
    """Resident bytes never exceed capacity; every byte copied to the host was resident on the GPU."""
    sim = UvmSim(capacity_mib * MiB, UvmKnobs(prefetch_enable=prefetch, batch_unique_pages=per_batch))
    sizes: dict[int, int] = {}
    next_id = 0
    for o in ops:
        live = sorted(sizes)
        if o[0] == "map":
            sim.map_range(next_id, o[1])
            sizes[next_id] = o[1]
            next_id += 1
        elif not live:
            continue
        else:
            rid = live[o[1] % len(live)]
            if o[0] == "unmap":
                sim.unmap_range(rid)
                del sizes[rid]
                continue
            off = o[2] % sizes[rid]
            size = min(o[3], sizes[rid] - off)
            before = sim.totals.dtoh_bytes
            if o[0] == "access":
                c = sim.access([(rid, off, size, o[4])])
                assert c.fault_count == c.read_fault_count + c.write_fault_count
                # a faulted page is migrated or zero-filled: faults never exceed the pages made resident
                assert c.fault_count * PAGE_BYTES <= c.htod_bytes + c.zero_fill_bytes
            elif o[0] == "memcpy":
                assert sim.memcpy_htod(rid, off, size).fault_count == 0
            else:
                sim.host_write(rid, off, size)
            assert sim.totals.dtoh_bytes >= before
        assert sim.used_bytes <= sim.capacity_bytes
        assert sim.totals.dtoh_bytes <= sim.populated_gpu_bytes
        assert sim.mapped_bytes == sum(sizes.values())
        sim.check_invariants()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_layers=st.integers(1, 4),
    param_mb=st.integers(1, 6),
    act_mb=st.integers(1, 6),
    factor=st.sampled_from([0.5, 0.8, 1.0]),
    pca=st.booleans(),
    prefetch=st.booleans(),
)
def test_no_oversubscription_no_eviction(
    n_layers: int, param_mb: int, act_mb: int, factor: float, pca: bool, prefetch: bool
) -> None:
    """Factor <= 1: nothing evicted. PCA on: iterations after the first have no faults and no UM migrations.
    PCA off: the faults are first-touch write faults on fresh allocations (zero-fill, no HtoD bytes)."""
    trace = make_trace(n_iter=3, param_mb=param_mb, act_mb=act_mb, n_layers=n_layers)
    place = pool_placement(trace) if pca else nocache_placement(trace)
    footprint = peak_managed_bytes(place.ranges)
    res = replay(trace, place, int(footprint / factor), GPU, UvmKnobs(prefetch_enable=prefetch), check_every=1)
    its = res.iterations
    assert res.totals.eviction_count == 0 and res.totals.dtoh_bytes == 0
    assert res.peak_resident_bytes <= footprint
    if pca:
        later = its[its["iteration"] >= 1]
        assert (later["fault_count"] == 0).all()
        assert (later["htod_bytes"] == 0).all() and (later["dtoh_bytes"] == 0).all()
        assert (later["memcpy_htod_bytes"] > 0).all()  # only the retained input copies remain
    else:
        assert (its["read_fault_count"] == 0).all()
        assert (its["write_fault_count"] > 0).all()
        assert res.totals.htod_bytes == 0
        assert (its["zero_fill_bytes"] > 0).all()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factor=st.sampled_from([1.5, 2.0, 3.0, 5.0]), pca=st.booleans())
def test_oversubscribed_runs_conserve_bytes(factor: float, pca: bool) -> None:
    trace = make_trace(n_iter=2, param_mb=6, act_mb=5, n_layers=4)
    place = pool_placement(trace) if pca else nocache_placement(trace)
    footprint = peak_managed_bytes(place.ranges)
    res = replay(trace, place, int(footprint / factor), GPU, check_every=1)
    assert res.peak_resident_bytes <= int(footprint / factor)
    assert res.totals.eviction_count > 0
    assert res.totals.dtoh_bytes <= res.totals.htod_bytes + res.totals.zero_fill_bytes + res.totals.memcpy_htod_bytes
