"""uvmbench's seq_stream written as a user would: torch ops plus one host write (no custom kernel declaration).

``uvmlab run workloads/files/uvmbench_torch.py --option size_factor=1.25 --gpu RTX5090 --gpu-memory 33669316608``

The same program as ``workloads/files/uvmbench.py --option kernel=seq_stream`` (gpu_ext ``microbench/memory``
``seq_chunk_kernel``): two float arrays of ``size_factor x total_bytes / 2`` bytes each, the CPU writes the input,
then every launch reads one element per 4 KiB page of the input and writes one per page of the output:
``torch.mul(inp[::1024], 2, out=out[::1024])``, one elementwise kernel over strided views, as
``seq_chunk_kernel`` is one kernel whose threads read and write the same index. 2 warm-up launches, then the timed
ones (``uvm.iterations()``). The access order of each kernel is the one the simulator derives from the op
(docs/uvm-sim.md): nothing here names it. It is the issue-24 acceptance case "a user-written uvmbench file"
(docs/validation.md), scored by ``uvmlab validate`` (``uvm/uvmbench-rtx5090``).

Why not ``out[::1024] = inp[::1024] * 2``: on a GPU that is two kernels, a multiply into a temporary and then a
strided copy into ``out``, so the input is streamed through memory before the output is touched: a different program
from the benchmark (uvmlab predicts 2.29x the measured seq_stream time at 1.5x for it, 1.59x for this one).
"""

OPTIONS = {"size_factor": 1.0, "total_bytes": 33_669_316_608}
DESCRIPTION = "uvmbench seq_stream in plain torch: a page-strided multiply over a host-written array"

PAGE_FLOATS = 1024
"""One float per 4 KiB page (uvmbench ``--stride_bytes=4096``)."""
WARMUP = 2


def program(uvm, cfg, options):
    import torch

    n = int(int(options["total_bytes"]) * float(options["size_factor"])) // 2 // 4
    inp = torch.empty(n, device=uvm.device)
    out = torch.empty(n, device=uvm.device)
    uvm.host_write(inp)
    for _ in range(WARMUP):
        torch.mul(inp[::PAGE_FLOATS], 2, out=out[::PAGE_FLOATS])
    for _ in uvm.iterations():
        torch.mul(inp[::PAGE_FLOATS], 2, out=out[::PAGE_FLOATS])
