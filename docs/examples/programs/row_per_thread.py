"""A row-per-thread kernel (docs/uvm-sim.md "Concurrent kernels, cascades and thrashing"): each of ``rows`` threads
sums its own row of a ``rows x row_kib`` fp32 matrix, 4 bytes at a time, and writes one float. The GPU keeps every
thread in flight (65,536 threads; an A100 holds 221,184), so the kernel's concurrent working set is the whole matrix.

    uvmlab run docs/examples/programs/row_per_thread.py --oversub 0.9 -n 3
    uvmlab run docs/examples/programs/row_per_thread.py --oversub 1.25 -n 3

At 0.9x the 16 GiB matrix migrates once and later launches run at native speed; at 1.25x LRM evicts rows other warps
still walk and every launch migrates again (measured in docs/uvm-sim.md).
"""

OPTIONS = {"rows": 65536, "row_kib": 256}
DESCRIPTION = "a row-per-thread reduction: every thread walks its own row of a matrix at once"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    rows, row_bytes = int(options["rows"]), int(options["row_kib"]) << 10
    matrix = torch.empty(rows, row_bytes // 4, device=uvm.device)
    sums = torch.empty(rows, device=uvm.device)
    uvm.host_write(matrix)  # the host fills the matrix: it starts in CPU memory
    for _ in uvm.iterations():
        # thread i: sums[i] = sum(matrix[i, :]), one 4-byte element after the other
        uvm.kernel("row_sum", reads=[matrix], writes=[sums], pattern="sequential", threads=rows, stride_bytes=4)
