"""The evidence kit: ``uvmlab collect [--what memory,cudnn,uvm,link] -o DIR`` on any NVIDIA GPU.

It records, on the GPU it finds, the data the fidelity questions of docs/estimate.md and docs/uvm-sim.md stopped on,
in the real-data layout ``uvmlab validate DIR`` reads (``layout``), so the scorecard (and ``uvmlab calibrate``) run
on it unchanged. Modules, each with one job:

``plan``        what to run (pure): ``CollectOptions``, ``plan_collect``, ``format_kit_plan`` (the dry run);
``runner``      run the plan's steps (child processes) and assemble the data sets: ``collect_evidence``;
``layout``      the folder layout and its writers/readers (shared with uvmlab/validate/collect_checks.py);
``memory_step`` child: one training case with a memory snapshot, PyTorch's peaks, the NVML peak, versions, and
                (cuDNN cases) the cuDNN API log of one iteration;
``uvm_step``    child: uvmbench-style page-strided streams over managed memory (CuPy);
``gcn``         child: the noob512 GCN (benchmark_gnn_uvm.py) under UVM and natively;
``link_step``   child: the host-device bandwidth curve and fault service cost (uvmlab.measure.gpu.microbench);
``facts_step``  child: the machine (runtime, driver, attributes, tools, the worker's import check);
``probe_step``  child: the shim and UVM on the real runtime (interposition, balloon, residency, the hint codes);
``run_step``    child: one ``uvmlab run --mode gpu`` at factor 0.75, refused when it could exceed free memory;
``sizing``      how much managed memory a step may hold (measured free minus a margin, the estimator's worst miss);
``nvml_peak``   the NVML whole-process peak, sampled by a thread;
``cudnn_log``   cuDNN API logs (v7/v8 ``CUDNN_LOGINFO_DBG``, v9 ``CUDNN_LOGLEVEL_DBG``) parsed into per-call rows.
See docs/gpu.md "The first GPU run".
"""
