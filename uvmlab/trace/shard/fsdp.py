"""PyTorch FSDP (``FullyShardedDataParallel``, FULL_SHARD) and FSDP2 (``fully_shard``), one rank. Torch-free.

Both wrap each repeated block (transformer layer) and the root module (units.py ``blocks``). Every buffer rule
below is read from PyTorch 2.14.1 (``torch/distributed/fsdp/``; the version uvmlab pins).

**FSDP2** (``_fully_shard/``):

- *Sharded parameters*: each parameter is chunked on dim 0 into ``world_size`` chunks; a rank holds a padded
  chunk of ``ceil(dim0 / N)`` rows (``FSDPParam._init_sharded_param``: ``padded_sharded_size = chunks[0].size()``),
  for frozen parameters too.
- *All-gather* (``_fsdp_collectives.foreach_all_gather``): one output buffer of ``N`` x the unit's padded shards
  (``all_gather_comm.allocate((all_gather_input_numel * world_size,))``) on the all-gather copy-in stream, into which
  the rank's shards are copied (``all_gather_copy_in``); then ``foreach_all_gather_copy_out`` allocates each
  parameter's unsharded storage (``alloc_all_gather_outputs``: padded shard x N) and copies into it. In forward the
  output buffer is kept until the next unit's copy-out ("defer free to allow for overlap", ``wait_for_unshard``;
  the last one is freed at the root's post-forward, ``_fsdp_state._post_forward``); in backward it is freed right
  after its copy-out. At world size 1 there is no all-gather, but the unsharded storages are still allocated and
  copied (``wait_for_unshard``, ``world_size == 1``).
- *Reshard*: non-root units free their unsharded storages after forward (``reshard_after_forward=None`` is True
  for non-root modules and False for the root, ``_fully_shard.py``) and after their backward.
- *Backward prefetch*: a unit's pre-backward all-gathers the unit that ran before it in forward
  (``_backward_prefetch``: ``post_forward_order[curr_index - 1]``); the root's prefetches the last block.
- *Reduce-scatter* (``foreach_reduce``): after a unit's backward, one input buffer of the padded unsharded
  gradients (``reduce_scatter_input_numel``), the gradients copied in (``chunk_cat``) and freed ("Only after the
  copy-in finishes can we free the gradients"), and an output of 1/N of it on the reduce-scatter stream whose
  views are the sharded gradients (``new_sharded_grad = torch.as_strided(reduce_output, ...)``): they live until
  ``zero_grad``. The input buffer is kept until the next unit's reduce (``reduce_scatter_max_input_buffers`` = 1:
  ``post_backward`` pops the oldest first) and the last at the end of backward
  (``_root_post_backward_final_callback``: ``reduce_scatter_states.clear()``).

**FSDP** (``FullyShardedDataParallel``, ``_flat_param.py``, ``_runtime_utils.py``): the unit's parameters are one
``FlatParameter`` of one dtype, padded to a multiple of N (``numel_to_pad = world_size - total_numel %
world_size``); a rank keeps 1/N of it. The all-gather writes the padded unsharded flat parameter
(``_alloc_padded_unsharded_flat_param``, the unshard stream), of which the parameters are views; it is freed after
forward for non-root units (``_should_free_in_backward``; the root keeps it) and after backward.
``backward_prefetch=BACKWARD_PRE`` (the default) gathers the next unit at a unit's pre-backward. The gradient of the
flat parameter is one unsharded tensor, made when all of the unit's parameter gradients are ready; ``_reduce_grad``
reduce-scatters it into ``new_sharded_grad = torch.empty_like(chunks[0])`` (the post-backward stream), which becomes
``_saved_grad_shard`` and then the flat parameter's ``.grad`` until ``zero_grad``; the unsharded gradient is freed
(``flat_param.grad = None``).

APPROXIMATIONS: a unit's gathers and frees are placed at its first and last kernel touching its parameters (not at
its module hooks); FSDP's per-parameter gradients are taken to live until the unit's flat gradient is made;
MixedPrecision policies (a low-precision copy of the shard and a gather in ``param_dtype``) are not modelled: the
gather is in the weights' own dtype (``--weights-dtype``); the optimizer's state follows its parameter's shard (FSDP
keeps one flat state per unit).
"""

from __future__ import annotations

from typing import Any

from uvmlab.errors import InputError
from uvmlab.trace.shard.layout import COMM, Layout
from uvmlab.trace.shard.units import ROOT, ceil_div

