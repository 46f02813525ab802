"""Capture a Trace of N training iterations, on the meta device (default) or the CPU.

``capture_trace(cfg)`` builds the workload under a :class:`~uvmlab.trace.recorder.Recorder` (model and
optimizer creation are phase ``setup``, iteration -1), then runs ``cfg.iterations`` iterations of
``workloads.train.train_step`` with a phase hook that labels phases. On meta it emulates CUDA's choices
(``foreach`` optimizers are always passed by the training loop; SDPA routed to flash/efficient attention;
dropout routed to the fused kernel with its 1-byte mask; bf16 autocast emulated) and gives data-dependent ops
(nonzero, boolean-mask indexing, unique, bincount) a documented size (uvmlab.trace.emulate), and records
what it did in ``header["notes"]``.

A user workload file or a named model (``torchvision:``/``timm:``/``hf:``) that raises while it is built or
while it trains is an input error naming the workload, the phase and the exception (exit 2); the six built-in
workloads' exceptions are uvmlab bugs and propagate.

Categories, decided per allocation after the run, first rule that applies:

1. ``parameter``: the storage of a model parameter at the end of setup.
2. ``gradient``: a storage that is some parameter's ``.grad`` when the optimizer phase begins.
3. ``optimizer_state``: a storage held in ``optimizer.state`` when the optimizer step ends.
4. ``input``: made in the data phase.
5. ``activation``: made in the forward phase and still alive when forward ends (saved for backward, the loss);
   in a workload program (phase ``compute``), made in an iteration and still alive when the next one begins.
6. ``other``: made in setup and alive at its end but not a parameter (module buffers such as BatchNorm
   statistics), or seen first as an op input without having been made under the recorder.
7. ``temporary``: everything else (freed within its phase, backward intermediates, optimizer scratch).

Python's cyclic garbage collector is paused during capture and run at the end of each iteration, so storages
kept alive only by reference cycles (none in the built-in workloads) are freed at a deterministic point.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from uvmlab.config import CAPTURE_DEVICES, WorkloadConfig
from uvmlab.errors import InputError, UvmlabError
from uvmlab.trace.emulate import (
    AutocastEmulation,
    ConvLayoutEmulation,
    DataDependentEmulation,
    DropoutEmulation,
    SdpaEmulation,
)
from uvmlab.trace.heap import frozen_heap
from uvmlab.trace.known_values import KnownLiterals, KnownValues
from uvmlab.trace.param_map import ParamMap
from uvmlab.trace.recorder import Recorder
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.trace.shard import job_trace
from workloads.base import common_option
from workloads.program import PROGRAM_PHASE
from workloads.registry import load_workload
from workloads.train import PHASE_END, make_optimizer, train_step
from workloads.userfile import failure

ProgressFn = Callable[[int, int], None]
"""progress(done_iterations, total_iterations)."""
CPU_RAM_FRACTION = 0.8
"""A CPU capture is refused when the meta trace's peak live bytes exceed this share of MemAvailable."""
META_CPU_THREADS = 1
"""Intra-op threads of the CPU ops a meta capture runs (uvmlab.trace.known_values' mirrors of small tensors, the
optimizer's step counters). Such ops are small and come one at a time between Python frames, so each parallel
region wakes the sleeping OpenMP workers for microseconds of work: a ``fill_`` of 457 x 94 floats took 5-10 ms of
CPU with PyTorch's default 2 threads and 0.04 ms with 1 (2-core machine, 2026-11-29). What the ops compute does not
change (they only feed Python control flow, never the trace's tables); a CPU capture keeps the default threads."""


def _mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_cpu_fits(cfg: WorkloadConfig) -> int:
    """Refuse (InputError) a CPU capture whose meta-traced peak would not fit in RAM; return that peak."""
    from uvmlab.trace.summary import peak_live

    peak, _ = peak_live(capture_trace(cfg, "meta", emulate_cuda=False))
    avail = _mem_available_bytes()
    if avail is not None and peak > CPU_RAM_FRACTION * avail:
        raise InputError(
            f"a CPU capture of {cfg.workload} needs about {peak / 2**30:.1f} GiB of tensors but only "
            f"{avail / 2**30:.1f} GiB of RAM is available; capture on meta (--device meta) or use a smaller "
            "batch/model (--batch-size, --option)"
        )
    return peak


