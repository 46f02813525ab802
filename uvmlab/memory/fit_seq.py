"""The longest sequence that fits a GPU: ``uvmlab estimate --max-seq-len`` (as ``--fit-batch`` does for the batch).

``max_seq_len(cfg, gpu)`` searches the multiples of ``step`` for the largest ``seq_len`` whose estimate fits
(``uvmlab.memory.estimate.estimate``: the allocator's own OOM verdict on the GPU's capacity minus the CUDA
context, the verdict ``uvmlab estimate`` prints). It starts at the workload's ``seq_len`` (rounded down to a
multiple of ``step``), doubles while that fits, then bisects between the last length that fits and the first
that does not. A length the workload refuses (beyond the model's positions) counts as not fitting, so the answer
never exceeds what the model accepts. The search assumes that a longer sequence never needs less memory
(activations and attention grow with it); ``tests/test_fit_seq.py`` checks the answer against a sweep of
``--seq-len``.

Every probe is a capture of its own (cached), so the search costs about log2(answer / step) + 2 captures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import GpuSpec

DEFAULT_STEP = 64
"""Granularity of the search in tokens (a choice: sequence lengths are usually picked in multiples of 64)."""
MAX_SEQ_LEN = 1 << 22
"""Largest length probed (4M tokens): the doubling stops there."""


@dataclass
class SeqFit:
    """The answer of :func:`max_seq_len`."""

    max_seq_len: int | None
    """The largest multiple of ``step`` that fits (None: not even ``step`` tokens)."""
    step: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    """Every length tried, in order: ``seq_len``, ``fits``, ``device_peak_bytes`` (or ``refused``: the reason)."""
    estimate: Any = None
    """The Estimate at ``max_seq_len`` (None when nothing fits)."""

    def to_json(self) -> dict[str, Any]:
        """The ``max_seq_len`` object of ``uvmlab estimate --max-seq-len --format json``."""
        return {"max_seq_len": self.max_seq_len, "step": self.step, "probes": self.probes}


def max_seq_len(
    cfg: WorkloadConfig,
    gpu: GpuSpec,
    step: int = DEFAULT_STEP,
    progress: Callable[[str], None] | None = None,
    estimate_fn: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> SeqFit:
    """The largest ``seq_len`` (a multiple of ``step``) at which ``cfg`` fits ``gpu`` (module docstring).

    ``kwargs`` go to :func:`uvmlab.memory.estimate.estimate` (allocator, rules, margin, ...); ``estimate_fn``
    replaces it (tests)."""
    from workloads.registry import load_workload

    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise InputError(f"the sequence-length step must be a whole number >= 1, not {step!r}")
    spec = load_workload(cfg.workload)
    if "seq_len" not in spec.options:
        raise InputError(f"workload {cfg.workload} has no seq_len option: --max-seq-len applies to sequence models")
    if "seq_len" in cfg.options:
        raise InputError("--max-seq-len searches the sequence length itself: leave out --seq-len / seq_len")
    if estimate_fn is None:
        from uvmlab.memory.estimate import estimate as estimate_fn
    say = progress or (lambda _msg: None)
    fit = SeqFit(None, step)
    results: dict[int, tuple[bool, Any]] = {}

    def ok(length: int) -> bool:
        if length not in results:
            say(f"estimating seq_len {length:,}")
            probe = replace(cfg, options={**cfg.options, "seq_len": length})
            try:
                est = estimate_fn(probe, gpu, **kwargs)
            except InputError as exc:  # the workload refuses this length (e.g. beyond its positions)
                results[length] = (False, None)
                fit.probes.append({"seq_len": length, "fits": False, "refused": str(exc)})
                return False
            results[length] = (not est.oom, est)
            fit.probes.append({"seq_len": length, "fits": not est.oom, "device_peak_bytes": est.device_peak_bytes})
        return results[length][0]

    start = max(step, int(spec.resolve_options(cfg)["seq_len"]) // step * step)
    if ok(start):
        lo, hi = start, None
        while hi is None:
            nxt = lo * 2
            if nxt > MAX_SEQ_LEN:
                break
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
        if hi is None:
            hi = lo + step  # MAX_SEQ_LEN reached: the answer is the last doubling
    else:
        if not ok(step):
            return fit
        lo, hi = step, start
    while hi - lo > step:
        mid = (lo // step + hi // step) // 2 * step
        if ok(mid):
            lo = mid
        else:
            hi = mid
    fit.max_seq_len = lo
    fit.estimate = results[lo][1]
    return fit
