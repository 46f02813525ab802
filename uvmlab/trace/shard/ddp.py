"""PyTorch ``DistributedDataParallel`` on one rank: the gradient buckets. Torch-free.

DDP replicates parameters, gradients and optimizer state on every rank; what it adds are its gradient buckets,
flat tensors the gradients are copied into (``Reducer::mark_variable_ready_dense``: ``at::mul_out(bucket_view,
grad, 1/world_size)``) and all-reduced in place, then copied back into the gradients
(``Reducer::finalize_bucket_dense``). Rules, from PyTorch 2.14.1 (``torch/nn/parallel/distributed.py``) and
``torch/csrc/distributed/c10d/reducer.cpp``:

- *Which parameters*: those that require a gradient, in ``named_modules()`` order, each once
  (``_build_params_for_reducer``). Frozen parameters (a LoRA base) get no bucket space.
- *Initial buckets* (built in the constructor, so before the first iteration): with ``find_unused_parameters=False``
  and no static graph (the defaults), "disable initial bucketing by using maxsize (put all params in one bucket
  initially)" (``_BucketCapacityConfig.compute_bucket_size_limits``: ``[sys.maxsize]``): one bucket per dtype.
- *Rebuilt buckets*: before the second iteration's forward (``DistributedDataParallel.forward`` ->
  ``reducer._rebuild_buckets()``), ``Reducer::rebuild_buckets`` frees the old buckets (``initialize_buckets``:
  ``buckets_.clear()``) and assigns the parameters again in the order their gradients became ready in the first
  backward, with the limits ``{first_bucket_bytes_cap_, bucket_bytes_cap_}`` = 1 MiB
  (``dist._DEFAULT_FIRST_BUCKET_BYTES``) then 25 MiB (``_DEFAULT_BUCKET_CAP_MB`` x ``_MB_TO_BYTES``).
- *Assignment* (``compute_bucket_assignment_by_size``): per (dtype, device), tensors are added to the open bucket;
  when its size reaches the current limit (``bucket.size >= bucket_size_limit``) the bucket is closed and the
  next limit taken (the last one repeats); open buckets are closed at the end. Without explicit indices the
  buckets are sorted by their smallest tensor index. So a bucket can exceed the limit by its last tensor (a
  vocabulary-sized embedding gradient is one bucket by itself).
- *Bucket memory*: ``bucket.gradients = at::empty({offset}, options)``, the sum of its tensors' elements in their
  dtype; buckets live until they are rebuilt or DDP is destroyed. With the default ``gradient_as_bucket_view=
  False`` the gradients stay separate tensors, so DDP holds the trainable parameters' gradient bytes twice.

Not modelled: NCCL's own device buffers (outside PyTorch's allocator), ``gradient_as_bucket_view=True``,
``static_graph`` and ``find_unused_parameters=True`` (whose initial buckets are already 1 MiB / 25 MiB).
"""

from __future__ import annotations

import sys
from typing import Any

from uvmlab.trace.shard.layout import COMM, Layout

DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
"""``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB)."""
DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024
"""``_DEFAULT_BUCKET_CAP_MB = 25`` x ``_MB_TO_BYTES = 1024 * 1024`` (torch/nn/parallel/distributed.py)."""
NO_LIMIT = sys.maxsize
"""The initial bucket limit without ``find_unused_parameters`` (``[sys.maxsize]``)."""


def assign_buckets(
    nbytes: list[int], keys: list[Any], limits: list[int], indices: list[int] | None = None
) -> list[tuple[list[int], int]]:
    """``compute_bucket_assignment_by_size`` (reducer.cpp) without sparse gradients: (tensor indices, size limit)
    per bucket. ``nbytes[i]`` and ``keys[i]`` (dtype) describe the i-th tensor; ``indices[i]``, when given, is its
    index (the rebuilt, gradient-ready order: the buckets are then not sorted)."""
    result: list[tuple[list[int], int]] = []
    open_: dict[Any, list[Any]] = {}
    position: dict[Any, int] = {}
    for i, (size, key) in enumerate(zip(nbytes, keys, strict=True)):
        index = indices[i] if indices is not None else i
        bucket = open_.setdefault(key, [[], 0, 0])
        bucket[0].append(index)
        bucket[1] += int(size)
        pos = position.setdefault(key, 0)
        bucket[2] = limits[pos]
        if bucket[1] >= limits[pos]:
            result.append((bucket[0], bucket[2]))
            open_[key] = [[], 0, 0]
            if pos + 1 < len(limits):
                position[key] = pos + 1
    result += [(b[0], b[2]) for b in open_.values() if b[0]]
    if indices is None:
        result.sort(key=lambda r: min(r[0]))
    return result


