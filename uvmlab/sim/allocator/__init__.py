"""PyTorch's caching allocator, modelled from c10/cuda/CUDACachingAllocator.cpp (docs/allocator.md).

Entry points: ``caching.CachingAllocatorSim`` (one class: its expandable-segment, release, seeding, invariant and
snapshot helpers are mixin methods in ``expandable``, ``release``, ``seed``, ``checks``, ``snapshot_dicts``),
``nocache.NoCacheAllocatorSim`` (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``), ``device.DeviceSim`` (cudaMalloc against
capacity), ``placement.place`` (a trace -> managed ranges), ``planner.plan`` (an offline plan),
``allocconf.AllocatorSettings`` (``PYTORCH_CUDA_ALLOC_CONF``).

Must not import: torch, ``uvmlab.sim.uvm``, or anything outside ``uvmlab.sim.allocator`` but ``uvmlab.errors``,
``uvmlab.units``, ``uvmlab.gpus`` (GPU sizes) and ``uvmlab.trace.schema`` (the Trace tables it places).
"""
