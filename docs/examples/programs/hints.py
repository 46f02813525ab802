"""cudaMemPrefetchAsync and every cudaMemAdvise, before and during the loop (docs/workloads.md).

    uvmlab run docs/examples/programs/hints.py -n 2 --oversub 2

``table`` is read by every kernel and never written by the GPU: read-mostly (each processor keeps its own copy).
``weights`` should live on the GPU: preferred location GPU, prefetched once. ``staging`` is written by the host
and read once per iteration by the GPU: it stays on the CPU and the GPU reads it over the link (preferred location
CPU + accessed-by GPU). ``out`` is read by the host after each iteration: accessed-by CPU, prefetched to the CPU.
Half way through, the program changes its mind about ``table`` (unset read-mostly: it will be written) and about
``staging`` (unset both hints: from now on it migrates like any page).
"""

OPTIONS = {"mb": 32}
DESCRIPTION = "every cudaMemAdvise and cudaMemPrefetchAsync, some of them mid-run"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    table = torch.empty(n, device=uvm.device)
    weights = torch.empty(n, device=uvm.device)
    staging = torch.empty(n, device=uvm.device)
    out = torch.empty(n, device=uvm.device)

    uvm.host_write(table)
    uvm.advise(table, "set_read_mostly")  # cudaMemAdviseSetReadMostly
    uvm.advise(weights, "set_preferred_location", "gpu")  # cudaMemAdviseSetPreferredLocation, device 0
    uvm.prefetch(weights, "gpu")  # cudaMemPrefetchAsync(weights, n, 0, stream)
    uvm.advise(staging, "set_preferred_location", "cpu")  # ... cudaCpuDeviceId
    uvm.advise(staging, "set_accessed_by", "gpu")  # cudaMemAdviseSetAccessedBy, device 0
    uvm.advise(out, "set_accessed_by", "cpu")  # cudaMemAdviseSetAccessedBy, cudaCpuDeviceId

    half = max(1, cfg.iterations // 2)
    for it in uvm.iterations():
        uvm.host_write(staging)  # new input from the host: stays on the CPU
        torch.add(table, weights, out=out)
        out.add_(staging)  # the GPU reads staging remotely (no faults, link traffic)
        uvm.prefetch(out, "cpu")  # cudaMemPrefetchAsync(out, n, cudaCpuDeviceId, stream)
        uvm.host_read(out)
        if it == half - 1:  # mid-run changes of policy
            uvm.advise(table, "unset_read_mostly")  # cudaMemAdviseUnsetReadMostly
            table.mul_(0.5)  # the GPU now writes the table
            uvm.advise(staging, "unset_accessed_by", "gpu")  # cudaMemAdviseUnsetAccessedBy
            uvm.advise(staging, "unset_preferred_location")  # cudaMemAdviseUnsetPreferredLocation
            uvm.advise(out, "unset_accessed_by", "cpu")
