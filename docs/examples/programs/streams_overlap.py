"""A prefetch on a second stream overlaps compute, as on hardware (uvm.stream, uvm.event; docs/workloads.md).

    uvmlab run docs/examples/programs/streams_overlap.py -n 3
    uvmlab run docs/examples/programs/streams_overlap.py -n 3 --option overlap=false

Each iteration the host refreshes four chunks of managed memory, then the GPU works through them: chunk i + 1 is
prefetched (``cudaMemPrefetchAsync``) on a copy stream while chunk i is computed on the default stream, and the
compute of chunk i + 1 waits for its prefetch's event. With ``overlap=false`` every prefetch is on the default
stream, so copies and compute alternate.
"""

OPTIONS = {"mb": 256, "chunks": 4, "passes": 32, "overlap": True}
DESCRIPTION = "chunked compute with the next chunk prefetched on a side stream"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4 // options["chunks"]
    chunks = [torch.empty(n, device=uvm.device) for _ in range(options["chunks"])]
    copy = uvm.stream()  # a non-blocking stream, as torch.cuda.Stream() makes
    for _ in uvm.iterations():
        for c in chunks:
            uvm.host_write(c)  # the host refreshes the data: its pages go back to the CPU
        uvm.prefetch(chunks[0], "gpu")
        for i, c in enumerate(chunks):
            nxt = chunks[i + 1] if i + 1 < len(chunks) else None
            if nxt is not None and options["overlap"]:
                ready = uvm.event()
                uvm.prefetch(nxt, "gpu", stream=copy)  # on the copy stream, beside the compute below
                ready.record(copy)
            for _ in range(options["passes"]):
                c.mul_(1.0001)  # compute on chunk i (default stream)
            if nxt is not None:
                if options["overlap"]:
                    uvm.wait(ready)  # the default stream waits for chunk i + 1's prefetch
                else:
                    uvm.prefetch(nxt, "gpu")  # on the default stream: after the compute, before the next
        uvm.synchronize()