def ddp(layout: Layout, bucket_cap_mb: int | None = None) -> dict[str, Any]:
    """Apply DDP's buckets to ``layout`` (module docstring); the header summary (bucket sizes). ``bucket_cap_mb``:
    DDP's argument (None: the default 25 MiB, with the 1 MiB first bucket; given, both limits are it:
    ``_BucketCapacityConfig.create``)."""
    e = layout.edit
    cap = DEFAULT_BUCKET_CAP_BYTES if bucket_cap_mb is None else int(bucket_cap_mb) * 1024 * 1024
    first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    p = layout.params[layout.params["trainable"]].reset_index(drop=True)
    if p.empty:
        return {"buckets_initial_bytes": [], "buckets_rebuilt_bytes": []}
    nbytes = p["bytes"].astype(int).tolist()
    keys = p["dtype"].tolist()
    initial = [b for b, _ in reversed(assign_buckets(nbytes, keys, [NO_LIMIT]))]
    first_it = layout.iterations[0]
    ready = {pa: layout.ready_seq(g) for pa, g in layout.grads(first_it)}
    order = sorted(range(len(p)), key=lambda i: (ready.get(int(p["alloc_id"].iat[i]), 1 << 62), i))
    rebuilt = [
        b
        for b, _ in assign_buckets(
            [nbytes[i] for i in order],
            [keys[i] for i in order],
            [first, cap],
            order,
        )
    ]
    setup_at = layout.setup_end()
    current = [_bucket(layout, p, b, e.after(setup_at)) for b in initial]
    sets = {first_it: (initial, current)}
    if len(layout.iterations) > 1:
        it1 = layout.iterations[1]
        fwd = layout.span(it1, "forward")
        at = fwd[0] if fwd is not None else layout.spans[layout.spans["iteration"] == it1]["first"].min()
        for aid in current:
            e.set_free(aid, e.before(at))
        new = [_bucket(layout, p, b, e.before(at)) for b in rebuilt]
        for it in layout.iterations[1:]:
            sets[it] = (rebuilt, new)
    for it in layout.iterations:
        _bucket_kernels(layout, p, it, *sets[it])
    return {
        "buckets_initial_bytes": [int(sum(nbytes[i] for i in b)) for b in initial],
        "buckets_rebuilt_bytes": [int(sum(nbytes[i] for i in b)) for b in rebuilt],
        "bucket_cap_bytes": cap,
        "first_bucket_bytes": first,
    }


def _bucket(layout: Layout, p: Any, members: list[int], at: tuple[int, int]) -> int:
    size = int(sum(int(p["bytes"].iat[i]) for i in members))
    return layout.edit.add(size, at, None, COMM, "ddp:bucket")


def _bucket_kernels(layout: Layout, p: Any, it: int, buckets: list[list[int]], ids: list[int]) -> None:
    """The copies into the buckets as gradients become ready, an all-reduce per full bucket, the copies back at
    the end of backward."""
    e = layout.edit
    grads = dict(layout.grads(it))
    bwd = layout.span(it, "backward")
    if bwd is None:
        return
    for members, bucket in zip(buckets, ids, strict=True):
        offset, last = 0, None
        touches_back = []
        for i in members:
            pa, size = int(p["alloc_id"].iat[i]), int(p["bytes"].iat[i])
            g = grads.get(pa)
            if g is not None:
                ready = layout.ready_seq(g)
                e.kernel("ddp:copy_grad_to_bucket", e.after(ready), [(g, 0, size, False), (bucket, offset, size, True)])
                last = ready if last is None else max(last, ready)
                touches_back += [(bucket, offset, size, False), (g, 0, size, True)]
            offset += size
        if last is not None:
            e.kernel("nccl:all_reduce", e.after(last), [(bucket, 0, offset, False), (bucket, 0, offset, True)])
            e.kernel("ddp:copy_bucket_to_grad", e.after(bwd[1]), touches_back)