class _Categorizer:
    """Collects the facts the category rules need while the run goes on."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.parameter: set[int] = set()
        self.buffer_or_setup: set[int] = set()
        self.gradient: set[int] = set()
        self.optimizer_state: set[int] = set()
        self.forward_end: dict[int, int] = {}  # iteration -> seq at which forward ended

    def _ids(self, tensors: Any) -> set[int]:
        out = set()
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == self.rec.device_type:
                aid = self.rec.alloc_id(t)
                if aid is not None:
                    out.add(aid)
        return out

    def after_setup(self, model: torch.nn.Module) -> None:
        self.parameter |= self._ids(model.parameters())

    def before_optimizer(self, model: torch.nn.Module) -> None:
        self.gradient |= self._ids(p.grad for p in model.parameters() if p.grad is not None)

    def after_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for state in optimizer.state.values():
            self.optimizer_state |= self._ids(state.values())

    def categories(self) -> list[str]:
        rec = self.rec
        setup_end = next((s for s, p, _ in rec.boundaries if p != "setup"), rec.seq)
        iteration_end = {it - 1: s for s, p, it in rec.boundaries if p == PROGRAM_PHASE}  # next one's start
        iteration_end.update({it: s for s, it in rec.loop_ends})  # a program loop's last one: the loop's end
        ends = {"forward": self.forward_end, PROGRAM_PHASE: iteration_end}
        cats = []
        for aid in range(len(rec.a_size)):
            phase, it, free = rec.a_phase[aid], rec.a_iter[aid], rec.a_free_seq[aid]
            end = ends[phase].get(it, rec.seq) if phase in ends else -1  # made before it, alive after it: activation
            if aid in self.parameter:
                cats.append("parameter")
            elif aid in self.gradient:
                cats.append("gradient")
            elif aid in self.optimizer_state:
                cats.append("optimizer_state")
            elif phase == "data":
                cats.append("input")
            elif phase in ends and rec.a_alloc_seq[aid] < end and (free == NEVER_FREED or free > end):
                cats.append("activation")
            elif rec.a_op[aid] == "<external>" or (phase == "setup" and (free == NEVER_FREED or free > setup_end)):
                cats.append("other")
            else:
                cats.append("temporary")
        return cats


@contextlib.contextmanager
def _cpu_threads(n: int) -> Any:
    """PyTorch's intra-op thread count set to ``n`` while inside, restored after (``torch.set_num_threads``)."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _user_code_guard(cfg: WorkloadConfig, source: str) -> Callable[[Any], contextlib.AbstractContextManager[None]]:
    """A context maker turning exceptions (and ``sys.exit``) of the workload's code into one-sentence input errors.

    ``guard(phase)`` (a string or a callable giving it at failure time) re-raises any non-uvmlab exception as
    :func:`workloads.userfile.failure` (exit 2). User files and named models name themselves; a built-in workload
    names its batch size too: the workload's code runs with the user's batch size and options, and when it fails
    (e.g. torch's "Storage size calculation overflowed" at a batch of 10**12) that is the input's fault.
    uvmlab's own errors pass through unchanged.
    """
    if source == "builtin":
        what = f"workload {cfg.workload}" + (f" (batch size {cfg.batch_size})" if cfg.batch_size is not None else "")
    elif source in ("torchvision", "timm", "transformers"):
        what = cfg.workload
    else:
        what = f"workload file {source}"

    @contextlib.contextmanager
    def guard(phase: Any) -> Any:
        try:
            yield
        except UvmlabError:
            raise
        except SystemExit as exc:  # the workload's own sys.exit(): not a successful run of anything
            when = phase() if callable(phase) else phase
            raise InputError(f"{what} called sys.exit({exc.code!r}) while {when}") from None
        except Exception as exc:
            raise failure(what, phase() if callable(phase) else phase, exc) from None

    return guard


