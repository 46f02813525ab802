"""uvmlab.measure.gpu: the real-GPU path (torch only inside the worker and the evidence kit's child steps).

``shim`` (build/locate/configure the LD_PRELOAD shim, read its allocation log), ``balloon`` (the arithmetic),
``detect`` (``gpu_status()``), ``plan`` (``GpuRunOptions``, ``plan_run``, ``format_plan``; re-exported by
``runner``), ``runner`` (``run_gpu``, ``dry_run``), ``worker`` (the child process), ``collect`` (the run
directory), ``microbench`` (calibration), ``cudart`` (the CUDA runtime by path, device attributes), ``doctor``,
``program_backend`` (what a program file's ``uvm.*`` calls do on the GPU), and
``kit`` (the evidence kit, ``uvmlab collect``). See docs/gpu.md.
"""
