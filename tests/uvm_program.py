"""Tiny synthetic programs for the UVM replay: tensors, kernels and API rows (IFACE24.md ``api`` / ``api_arg``).

Torch-free. Every tensor is allocated before the first step and never freed; each is its own managed range
(``tests.uvm_synth.nocache_placement``). Kernels are in phase ``compute`` on tensors of category ``activation``,
so the replay never takes one for a retained ``cudaMemcpy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tests.uvm_synth import nocache_placement
from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.sim.uvm.knobs import UvmKnobs
from uvmlab.sim.uvm.replay import ReplayResult, replay
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.schema import NEVER_FREED, Trace


@dataclass
class Program:
    """Build a trace step by step; :meth:`run` replays it and returns (result, per-step kernel rows)."""

    sizes: dict[str, int]
    allocs: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    accesses: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, (name, size) in enumerate(self.sizes.items()):
            self.allocs.append(
                {
                    "alloc_id": i,
                    "size_bytes": size,
                    "alloc_seq": i,
                    "free_seq": NEVER_FREED,
                    "category": "activation",
                    "phase": "compute",
                    "iteration": 0,
                    "op": name,
                    "stream": 0,
                }
            )

    def _id(self, name: str) -> int:
        return list(self.sizes).index(name)

    def _row(self, name: str, api: str = "", arg: str = "", flops: float = 0.0, touched: float | None = None) -> int:
        kid = len(self.kernels)
        self.kernels.append(
            {
                "touched_bytes": float("nan") if touched is None else touched,
                "kernel_id": kid,
                "seq": 1000 + kid,
                "name": name,
                "phase": "compute",
                "iteration": 0,
                "flops": flops,
                "stream": 0,
                "api": api,
                "api_arg": arg,
            }
        )
        return kid

    def _touch(self, kid: int, tensor: str, write: bool, offset: int = 0, size: int | None = None) -> None:
        self.accesses.append(
            {
                "kernel_id": kid,
                "alloc_id": self._id(tensor),
                "offset_bytes": offset,
                "size_bytes": self.sizes[tensor] - offset if size is None else size,
                "is_write": write,
            }
        )

    def kernel(
        self,
        reads: tuple[str, ...] = (),
        writes: tuple[str, ...] = (),
        size: int | None = None,
        touched: float | None = None,
    ) -> int:
        """A kernel reading and writing whole tensors (or their first ``size`` bytes; ``touched``: the DRAM bytes it
        really moves, the trace's optional ``touched_bytes``); returns its step index."""
        kid = self._row("k", touched=touched)
        for t in reads:
            self._touch(kid, t, False, size=size)
        for t in writes:
            self._touch(kid, t, True, size=size)
        return kid

    def api(self, kind: str, tensor: str, arg: str = "", offset: int = 0, size: int | None = None) -> int:
        """An ``api`` row (``advise``, ``prefetch``, ``host_write``, ``host_read``) on a tensor or a byte range."""
        kid = self._row(kind, kind, arg)
        self._touch(kid, tensor, kind == "host_write", offset, size)
        return kid

    def trace(self) -> Trace:
        return Trace(
            allocations=pd.DataFrame(self.allocs),
            kernels=pd.DataFrame(self.kernels),
            accesses=pd.DataFrame(self.accesses),
            header={"workload": "program"},
        )

    def run(
        self,
        capacity: int,
        gpu: GpuSpec | None = None,
        knobs: UvmKnobs | None = None,
        costs: CostParams | None = None,
    ) -> tuple[ReplayResult, pd.DataFrame]:
        tr = self.trace()
        res = replay(tr, nocache_placement(tr), capacity, gpu or GPUS["A100-80GB"], knobs, costs, check_every=1)
        return res, res.kernels.set_index("kernel_id")
