"""DeepSpeed ZeRO stages 1, 2 and 3 on one rank. Torch-free.

The rules are read from DeepSpeed 0.19.8 (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``,
``partition_parameters.py``, ``config.py``) with its configuration defaults (:class:`ZeroConfig`). The gradients'
dtype is the model's (``engine.get_data_types``: ``grad_accum_dtype`` None -> the model dtype), the optimizer
DeepSpeed's fused Adam (no step temporaries; the captured step is replaced by one fused step event).

**Stages 1 and 2** (``DeepSpeedZeroOptimizer``):

- the trainable parameters are flattened into one buffer per dtype (``bit16_groups_flat``), padded to a multiple
  of ``2 x world_size`` elements (``nccl_start_alignment_factor = 2``; ``aligned_numel``); a rank's partition is
  1/N of it (``partition_size = len(bit16_groups_flat[i]) // world_size``);
- the fp32 master copy of the rank's partition (``single_partition_of_fp32_groups``) and Adam's two fp32 states
  for it (made at the first step);
- the ipg bucket: ``setup_buckets`` allocates ``reduce_bucket_size`` elements (5e8 by default) in the gradient
  dtype when backward starts (two with ``overlap_comm``), released at the backward epilogue
  (``_release_ipg_buffers``);
- stage 2 (``partition_grads``): each gradient is copied into the bucket as it becomes ready and released; a full
  bucket is reduced, and the rank's part of it copied into ``grads_in_partition`` (``torch.empty(total_size)``,
  the partition, allocated at the first reduction); the parameters' ``.grad`` become views of it, so it outlives
  the epilogue's ``_release_ipg_buffers`` until the step frees the gradients (``averaged_gradients`` is a list of
  those views: ``get_flat_partition(..., return_tensor_list=True)``);
- stage 1: the gradients stay whole through backward and are reduced at its end (``reduce_gradients``); the rank's
  part (a partition) is kept to the step (modelled as one partition-sized buffer), the rest released;
- the step (class ``_Step``): the flat copy of the partition and its fp32 copy, then the fused Adam step, the master
  copied into the rank's bit16 partition and an in-place all-gather of the flat buffer (``all_gather_dp_groups``).

**Stage 3** (``DeepSpeedZeroOptimizer_Stage3``):

- every parameter is partitioned on its own: ``ceil(numel / N)`` elements a rank (``_aligned_size``,
  ``_padding_size``), except those of at most ``param_persistence_threshold`` (1e5) elements, which every rank keeps
  whole (``ds_persist``);
- fp32 master partitions, Adam's states (``initialize_optimizer_states`` runs at init), ``grad_partitions_flat_buffer``
  (the rank's gradient partitions, in the gradient dtype) and the ipg bucket (``reduce_bucket_size`` elements) are
  made at init and persistent;
- before a module runs, its parameters are all-gathered into one buffer (``allgather_coalesced``: partition x N);
  the coordinator prefetches the next modules in the recorded order up to ``prefetch_bucket_size`` (5e7) elements;
  after the module, its parameters are released unless their next use is within ``max_reuse_distance`` (1e9)
  elements of other modules' parameters (``PartitionedParameterCoordinator.release_sub_module``); everything is
  released at the end of backward;
- each gradient is copied into the ipg bucket and released as it becomes ready.

APPROXIMATIONS: gathers and releases are placed at a module's first and last kernel touching its parameters; the
partitions of stage 3 are per-parameter allocations (DeepSpeed keeps them in flat buffers); a bucket's reduction
and the rank's copy-out are single events; ``max_live_parameters`` is not enforced beyond the prefetch limit;
HF Trainer's ``auto`` values (``reduce_bucket_size = hidden_size ** 2`` etc.) are not applied: the DeepSpeed
defaults are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uvmlab.errors import InputError
from uvmlab.trace.shard.layout import COMM, Layout
from uvmlab.trace.shard.units import ceil_div

FP32 = 4
"""Bytes of an fp32 element (master weights and Adam's states)."""
ADAM_STATES = 2
"""Adam's exp_avg and exp_avg_sq."""


@dataclass(frozen=True)
class ZeroConfig:
    """DeepSpeed's ``zero_optimization`` defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig)."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    contiguous_gradients: bool = True
    overlap_comm: bool | None = None
    """None: True for stage 3, False otherwise (``overlap_comm_valid``)."""
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_reuse_distance: int = 1_000_000_000

    def overlap(self, stage: int) -> bool:
        """``overlap_comm`` as DeepSpeed resolves it."""
        return self.overlap_comm if self.overlap_comm is not None else stage == 3


def zero_config(options: dict[str, Any], hidden_size: int | None) -> ZeroConfig:
    """The ZeroConfig of ``--shard-option`` values. ``auto`` is HF Trainer's rule (transformers
    ``integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_finalize``): ``reduce_bucket_size =
    hidden_size ** 2``, ``stage3_prefetch_bucket_size = int(0.9 * hidden_size ** 2)``,
    ``stage3_param_persistence_threshold = 10 * hidden_size``."""
    auto = {
        "reduce_bucket_size": lambda h: h * h,
        "prefetch_bucket_size": lambda h: int(0.9 * h * h),
        "param_persistence_threshold": lambda h: 10 * h,
    }
    values: dict[str, Any] = {}
    for key, value in options.items():
        if value == "auto":
            if not hidden_size:
                raise InputError(f"--shard-option {key}=auto needs the model's hidden_size, which this trace lacks")
            value = auto[key](int(hidden_size))
        values[key] = value
    return ZeroConfig(**values)


def zero12(layout: Layout, stage: int, config: ZeroConfig = ZeroConfig()) -> dict[str, Any]:
    """Apply ZeRO stage 1 or 2 to ``layout`` (module docstring); the header summary."""
    n, e = layout.world_size, layout.edit
    p = layout.params[layout.params["trainable"]]
    if p.empty:
        raise InputError("ZeRO partitions the optimizer of trainable parameters: this job trains none")
    sizes = set(p["itemsize"].tolist())
    if len(sizes) > 1:
        raise InputError("ZeRO 1/2 flattens the trainable parameters per dtype; they mix dtypes here")
    s = sizes.pop()
    total = int(p["numel"].sum())
    aligned = ceil_div(total, 2 * n) * 2 * n
    part = aligned // n
    setup_at = layout.setup_end()
    flat = e.add(aligned * s, e.after(setup_at), None, "parameter", "deepspeed:bit16_groups_flat")
    offset = 0
    for aid, numel in zip(p["alloc_id"], p["numel"], strict=True):
        e.remap(int(aid), setup_at + 1, 1 << 62, flat, offset * s)
        e.remove(int(aid))
        offset += int(numel)
    master = e.add(part * FP32, e.after(setup_at), None, "optimizer_state", "deepspeed:fp32_partition")
    states = _replace_step(layout, part, master, stage, s, flat)
    buffers = 2 if config.overlap(stage) else 1
    for it in layout.iterations:
        bwd = layout.span(it, "backward")
        if bwd is None:
            continue
        ipg = [
            e.add(config.reduce_bucket_size * s, e.before(bwd[0]), None, COMM, "deepspeed:ipg_buffer")
            for _ in range(buffers)
        ]
        grads = sorted(layout.grads(it, p), key=lambda pg: layout.ready_seq(pg[1]))
        in_partition = None
        filled = 0
        for _pa, g in grads:
            ready = layout.ready_seq(g)
            if stage == 2:
                size = e.size_of(g)
                e.kernel("deepspeed:copy_grad_to_ipg", e.after(ready), [(g, 0, size, False), (ipg[0], 0, size, True)])
                e.free_at(g, e.after(ready))
                filled += size // s
                if filled >= config.reduce_bucket_size:
                    in_partition = in_partition or _grads_in_partition(layout, part * s, ready)
                    e.kernel("nccl:reduce_scatter", e.after(ready), [(ipg[0], 0, filled * s, False),
                                                                     (in_partition, 0, part * s, True)])  # fmt: skip
                    filled = 0
        # the epilogue: the rank's gradients (stage 2: grads_in_partition; stage 1: its part of the whole
        # gradients, kept as param.grad) stay as views of averaged_gradients until the step; the bucket goes
        if in_partition is None:
            in_partition = _grads_in_partition(layout, part * s, bwd[1])
        staged = min(total if stage == 1 else filled, config.reduce_bucket_size) * s
        e.kernel(
            "nccl:reduce_scatter", e.after(bwd[1]), [(ipg[0], 0, staged, False), (in_partition, 0, part * s, True)]
        )
        if stage == 1:
            for _pa, g in grads:
                e.free_at(g, e.after(bwd[1]))
        for buf in ipg:
            e.set_free(buf, e.after(bwd[1]))
        states.step(it, in_partition)
    return {
        "trainable_numel": total,
        "aligned_numel": aligned,
        "partition_numel": part,
        "reduce_bucket_bytes": config.reduce_bucket_size * s,
        "ipg_buffers": buffers,
        "parameter_bytes_total": int(layout.params["bytes"].sum()),
        "parameter_bytes_rank": int(layout.params.loc[~layout.params["trainable"], "bytes"].sum()) + aligned * s,
    }


def _grads_in_partition(layout: Layout, size: int, at: int) -> int:
    e = layout.edit
    return e.add(size, e.after(at), None, "gradient", "deepspeed:grads_in_partition")


class _Step:
    """The step that replaces the captured one (``DeepSpeedZeroOptimizer.step``): the averaged gradients flattened
    (``flatten(self.averaged_gradients[i])``, a partition in the gradient dtype) and copied to fp32
    (``flat_grad_partition.to(fp32)``), the flat copy and the gradients released (``free_grad_in_param_list``), the
    fused Adam step on the master partition (Adam's fp32 states made at the first step), the fp32 gradient released,
    then the master copied into the rank's bit16 partition and the parameters all-gathered."""

    def __init__(self, layout: Layout, part: int, master: int, itemsize: int, bit16: int | None) -> None:
        self.layout, self.part, self.master, self.itemsize, self.bit16 = layout, part, master, itemsize, bit16
        self.states: list[int] = []

    def states_now(self, at: tuple[int, int]) -> None:
        """Adam's states made at ``at`` (ZeRO-3's ``initialize_optimizer_states`` runs at init)."""
        self.states = [
            self.layout.edit.add(self.part * FP32, at, None, "optimizer_state", "deepspeed:adam_state")
            for _ in range(ADAM_STATES)
        ]

    def step(self, it: int, grads: int, free_grad: bool = True) -> None:
        """The step of iteration ``it`` on the rank's gradient partition ``grads`` (released at the step unless
        persistent: ZeRO-3's ``grad_partitions_flat_buffer``, already flat, whose fp32 copy is made directly by
        ``_prepare_fp32_grad_for_sub_group``)."""
        e, lay = self.layout.edit, self.layout
        opt = lay.span(it, "optimizer")
        bwd = lay.span(it, "backward")
        at = opt[0] if opt is not None else bwd[1]  # type: ignore[index]
        if not self.states:
            self.states = [
                e.add(self.part * FP32, e.before(at), None, "optimizer_state", "deepspeed:adam_state")
                for _ in range(ADAM_STATES)
            ]
        size = e.size_of(grads)
        flat = grads
        if free_grad:  # ZeRO-1/2: flatten the list of views first
            flat = e.add(size, e.before(at), None, "temporary", "deepspeed:flat_grad_partition")
            e.kernel("deepspeed:flatten", e.before(at), [(grads, 0, size, False), (flat, 0, size, True)])
        grad = e.add(self.part * FP32, e.before(at), None, "gradient", "deepspeed:fp32_grad_partition")
        e.kernel("deepspeed:to_fp32", e.before(at), [(flat, 0, size, False), (grad, 0, self.part * FP32, True)])
        if flat != grads:
            e.set_free(flat, e.before(at))
        if free_grad:
            e.set_free(grads, e.before(at))
        rw = [(x, 0, self.part * FP32, w) for x in (self.master, *self.states) for w in (False, True)]
        e.kernel("deepspeed:fused_adam", e.before(at), [(grad, 0, self.part * FP32, False), *rw])
        end = opt[1] if opt is not None else at
        e.set_free(grad, e.after(end))
        if self.bit16 is not None:
            size = e.size_of(self.bit16)
            touches = [(self.master, 0, self.part * FP32, False), (self.bit16, 0, size // lay.world_size, True)]
            e.kernel("deepspeed:copy_master_to_bit16", e.after(end), touches)
            e.kernel("nccl:all_gather", e.after(end), [(self.bit16, 0, size, True)])


def _replace_step(layout: Layout, part: int, master: int, stage: int, itemsize: int, bit16: int | None) -> _Step:
    """Remove the captured optimizer (its state, its step's temporaries and kernels): DeepSpeed's replaces it."""
    for aid in layout.optimizer_allocations()["alloc_id"]:
        layout.edit.remove(int(aid))
    k = layout.trace.kernels
    for kid in k.loc[(k["phase"] == "optimizer") & (k["iteration"] >= 0), "kernel_id"]:
        layout.edit.remove_kernel(int(kid))
    return _Step(layout, part, master, itemsize, bit16)


def zero3(layout: Layout, config: ZeroConfig = ZeroConfig()) -> dict[str, Any]:
    """Apply ZeRO stage 3 to ``layout`` (module docstring, units: one per module owning parameters)."""
    n, e, p = layout.world_size, layout.edit, layout.params
    persist = p["numel"] <= config.param_persistence_threshold
    p["shard_numel"] = [nu if keep else ceil_div(nu, n) for nu, keep in zip(p["numel"], persist, strict=True)]
    p["persist"] = persist.to_numpy()
    for aid, sn, isz in zip(p["alloc_id"], p["shard_numel"], p["itemsize"], strict=True):
        e.resize(int(aid), int(sn) * int(isz))
    t = p[p["trainable"]]
    if t.empty:
        raise InputError("ZeRO partitions the optimizer of trainable parameters: this job trains none")
    part = int(sum(ceil_div(nu, n) for nu in t["numel"]))
    s = int(t["itemsize"].max())
    setup_at = layout.setup_end()
    master = e.add(part * FP32, e.after(setup_at), None, "optimizer_state", "deepspeed:fp32_partitioned_groups_flat")
    grad_parts = e.add(part * s, e.after(setup_at), None, "gradient", "deepspeed:grad_partitions_flat_buffer")
    ipg = e.add(config.reduce_bucket_size * s, e.after(setup_at), None, COMM, "deepspeed:ipg_bucket_flat_buffer")
    states = _replace_step(layout, part, master, 3, s, None)
    states.states_now(e.after(setup_at))
    gathered_peak = 0
    for it in layout.iterations:
        gathered_peak = max(gathered_peak, _gather_schedule(layout, it, config))
        bwd = layout.span(it, "backward")
        if bwd is None:
            continue
        filled = 0
        for _pa, g in sorted(layout.grads(it, t), key=lambda pg: layout.ready_seq(pg[1])):
            ready = layout.ready_seq(g)
            size = e.size_of(g)
            e.kernel("deepspeed:copy_grad_to_ipg", e.after(ready), [(g, 0, size, False), (ipg, 0, size, True)])
            e.free_at(g, e.after(ready))
            filled += size // s
            if filled >= config.reduce_bucket_size:
                e.kernel(
                    "nccl:reduce_scatter",
                    e.after(ready),
                    [(ipg, 0, filled * s, False), (grad_parts, 0, part * s, True)],
                )
                filled = 0
        e.kernel("nccl:reduce_scatter", e.after(bwd[1]), [(ipg, 0, max(filled, 1) * s, False),
                                                            (grad_parts, 0, part * s, True)])  # fmt: skip
        states.step(it, grad_parts, free_grad=False)
    return {
        "partition_numel": part,
        "persistent_parameters": int(persist.sum()),
        "reduce_bucket_bytes": config.reduce_bucket_size * s,
        "prefetch_bucket_numel": config.prefetch_bucket_size,
        "gathered_peak_bytes": int(gathered_peak),
        "parameter_bytes_total": int(p["bytes"].sum()),
        "parameter_bytes_rank": int((p["shard_numel"] * p["itemsize"]).sum()),
    }


def _gather_schedule(layout: Layout, it: int, config: ZeroConfig) -> int:
    """ZeRO-3's fetch / prefetch / release of each module's parameters in iteration ``it``; the largest number of
    gathered bytes at once."""
    e, n, p = layout.edit, layout.world_size, layout.params
    uses: list[tuple[int, int, int, str]] = []  # (first, last, unit, phase)
    for ph in ("forward", "backward"):
        for u in sorted(set(p["unit"].tolist())):
            w = layout.window(u, it, ph)
            if w is not None:
                uses.append((w[0], w[1], u, ph))
    uses.sort()
    gathered_numel = {}
    for u in set(p["unit"].tolist()):
        m = p[(p["unit"] == u) & ~p["persist"]]
        gathered_numel[u] = (int(sum(ceil_div(x, n) * n for x in m["numel"])), m)
    live: dict[int, tuple[int, int]] = {}  # unit -> (buffer alloc_id, bytes)
    peak = 0
    for i, (first, last, u, _ph) in enumerate(uses):
        to_fetch = [u]
        budget = config.prefetch_bucket_size
        for _f2, _l2, u2, _p2 in uses[i + 1 :]:
            numel = gathered_numel[u2][0]
            if numel == 0 or u2 in to_fetch:
                continue
            if budget - numel < 0:
                break
            budget -= numel
            to_fetch.append(u2)
        for v in to_fetch:
            numel, members = gathered_numel[v]
            if numel == 0 or v in live:
                continue
            size = int(sum(ceil_div(x, n) * n * s for x, s in zip(members["numel"], members["itemsize"], strict=True)))
            buf = e.add(size, e.before(first), None, COMM, "deepspeed:allgather_coalesced")
            e.kernel("nccl:all_gather", e.before(first), [(buf, 0, size, True)])
            live[v] = (buf, size)
        peak = max(peak, sum(b for _a, b in live.values()))
        buf, _size = live.get(u, (None, 0))
        if buf is not None:
            off = 0
            for aid, x, s in zip(gathered_numel[u][1]["alloc_id"], gathered_numel[u][1]["numel"],
                                 gathered_numel[u][1]["itemsize"], strict=True):  # fmt: skip
                e.remap(int(aid), first, last, buf, off)
                off += ceil_div(int(x), n) * n * int(s)
            distance = sum(
                gathered_numel[u2][0] for f2, _l, u2, _p in uses[i + 1 :] if u2 != u and f2 < _next_use(uses, i, u)
            )
            if _next_use(uses, i, u) == 1 << 62 or distance > config.max_reuse_distance:
                e.set_free(buf, e.after(last))
                del live[u]
    bwd = layout.span(it, "backward")
    end = bwd[1] if bwd is not None else layout.span(it, "forward")[1]  # type: ignore[index]
    for buf, _size in live.values():
        e.set_free(buf, e.after(end))
    return peak


def _next_use(uses: list[tuple[int, int, int, str]], i: int, unit: int) -> int:
    """First seq of ``unit``'s next use after ``uses[i]`` (1 << 62: none in this iteration)."""
    return next((f for f, _l, u, _p in uses[i + 1 :] if u == unit), 1 << 62)
