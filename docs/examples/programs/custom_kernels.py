"""Custom kernels declared by their access pattern (docs/workloads.md): what a CUDA kernel torch does not have
reads and writes, in which order, with how many threads.

    uvmlab run docs/examples/programs/custom_kernels.py -n 2 --oversub 2

``uvm.kernel(name, reads=[...], writes=[...], pattern=..., threads=..., warp_size=..., stride_bytes=..., seed=...)``
records one kernel over the tensors' bytes; on a GPU, ``gpu=`` is the function that launches the real kernel
(e.g. a CuPy RawKernel), else a torch stand-in touches the same bytes.
"""

OPTIONS = {"mb": 64}
DESCRIPTION = "sequential, strided, random, lcg, gather, scatter and tiled kernels"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    src = torch.empty(n, device=uvm.device)
    dst = torch.empty(n, device=uvm.device)
    index = torch.empty(n // 1024, dtype=torch.int64, device=uvm.device)  # one index per 4 KiB page of src
    m = int((n // 4) ** 0.5)
    mat_a = torch.empty(m, m, device=uvm.device)
    mat_b = torch.empty(m, m, device=uvm.device)
    mat_c = torch.empty(m, m, device=uvm.device)
    uvm.host_write(src)
    uvm.host_write(index)  # the host builds the index (data: unknown to the model, which draws a seeded order)
    for _ in uvm.iterations():
        # each of 65536 threads copies its own contiguous chunk, one float per 4 KiB page (uvmbench seq_stream)
        uvm.kernel("seq_stream", reads=[src], writes=[dst], pattern="sequential", threads=65536, stride_bytes=4096)
        # one access every 64 KiB: a strided walk that touches one page in 16
        uvm.kernel("strided", reads=[src], pattern="strided", threads=4096, stride_bytes=65536)
        # each thread visits its chunk's pages in a seeded random permutation
        uvm.kernel("random", reads=[src], writes=[dst], pattern="random", threads=65536, seed=1)
        # uvmbench's rand_chunk_kernel linear congruential generator (seed = its base seed)
        uvm.kernel("lcg", reads=[src], pattern="lcg", threads=65536, seed=42)
        # dst[i] = src[index[i]]: the index read in order, src's pages in index order
        uvm.kernel("gather", reads=[index, src], writes=[dst], pattern="gather", threads=n // 1024)
        # dst[index[i]] = src[i]
        uvm.kernel("scatter", reads=[index, src], writes=[dst], pattern="scatter", threads=n // 1024)
        # C = A @ B by 128 x 128 tiles, as a GEMM walks its operands (the flops feed the roofline)
        uvm.kernel("gemm", reads=[mat_a, mat_b], writes=[mat_c], pattern="tiled", flops=2.0 * m**3)
    uvm.host_read(dst)
