"""A row-per-thread kernel (docs/uvm-sim.md "Concurrent kernels and cascades"): each of ``rows`` threads sums its
own row of a ``rows x row_kib`` fp32 matrix, 4 bytes at a time, and writes one float. Every resident thread walks
its own row at once, so the kernel's concurrent working set is the whole matrix when the GPU keeps every thread
in flight.

    uvmlab run docs/examples/programs/row_per_thread.py --gpu A100-80GB --gpu-memory 24GiB -n 3
    uvmlab run docs/examples/programs/row_per_thread.py --gpu A100-80GB --gpu-memory 12GiB -n 3

The first run fits (the 16 GiB matrix stays resident after the first launch); the second is 1.4x oversubscribed.
"""

OPTIONS = {"rows": 65536, "row_kib": 256}
DESCRIPTION = "a row-per-thread reduction: each thread walks its own row (a cascade when the matrix does not fit)"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    rows, row_bytes = int(options["rows"]), int(options["row_kib"]) << 10
    matrix = torch.empty(rows, row_bytes // 4, device=uvm.device)
    sums = torch.empty(rows, device=uvm.device)
    uvm.host_write(matrix)  # the host fills the matrix: it starts in CPU memory
    for _ in uvm.iterations():
        # thread i: sums[i] = sum(matrix[i, :]), one 4-byte element after the other
        uvm.kernel("row_sum", reads=[matrix], writes=[sums], pattern="sequential", threads=rows, stride_bytes=4)