def _checkpoint(workload: Any, cfg: WorkloadConfig, guard: Any) -> list[str]:
    """Apply ``cfg.checkpoint`` (workloads.checkpointing) to the built workload; the trace header's note."""
    if not cfg.checkpoint:
        return []
    from workloads.checkpointing import apply_checkpointing

    with guard("wrapping its segments in activation checkpointing"):
        wrapped = apply_checkpointing(workload, cfg.checkpoint)
    return [
        f"activation checkpointing ({cfg.checkpoint}): torch.utils.checkpoint.checkpoint(use_reentrant=False) "
        "around " + ", ".join(wrapped)
    ]


def capture_trace(
    cfg: WorkloadConfig,
    device: str = "meta",
    progress: ProgressFn | None = None,
    emulate_cuda: bool = True,
    check_memory: bool = True,
) -> Trace:
    """Run ``cfg.iterations`` training iterations of ``cfg.workload`` on ``device`` and return their Trace.

    ``emulate_cuda=False`` turns off the SDPA routing (for comparing meta with CPU captures); foreach optimizers
    are always used. On ``cpu`` the computation really runs (only small configurations fit in RAM), with the
    CPU's own SDPA kernel and CPU autocast; with ``check_memory`` a meta capture first checks that the peak
    fits in RAM (paper-size models do not: GPT-2 at batch 8 was killed at 24 GB). A data-parallel job is captured on
    one GPU (``cfg.single_gpu``) and made into its rank-0 trace (uvmlab.trace.shard.job_trace).
    """
    job, cfg = cfg, cfg.single_gpu
    if device not in CAPTURE_DEVICES:
        raise InputError(f"capture device must be one of {', '.join(CAPTURE_DEVICES)}, not {device!r}")
    spec = load_workload(cfg.workload)
    spec.resolve_options(cfg)  # refuse unknown options before any work
    rec = Recorder(device)
    fraction = common_option(cfg, "data_dependent_fraction")
    if not 0 < fraction <= 1:
        raise InputError(f"option data_dependent_fraction must be in (0, 1], not {fraction!r}")
    if device == "cpu" and check_memory:
        check_cpu_fits(cfg)
    cat = _Categorizer(rec)
    sdpa = SdpaEmulation(cfg.sdpa_backend) if (emulate_cuda and device == "meta" and cfg.attention != "eager") else None
    dropout = DropoutEmulation() if (emulate_cuda and device == "meta") else None
    conv_layout = ConvLayoutEmulation() if (emulate_cuda and device == "meta") else None
    data_dep = DataDependentEmulation(fraction, rec.attributing) if device == "meta" else None
    autocast_emu = AutocastEmulation() if (cfg.dtype == "bf16" and device == "meta") else None
    values = KnownValues() if device == "meta" else None
    guard = _user_code_guard(cfg, spec.source)
    start = time.perf_counter()
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # deterministic frees: see the hook
    with contextlib.ExitStack() as stack:
        if gc_was_enabled:
            stack.callback(gc.enable)
        # what is alive before the capture is frozen, so that the gc.collect() at each iteration end scans only the
        # capture's own objects (uvmlab.trace.heap). Approximation: an object alive before the capture that becomes
        # cyclic garbage during it is collected after the capture, not at an iteration end (the model, its optimizer
        # and every tensor recorded are made inside the capture, so none is frozen)
        stack.enter_context(frozen_heap())
        if device == "meta":
            stack.enter_context(_cpu_threads(META_CPU_THREADS))
        if sdpa is not None:
            stack.enter_context(sdpa)
        if dropout is not None:
            stack.enter_context(dropout)
        if conv_layout is not None:
            stack.enter_context(conv_layout)  # outside the recorder: it records the emulated outputs
        stack.enter_context(rec)
        if data_dep is not None:
            stack.enter_context(data_dep)  # inside the recorder: the recorder sees what the rules allocate
        rec.set_phase("setup", -1)
        if spec.is_program:
            _run_program(spec, cfg, device, rec, guard, progress)
            rec.close()  # the program's own frees at its end are part of it (its tensors die as it returns)
            n_params = param_bytes = trainable_bytes = 0
            attention, extra_notes = None, ["a workload program (workloads.program): no model, no training loop"]
            parameters: list[dict[str, Any]] = []
            model_hidden_size = None
        else:
            n_params, param_bytes, trainable_bytes, attention, extra_notes, parameters, model_hidden_size = _train(
                spec, cfg, device, rec, cat, guard, progress, autocast_emu, values
            )
    elapsed = time.perf_counter() - start
    # --dtype auto built the model in a 2-byte dtype (workloads.hf_dtype), not a base cast by --weights-dtype/--qlora
    built_bf16 = cfg.weights_dtype == "fp32" and not cfg.qlora and 0 < param_bytes <= 2 * n_params
    weights_bf16 = cfg.dtype == "auto" and built_bf16
    tables = rec.tables(cat.categories())
    notes = [
        *(
            []
            if spec.is_program
            else [
                f"optimizer {cfg.optimizer} built with foreach=True (CUDA's default; meta/CPU would pick the "
                "single-tensor loop)"
            ]
        ),
        "kernels: one per leaf aten op (view and metadata ops skipped); FLOPs estimated (uvmlab.trace.flops)",
        *extra_notes,
    ]
    if sdpa is not None and sdpa.counts:
        notes.append(
            "scaled_dot_product_attention routed to CUDA's kernels: "
            + (", ".join(f"{k} x{v}" for k, v in sorted(sdpa.counts.items())) or "no calls")
        )
    elif attention == "sdpa":
        notes.append(f"scaled_dot_product_attention NOT emulated: {device}'s own SDPA path was captured")
    if dropout is not None and dropout.counts["fused"]:
        unfused = dropout.counts["unfused"]
        notes.append(
            f"dropout routed to CUDA's fused native_dropout (1-byte mask): {dropout.counts['fused']} calls"
            + (f", {unfused} left unfused (in-place, eval, p 0 or 1)" if unfused else "")
        )
    if data_dep is not None and data_dep.counts:
        notes.append(
            f"data-dependent ops sized by rule at {fraction:g} of their upper bound (uvmlab.trace.emulate): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(data_dep.counts.items()))
        )
    if values is not None and values.counts["value reads"] + values.counts["copies to the CPU"]:
        notes.append(
            "data-dependent scalars read from CPU copies of the small tensors they come from, seeded "
            f"(uvmlab.trace.known_values): {values.counts['value reads']} value reads, "
            f"{values.counts['copies to the CPU']} copies to the CPU, {values.counts['ops mirrored']} ops mirrored"
        )
    if conv_layout is not None and conv_layout.counts:
        notes.append(
            "convolution outputs in CUDA's memory format (channels-last operands give channels-last outputs), "
            "distinct call shapes (the meta memo replays repeats): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(conv_layout.counts.items()))
        )
    if rec.temporaries_failed:
        notes.append(
            "kernel temporaries not derived (their rule failed on these arguments; uvmlab.trace.internal_rules): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(rec.temporaries_failed.items()))
        )
    if autocast_emu is not None:
        notes.append(
            "bf16 autocast emulated at the function level (no meta autocast): "
            f"{autocast_emu.counts['lower']} lower-precision and {autocast_emu.counts['fp32']} fp32 calls"
        )
    header = {
        "workload": cfg.workload,
        "workload_source": spec.source,
        "config": cfg.to_dict(),
        "batch_size": spec.batch_size(cfg),
        "options": spec.resolve_options(cfg),
        "torch_version": torch.__version__,
        "capture_device": device,
        "emulate_cuda": bool(emulate_cuda),
        "attention_impl": attention,
        "iterations": cfg.iterations,
        "compute_dtype": "bf16" if cfg.dtype == "bf16" or weights_bf16 else "fp32",
        "parameter_count": int(n_params),
        "parameter_bytes": int(param_bytes),
        "trainable_parameter_bytes": int(trainable_bytes),
        "parameters": parameters,
        "model_hidden_size": model_hidden_size,
        "capture_seconds": round(elapsed, 3),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "notes": notes,
        **rec.program_header(),
    }
    trace = Trace(header=header, **tables)
    trace.validate(f"captured trace of {cfg.workload}")
    return job_trace(job, trace)


