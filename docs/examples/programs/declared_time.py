"""A kernel may say its native time or its efficiency (uvm.kernel native_ms=, efficiency=), because a user who ran
it knows it; otherwise its class rule times it (docs/uvm-sim.md "Native kernel time by class").

    uvmlab run docs/examples/programs/declared_time.py -n 2 --oversub 1.5

``stencil`` was timed on the real GPU (1.5 ms): that time is used as is. ``naive_gemm`` is a hand-written GEMM
that reaches 5 % of the FP32 peak. ``one_thread`` is launched with a single thread: the serial rule (one warp's
requests in flight) times it, far slower than the DRAM roofline. Faults and migrations come on top of each.
"""

OPTIONS = {"mb": 16}
DESCRIPTION = "declared native time, declared efficiency and a single-thread launch"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    a = torch.empty(n, device=uvm.device)
    b = torch.empty(n, device=uvm.device)
    uvm.host_write(a)
    for _ in uvm.iterations():
        uvm.kernel("stencil", reads=[a], writes=[b], native_ms=1.5)
        uvm.kernel("naive_gemm", reads=[a, b], writes=[b], flops=2e11, efficiency=0.05, stride_bytes=4)
        uvm.kernel("one_thread", reads=[a], writes=[b], threads=1, stride_bytes=4)
