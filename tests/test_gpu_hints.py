"""uvmlab.measure.gpu.hints: what the GPU worker calls for the per-tensor hint policies (fake runtime, CPU torch)."""

from __future__ import annotations

import ctypes

import pytest

from uvmlab.advise.policies import POLICIES, compose
from uvmlab.errors import InputError
from uvmlab.measure.gpu.hints import (
    ADVISE_ACCESSED_BY,
    ADVISE_PREFERRED_LOCATION,
    ADVISE_READ_MOSTLY,
    CPU_DEVICE_ID,
    HINTS_ENV,
    CudaRuntime,
    Hints,
    hints_from_env,
)

torch = pytest.importorskip("torch")


class FakeRt:
    """CudaRuntime's methods, recorded in order (``log``); handles are small numbers."""

    def __init__(self) -> None:
        self.advised: list[tuple[int, int, int, int]] = []
        self.prefetched: list[tuple[int, int, int, int]] = []
        self.log: list[tuple] = []
        self._next = 100

    def advise(self, ptr: int, n: int, advice: int, device: int) -> None:
        self.advised.append((ptr, n, advice, device))

    def prefetch(self, ptr: int, n: int, device: int, stream: int) -> None:
        self.prefetched.append((ptr, n, device, stream))
        self.log.append(("prefetch", stream))

    def _new(self) -> int:
        self._next += 1
        return self._next

    def stream_create(self) -> int:
        return self._new()

    def event_create(self) -> int:
        return self._new()

    def event_record(self, event: int, stream: int) -> None:
        self.log.append(("record", event, stream))

    def stream_wait_event(self, stream: int, event: int) -> None:
        self.log.append(("wait", stream, event))


def _job() -> tuple[object, object]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.Adam(model.parameters())


def _step(model: object, opt: object) -> None:
    loss = model(torch.randn(2, 8)).sum()  # type: ignore[operator]
    loss.backward()
    opt.step()  # type: ignore[attr-defined]


def _hints(names: list[str], rt: FakeRt) -> Hints:
    return Hints(names, rt, 0, lambda: 7, select=lambda t: True)


def test_read_mostly_advises_every_parameter_once() -> None:
    model, _ = _job()
    rt = FakeRt()
    _hints(["read-mostly-parameters"], rt).on_built(model)
    params = list(model.parameters())  # type: ignore[attr-defined]
    assert [a[0] for a in rt.advised] == [p.data_ptr() for p in params]
    assert {a[2] for a in rt.advised} == {ADVISE_READ_MOSTLY}
    assert [a[1] for a in rt.advised] == [p.numel() * p.element_size() for p in params]


def test_advice_spans_are_the_views_own_bytes_rounded_to_pages_by_cuda() -> None:
    """Issue 43 defect 9: a span was data_ptr + the whole storage's size, which runs past the storage's end for a
    view with an offset (and advises its neighbours): now the view's own bytes; CUDA rounds each advised range out
    to CPU pages, which ``advised_pages`` records (the neighbours on the first and last page get the advice)."""
    from uvmlab.measure.gpu.hints import page_span, view_span

    flat = torch.zeros(4096)  # 16 KiB of float32: four 4 KiB pages (its own storage)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(flat[1000:1100])  # a view at byte offset 4000: bytes 4000..4400
    rt = FakeRt()
    h = _hints(["read-mostly-parameters"], rt)
    h.on_built(model)
    base = flat.data_ptr()
    assert rt.advised == [(base + 4000, 400, ADVISE_READ_MOSTLY, 0)]  # not (base + 4000, 16384)
    assert view_span(flat[::2]) == (base, (2047 * 2 + 1) * 4)  # a strided view reaches its last element
    assert view_span(flat[5:5])[1] == 0  # nothing to advise
    assert page_span(4096 * 10 + 4000, 400) == (4096 * 10, 2 * 4096)  # crosses a page boundary: two pages
    assert page_span(4096 * 10 + 8, 400) == (4096 * 10, 4096)
    lo, n = page_span(base + 4000, 400)
    assert sorted(h.advised_pages) == list(range(lo, lo + n, 4096))


def test_remote_optimizer_state_advises_the_state_after_the_first_step_only() -> None:
    model, opt = _job()
    rt = FakeRt()
    h = _hints(["remote-optimizer-state"], rt)
    _step(model, opt)
    h.after_step(opt, 0)
    n_state = sum(1 for st in opt.state.values() for t in st.values() if t.numel() > 1)  # type: ignore[attr-defined]
    assert n_state == 8  # exp_avg and exp_avg_sq of 4 parameters (the scalar step counters are skipped)
    assert len(rt.advised) == 2 * n_state
    assert rt.advised[0][2:] == (ADVISE_PREFERRED_LOCATION, CPU_DEVICE_ID)
    assert rt.advised[1][2:] == (ADVISE_ACCESSED_BY, 0)
    h.after_step(opt, 1)
    assert len(rt.advised) == 2 * n_state