AG_STREAM = 1
"""Stream of the all-gather outputs (FSDP2's all-gather copy-in stream, FSDP's unshard stream)."""
RS_STREAM = 2
"""Stream of the reduce-scatter outputs (FSDP2's reduce-scatter stream, FSDP's post-backward stream)."""


def fsdp2(layout: Layout) -> dict[str, Any]:
    """Apply FSDP2 to ``layout`` (module docstring); a summary for the trace header."""
    n, e, p = layout.world_size, layout.edit, layout.params
    p["shard_numel"] = [ceil_div(d0, n) * row for d0, row in zip(p["dim0"], p["row"], strict=True)]
    p["shard_bytes"] = p["shard_numel"] * p["itemsize"]
    for aid, sb in zip(p["alloc_id"], p["shard_bytes"], strict=True):
        e.resize(int(aid), int(sb))
    layout.scale_optimizer(dict(zip(p["alloc_id"].astype(int), p["shard_bytes"].astype(int), strict=True)))
    units = layout.unit_ids()
    for it in layout.iterations:
        fwd, bwd = layout.span(it, "forward"), layout.span(it, "backward")
        if fwd is None or bwd is None:
            continue
        held: int | None = None  # the last forward all-gather output, freed at the next copy-out
        unsharded: dict[int, list[int]] = {}
        for u in units:
            w = layout.window(u, it, "forward")
            if w is None:
                continue
            at = fwd[0] if u == ROOT else w[0]
            ag = _all_gather(layout, u, at) if n > 1 else None
            if held is not None:
                e.set_free(held, e.before(at))
            unsharded[u] = _copy_out(layout, u, at, ag, it, (fwd[0], bwd[1]) if u == ROOT else w)
            if ag is not None:
                held = ag
            if u != ROOT:
                for new in unsharded[u]:
                    e.set_free(new, e.after(w[1]))
        if held is not None:
            e.set_free(held, e.after(fwd[1]))
        order = [u for u in reversed(units) if u != ROOT and layout.window(u, it, "backward") is not None]
        prefetched: dict[int, int] = {}
        if order and n > 1:
            prefetched[order[0]] = _all_gather(layout, order[0], bwd[0])
        rs_held: list[tuple[int, int] | None] = [None]
        for j, u in enumerate(order):
            b0, b1 = layout.window(u, it, "backward")  # type: ignore[misc]
            ag = prefetched.pop(u, None) if n > 1 else None
            if n > 1 and ag is None:
                ag = _all_gather(layout, u, b0)
            news = _copy_out(layout, u, b0, ag, it, (b0, b1))
            if ag is not None:
                e.set_free(ag, e.before(b0))
            if j + 1 < len(order) and n > 1:
                prefetched[order[j + 1]] = _all_gather(layout, order[j + 1], b0)
            for new in news:
                e.set_free(new, e.after(b1))
            _reduce_scatter(layout, u, it, layout.reduce_point(u, it, b1), rs_held)
        if ROOT in unsharded:
            for new in unsharded[ROOT]:
                e.set_free(new, e.after(bwd[1]))
            _reduce_scatter(layout, ROOT, it, bwd[1], rs_held)
        if rs_held[0] is not None:
            e.set_free(rs_held[0][0], e.after(max(bwd[1], rs_held[0][1])))
    return _summary(layout, int(p["shard_bytes"].sum()))


def _all_gather(layout: Layout, unit: int, at: int) -> int:
    """FSDP2's all-gather output of ``unit`` before the event at ``at``, and the collective writing it."""
    e, m = layout.edit, layout.members(unit)
    size = int(m["shard_bytes"].sum()) * layout.world_size
    ag = e.add(size, e.before(at), None, COMM, "fsdp2:all_gather_output", stream=AG_STREAM)
    reads = [(int(a), 0, int(b), False) for a, b in zip(m["alloc_id"], m["shard_bytes"], strict=True)]
    e.kernel("nccl:all_gather", e.before(at), [*reads, (ag, 0, size, True)], stream=AG_STREAM)
    return ag


def _copy_out(layout: Layout, unit: int, at: int, ag: int | None, it: int, span: tuple[int, int]) -> list[int]:
    """Each parameter's unsharded storage (padded shard x N) before ``at``, filled from ``ag`` (or, at world size 1,
    from the shard); the accesses of the kernels in ``span`` go to it. The new alloc_ids."""
    e, m, n = layout.edit, layout.members(unit), layout.world_size
    news, touches = [], []
    for aid, shard_numel, itemsize, shard_bytes in zip(
        m["alloc_id"], m["shard_numel"], m["itemsize"], m["shard_bytes"], strict=True
    ):
        size = int(shard_numel) * n * int(itemsize)
        new = e.add(size, e.before(at), None, "parameter", "fsdp2:unsharded_param")
        e.remap(int(aid), span[0], span[1], new)
        news.append(new)
        touches += [(new, 0, size, True)] + ([] if ag is not None else [(int(aid), 0, int(shard_bytes), False)])
    if ag is not None:
        touches.append((ag, 0, e.size_of(ag), False))
    e.kernel("fsdp2:split_with_sizes_copy" if ag is not None else "fsdp2:copy_", e.before(at), touches)
    return news


