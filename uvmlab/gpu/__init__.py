"""uvmlab.gpu: the real-GPU path (torch only inside the worker).

``shim`` (build/locate/configure the LD_PRELOAD shim, read its allocation log), ``balloon`` (the arithmetic),
``detect`` (``gpu_status()``), ``runner`` (``GpuRunOptions``, ``plan_run``, ``format_plan``, ``run_gpu``),
``worker`` (the child process), ``collect`` (the run directory), ``microbench`` (calibration), ``doctor``.
See docs/gpu.md.
"""