def test_prefetch_hooks_fetch_the_next_module_ahead_and_the_state_before_the_step() -> None:
    """Issue 43 defect 5: the prefetches went on the compute stream (7), so the next kernel waited for them and
    nothing overlapped. Now: on a side stream, after an event marking the compute stream's queued work, with a
    done event the compute stream waits for right before the prefetched module runs."""
    model, opt = _job()
    rt = FakeRt()
    h = _hints(["prefetch-next-kernel"], rt)
    h.on_built(model)
    h.on_optimizer(opt)
    model(torch.randn(2, 8)).sum().backward()  # type: ignore[operator]
    second = {p.data_ptr() for p in model[2].parameters()}  # type: ignore[index]
    first = {p.data_ptr() for p in model[0].parameters()}  # type: ignore[index]
    fetched = [p[0] for p in rt.prefetched]
    assert set(fetched[:2]) == second  # the forward pre-hook of layer 0 fetched layer 2's parameters
    assert first <= set(fetched[2:])  # the backward pre-hook of layer 2 fetched layer 0's
    side = rt.prefetched[0][3]
    assert side != 7 and all(p[3] == side for p in rt.prefetched)  # on the side stream, never the compute stream
    mark, first_prefetch = rt.log[0], rt.log.index(("prefetch", side))
    assert mark[0] == "record" and mark[2] == 7 and rt.log[1] == ("wait", side, mark[1])  # after queued work
    done = rt.log[first_prefetch + 2]  # layer 2 has two parameters
    assert done[0] == "record" and done[2] == side
    assert rt.log[first_prefetch + 3] == ("wait", 7, done[1])  # layer 2's forward waits for its prefetch
    before = len(rt.prefetched)
    opt.step()  # type: ignore[attr-defined]  # no state yet at the first step: nothing to prefetch
    _step(model, opt)
    assert len(rt.prefetched) - before >= 2 + 8  # layer 2 ahead again, then 8 state tensors before the step


def test_unknown_hint_names_are_refused_and_policies_carry_the_env() -> None:
    with pytest.raises(InputError, match="unknown hint"):
        hints_from_env({HINTS_ENV: "discard-freed-blocks"})
    assert hints_from_env({HINTS_ENV: "read-mostly-parameters, prefetch-next-kernel"}) == [
        "read-mostly-parameters",
        "prefetch-next-kernel",
    ]
    both = compose([POLICIES["read-mostly-parameters"], POLICIES["prefetch-next-kernel"]])
    assert both.gpu_env[HINTS_ENV] == "read-mostly-parameters,prefetch-next-kernel"
    assert HINTS_ENV not in POLICIES["discard-freed-blocks"].gpu_env


class _FakeLib:
    def __init__(self, version: int) -> None:
        self.version, self.calls = version, []

    def cudaRuntimeGetVersion(self, ref: object) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = self.version
        return 0

    def cudaMemAdvise(self, *args: object) -> int:
        self.calls.append(("advise", args))
        return 0

    def cudaMemPrefetchAsync(self, *args: object) -> int:
        self.calls.append(("prefetch", args))
        return 0


def test_the_runtime_wrapper_uses_the_cuda_13_location_form_or_the_cuda_12_device_form() -> None:
    r13 = CudaRuntime(_FakeLib(13000))
    r13.advise(4096, 8192, ADVISE_PREFERRED_LOCATION, CPU_DEVICE_ID)
    r13.prefetch(4096, 8192, 0, 5)
    loc = r13.lib.calls[0][1][3]
    assert (loc.type, loc.id) == (2, 0)  # cudaMemLocationTypeHost
    assert len(r13.lib.calls[1][1]) == 5  # ptr, n, location, flags, stream
    r12 = CudaRuntime(_FakeLib(12080))
    r12.advise(4096, 8192, ADVISE_PREFERRED_LOCATION, CPU_DEVICE_ID)
    r12.prefetch(4096, 8192, 0, 5)
    assert r12.lib.calls[0][1][3].value == -1  # cudaCpuDeviceId
    assert len(r12.lib.calls[1][1]) == 4  # ptr, n, device, stream


def test_a_gpu_plan_passes_the_hints_to_the_worker_and_says_discard_is_not_applied() -> None:
    from uvmlab.advise.policies import get_policy
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.measure.gpu.plan import GpuRunOptions, plan_run

    def plan(policy: str) -> object:
        cfg = RunConfig(workload=WorkloadConfig("alexnet", batch_size=4), oversub=2.0, mode="gpu")
        opts = GpuRunOptions(footprint=2**30, shim_library="/x.so")
        return plan_run(get_policy(policy).apply(cfg), opts, estimate=lambda c: 2**30)

    env = plan("remote-optimizer-state+prefetch-next-kernel").step("run").env  # type: ignore[attr-defined]
    assert env[HINTS_ENV] == "remote-optimizer-state,prefetch-next-kernel"
    disc = plan("discard-freed-blocks")
    assert HINTS_ENV not in disc.step("run").env  # type: ignore[attr-defined]
    assert any("discard-freed-blocks is not applied" in n for n in disc.notes)  # type: ignore[attr-defined]