def _reduce_scatter(layout: Layout, unit: int, it: int, last: int, rs_held: list[tuple[int, int] | None]) -> None:
    """FSDP2's reduce of ``unit``'s gradients after the event at ``last`` (module docstring). ``rs_held``: the
    reduce-scatter input kept from the previous reduce and the seq it was made after."""
    e, n = layout.edit, layout.world_size
    m = layout.members(unit)
    grads = layout.grads(it, m)
    if not grads:
        return
    if rs_held[0] is not None:
        held, made = rs_held[0]
        last = max(last, made)  # gradients finished out of order: the reduces stay in order
        e.set_free(held, e.after(last))
    rows = m.set_index("alloc_id")
    sizes = [int(rows.at[pa, "shard_numel"]) * n * int(rows.at[pa, "itemsize"]) for pa, _g in grads]
    rs_in = e.add(sum(sizes), e.after(last), None, COMM, "fsdp2:reduce_scatter_input")
    e.kernel(
        "fsdp2:chunk_cat",
        e.after(last),
        [(g, 0, layout.edit.size_of(g), False) for _pa, g in grads] + [(rs_in, 0, sum(sizes), True)],
    )
    for _pa, g in grads:
        e.free_at(g, e.after(last))
    out_size = sum(sizes) // n
    rs_out = e.add(out_size, e.after(last), layout.free_key_of(grads[0][1]), "gradient", "fsdp2:reduce_scatter_output",
                   stream=RS_STREAM)  # fmt: skip
    e.kernel("nccl:reduce_scatter", e.after(last), [(rs_in, 0, sum(sizes), False), (rs_out, 0, out_size, True)],
             stream=RS_STREAM)  # fmt: skip
    offset = 0
    for (_pa, g), size in zip(grads, sizes, strict=True):
        full = layout.edit.size_of(g)
        e.remap(g, last + 1, 1 << 62, rs_out, offset, (size // n) / max(full, 1))
        offset += size // n
    rs_held[0] = (rs_in, last)


def fsdp1(layout: Layout) -> dict[str, Any]:
    """Apply FSDP (FlatParameter, FULL_SHARD, BACKWARD_PRE) to ``layout`` (module docstring); a header summary."""
    n, e, p = layout.world_size, layout.edit, layout.params
    units = layout.unit_ids()
    flat: dict[int, dict[str, Any]] = {}
    setup_at = layout.setup_end()
    for u in units:
        m = layout.members(u)
        sizes = set(m["itemsize"].tolist())
        if len(sizes) > 1:
            raise InputError(
                f"FSDP's FlatParameter needs one dtype per wrapped unit, but unit {'root' if u == ROOT else u} mixes "
                f"{len(sizes)} element sizes (peft keeps LoRA adapters in fp32 over a bf16 base): use --shard fsdp2, "
                "or --weights-dtype fp32"
            )
        itemsize = sizes.pop()
        total = int(m["numel"].sum())
        padded = ceil_div(total, n) * n
        shard = e.add(padded // n * itemsize, e.after(setup_at), None, "parameter", "fsdp:sharded_flat_param")
        offsets = (m["numel"].cumsum() - m["numel"]).astype(int).tolist()
        flat[u] = {"padded": padded, "itemsize": itemsize, "shard": shard, "offsets": offsets, "members": m}
        for aid in m["alloc_id"]:
            e.remove(int(aid))
    p["shard_bytes"] = 0
    for f in flat.values():
        m = f["members"]
        p.loc[m.index, "shard_bytes"] = [int(x) * f["itemsize"] // n for x in m["numel"]]
    layout.scale_optimizer(dict(zip(p["alloc_id"].astype(int), p["shard_bytes"].astype(int), strict=True)))
    for it in layout.iterations:
        fwd, bwd = layout.span(it, "forward"), layout.span(it, "backward")
        if fwd is None or bwd is None:
            continue
        full: dict[int, int] = {}
        for u in units:
            w = layout.window(u, it, "forward")
            if w is None:
                continue
            span = (fwd[0], bwd[1]) if u == ROOT else w
            full[u] = _gather_flat(layout, flat[u], fwd[0] if u == ROOT else w[0], span)
            if u != ROOT:
                e.set_free(full[u], e.after(w[1]))
        order = [u for u in reversed(units) if u != ROOT and layout.window(u, it, "backward") is not None]
        prefetched: dict[int, int] = {}
        if order:
            prefetched[order[0]] = _gather_flat(layout, flat[order[0]], bwd[0], None)
        for j, u in enumerate(order):
            b0, b1 = layout.window(u, it, "backward")  # type: ignore[misc]
            g = prefetched.pop(u, None)
            if g is None:
                g = _gather_flat(layout, flat[u], b0, (b0, b1))
            else:
                _remap_flat(layout, flat[u], g, (b0, b1))
            if j + 1 < len(order):
                prefetched[order[j + 1]] = _gather_flat(layout, flat[order[j + 1]], b0, None)
            e.set_free(g, e.after(b1))
            _reduce_flat(layout, flat[u], it, layout.reduce_point(u, it, b1))
        if ROOT in full:
            e.set_free(full[ROOT], e.after(bwd[1]))
            _reduce_flat(layout, flat[ROOT], it, bwd[1])
    for f in flat.values():  # outside the gathers (the optimizer step): the rank's shard of the flat parameter
        for aid, off in zip(f["members"]["alloc_id"], f["offsets"], strict=True):
            e.remap(int(aid), setup_at + 1, 1 << 62, f["shard"], off * f["itemsize"] // n, 1 / n)
    return _summary(layout, sum(f["padded"] // n * f["itemsize"] for f in flat.values()))


def _gather_flat(layout: Layout, f: dict[str, Any], at: int, span: tuple[int, int] | None) -> int:
    """The padded unsharded flat parameter (the all-gather's output) before ``at``; accesses in ``span`` use it
    (None: a prefetch, remapped where it is used)."""
    e = layout.edit
    size = f["padded"] * f["itemsize"]
    full = e.add(size, e.before(at), None, COMM, "fsdp:unsharded_flat_param", stream=AG_STREAM)
    shard_size = size // layout.world_size
    e.kernel("nccl:all_gather", e.before(at), [(f["shard"], 0, shard_size, False), (full, 0, size, True)],
             stream=AG_STREAM)  # fmt: skip
    if span is not None:
        _remap_flat(layout, f, full, span)
    return full


def _remap_flat(layout: Layout, f: dict[str, Any], full: int, span: tuple[int, int]) -> None:
    for aid, off in zip(f["members"]["alloc_id"], f["offsets"], strict=True):
        layout.edit.remap(int(aid), span[0], span[1], full, off * f["itemsize"])


def _reduce_flat(layout: Layout, f: dict[str, Any], it: int, last: int) -> None:
    """FSDP's flat gradient, its reduce-scatter into the sharded gradient, after the event at ``last``."""
    e, n = layout.edit, layout.world_size
    grads = layout.grads(it, f["members"])
    if not grads:
        return
    size = f["padded"] * f["itemsize"]
    flat_grad = e.add(size, e.after(last), None, "gradient", "fsdp:unsharded_flat_grad")
    e.kernel(
        "fsdp:flat_grad", e.after(last), [(g, 0, e.size_of(g), False) for _p, g in grads] + [(flat_grad, 0, size, True)]
    )
    for _p, g in grads:
        e.free_at(g, e.after(last))
    sharded = e.add(size // n, e.after(last), layout.free_key_of(grads[0][1]), "gradient", "fsdp:sharded_grad",
                    stream=RS_STREAM)  # fmt: skip
    e.kernel("nccl:reduce_scatter", e.after(last), [(flat_grad, 0, size, False), (sharded, 0, size // n, True)],
             stream=RS_STREAM)  # fmt: skip
    e.set_free(flat_grad, e.after(last))
    offsets = dict(zip(f["members"]["alloc_id"].astype(int), f["offsets"], strict=True))
    for pa, g in grads:
        e.remap(g, last + 1, 1 << 62, sharded, offsets[pa] * f["itemsize"] // n, 1 / n)


def _summary(layout: Layout, rank_bytes: int) -> dict[str, Any]:
    units = layout.unit_ids()
    return {
        "units": len(units),
        "root_unit": ROOT in units,
        "parameter_bytes_total": int(layout.params["bytes"].sum()),
        "parameter_bytes_rank": int(rank_bytes),
    }