def _train(
    spec: Any,
    cfg: WorkloadConfig,
    device: str,
    rec: Recorder,
    cat: _Categorizer,
    guard: Any,
    progress: ProgressFn | None,
    autocast_emu: AutocastEmulation | None,
    values: KnownValues | None = None,
) -> tuple[int, int, int, str | None, list[str], list[dict[str, Any]], int | None]:
    """Build the model and optimizer and run the training iterations under the recorder; return the parameter
    count, parameter bytes, trainable bytes, attention implementation, the header notes, the parameter map
    (uvmlab.trace.param_map) and the model config's hidden_size (None if it has none). ``values`` (meta captures)
    mirrors the small tensors of the iterations on the CPU (not the model's build: parameters have no values a scalar
    read needs)."""
    with guard("building its model"):
        workload = spec.build(cfg, device)
    checkpointed = _checkpoint(workload, cfg, guard)
    with guard("building its optimizer"):
        optimizer = make_optimizer(workload.model, cfg)
    cat.after_setup(workload.model)
    pmap = ParamMap(workload.model, rec.alloc_id)
    state = {"phase": "setup"}

    def hook(phase: str, iteration: int) -> None:
        prev = state["phase"]
        if prev == "forward":
            cat.forward_end[iteration] = rec.seq
        elif prev == "optimizer":
            cat.after_optimizer(optimizer)
        if phase == "optimizer":
            cat.before_optimizer(workload.model)
            pmap.record_gradients(iteration)
        state["phase"] = phase
        if phase != PHASE_END:
            rec.set_phase(phase, iteration)
        else:
            gc.collect()  # cyclic garbage (if any) is freed at iteration ends, not whenever gc runs

    autocast = autocast_emu.region if autocast_emu is not None else None
    with contextlib.ExitStack() as modes:
        if device == "meta":  # the workload's own emulations of CUDA kernels, inside the recorder
            for make in workload.capture_modes:
                modes.enter_context(make())
        for it in range(cfg.iterations):
            with guard(lambda it=it: f"running its {state['phase']} phase (iteration {it})"), _knowing(values):
                train_step(workload, optimizer, cfg, hook, it, autocast)
            if progress is not None:
                progress(it + 1, cfg.iterations)
    rec.close()  # while the model and optimizer are alive: tearing them down is not part of the trace
    params = list(workload.model.parameters())
    return (
        sum(p.numel() for p in params),
        sum(p.numel() * p.element_size() for p in params),
        sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        workload.attention,
        [*workload.notes, *checkpointed],
        pmap.to_header(cfg.iterations),
        pmap.hidden_size,
    )


@contextlib.contextmanager
def _knowing(values: KnownValues | None) -> Any:
    """``values`` (and its literals' function mode) active, or nothing."""
    if values is None:
        yield
        return
    with KnownLiterals(values), values:
        yield


def _run_program(
    spec: Any, cfg: WorkloadConfig, device: str, rec: Recorder, guard: Any, progress: ProgressFn | None
) -> None:
    """Run a workload program (workloads.program) under the recorder; progress follows its iterations."""
    from workloads.program import Program

    if cfg.checkpoint:
        raise InputError(
            f"--checkpoint applies to a model's training loop; workload program {spec.source} has none (leave it out)"
        )
    state = {"iteration": -1}

    def hook(phase: str, iteration: int) -> None:
        gc.collect()  # as between training iterations: cyclic garbage is freed at iteration boundaries
        if progress is not None and iteration > 0:
            progress(iteration, max(cfg.iterations, iteration))
        state["iteration"] = iteration

    uvm = Program(device, cfg, recorder=rec, phase_hook=hook)
    with guard(lambda: "setting up" if state["iteration"] < 0 else f"running iteration {state['iteration']}"):
        spec.run_program(uvm, cfg)
    if progress is not None:
        progress(cfg.iterations, cfg.iterations)
