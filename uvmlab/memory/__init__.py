"""What memory will this job need? Estimates (``estimate``), the CUDA context and libraries (``devicemem``),
collocation (``colocate``), fragmentation (``fragmentation``) and real snapshots replayed (``replay``,
``replay_state``). Built on ``uvmlab.trace`` and ``uvmlab.sim.allocator``; must not import ``uvmlab.uvm``,
``uvmlab.measure``, ``uvmlab.advise``, ``uvmlab.report`` or the CLI."""
