"""Host data: the CPU fills an input, the GPU transforms it, the CPU reads the result back (docs/workloads.md).

    uvmlab run docs/examples/programs/host_data.py -n 2 --oversub 1.5

A workload *program* (``program(uvm, cfg, options)``): no model, no training loop; it imports nothing from uvmlab.
"""

OPTIONS = {"mb": 64}
DESCRIPTION = "host fills x, y = 2x + 1 on the GPU, host reads y (and its first page) back"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    x = torch.empty(n, device=uvm.device)  # cudaMallocManaged: resident nowhere until first touched
    y = torch.empty(n, device=uvm.device)
    uvm.host_write(x)  # the CPU initialises x: CPU faults, pages populated on the host
    for _ in uvm.iterations():
        torch.mul(x, 2.0, out=y)  # GPU kernels: x faults over to the GPU, y is zero-filled there
        y.add_(1.0)
        uvm.host_read(y, offset=0, nbytes=4096)  # the CPU peeks at the first page (one page comes back)
        uvm.host_write(x, nbytes=x.numel() * 4 // 2)  # and refills the first half of x for the next iteration
    uvm.host_read(y)  # the whole result back to the host at the end
