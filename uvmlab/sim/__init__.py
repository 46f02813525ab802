"""The two simulators at uvmlab's core, torch-free: ``allocator`` (PyTorch's CUDACachingAllocator) and ``uvm``
(the NVIDIA UVM driver). Nothing else lives here; ``sim`` imports nothing above it (no services, no CLI, no
advise, report or measure code)."""
