"""The prefetching allocator: every new allocation is prefetched to the GPU as soon as it is made
(docs/workloads.md), as GCN's benchmark did with a CUDAPluggableAllocator that calls cudaMemPrefetchAsync after
each cudaMallocManaged.

    uvmlab run docs/examples/programs/prefetching_allocator.py -n 3 --oversub 1.5 --pca off

Turned on for the per-iteration activations, off for a scratch buffer the GPU fills itself.
"""

OPTIONS = {"mb": 32, "layers": 4, "prefetch": True}
DESCRIPTION = "a feed-forward pass whose activations are prefetched when allocated"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    features = torch.empty(n, device=uvm.device)
    uvm.host_write(features)
    scratch = torch.empty(n, device=uvm.device)  # allocated before: not prefetched
    uvm.prefetch_new_allocations(options["prefetch"])  # from now on: cudaMallocManaged + cudaMemPrefetchAsync
    for _ in uvm.iterations():
        h = features
        for _layer in range(options["layers"]):
            h = torch.relu(h * 0.5 + 1.0)  # new activations: each allocation prefetched first
        scratch.copy_(h)
    uvm.prefetch_new_allocations(False)
    uvm.host_read(scratch)
