"""Device memory that is not managed, and cudaMemcpy (uvm.device_empty, uvm.memcpy_htod / memcpy_dtoh).

    uvmlab run docs/examples/programs/device_memory.py -n 2 --oversub 2

A lookup table lives in plain device memory (``cudaMalloc``): it is filled once by ``cudaMemcpy`` from the host,
never faults and is never evicted, and it takes its bytes from the GPU memory UVM may use. The data is managed
memory the host writes; each iteration's result is copied back with ``cudaMemcpy`` (device to host).
"""

OPTIONS = {"mb": 64}
DESCRIPTION = "a cudaMalloc'd table next to managed data, with explicit copies"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = (options["mb"] << 20) // 4
    table = uvm.device_empty(n)  # cudaMalloc: not managed
    uvm.memcpy_htod(table)  # cudaMemcpy(table, host, n * 4, cudaMemcpyHostToDevice)
    data = torch.empty(n, device=uvm.device)  # managed (every torch allocation is, under UVM)
    out = torch.empty(n, device=uvm.device)
    uvm.host_write(data)
    for _ in uvm.iterations():
        torch.add(data, table, out=out)  # reads managed data and the device table
        uvm.memcpy_dtoh(out)  # cudaMemcpy(host, out, n * 4, cudaMemcpyDeviceToHost)
