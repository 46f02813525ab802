"""The NVIDIA UVM driver, modelled from open-gpu-kernel-modules (docs/uvm-sim.md): 2 MiB VA blocks, fault batches,
the tree prefetcher, least-recently-migrated eviction, hints, stream kernels, and the cost model.

Entry points: ``driver.UvmSim`` (the driver state; fault service, per-tensor hints, stream kernels, cudaMemAdvise
policies and host accesses are mixins in ``faults``, ``hints``, ``streams``, ``advice``, ``host``),
``replay.replay`` (a placed trace -> the run tables), ``knobs.UvmKnobs`` (module parameters),
``timing.CostParams``, ``profile`` (per-GPU cost profiles in ``profiles/``) and ``generations`` (which profile's
fault path a driver version takes), ``whatif`` (footprint what-ifs).

Must not import: torch, ``uvmlab.sim.allocator`` (it receives managed ranges as tables), or anything above
``uvmlab.sim`` but ``uvmlab.errors``, ``uvmlab.units``, ``uvmlab.gpus``, ``uvmlab.files.atomic`` (parameter
files) and ``uvmlab.trace.schema``.
"""
