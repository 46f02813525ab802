"""In-place and ``out=`` GEMMs are cuBLAS GEMMs, timed as GEMMs (docs/uvm-sim.md "Native kernel time by class").

    uvmlab run docs/examples/programs/inplace_gemm.py -n 2

``c.addmm_(a, b)``, ``torch.mm(a, b, out=c)`` and ``c.baddbmm_(x, y)`` each do 2 m n k FLOPs on cuBLAS; the
kernels table gives them class ``gemm`` and a native time from the GPU's FP32 rate, not an elementwise op's.
"""

OPTIONS = {"n": 2048, "batch": 4}
DESCRIPTION = "addmm_, mm(out=) and baddbmm_ as GEMMs"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n, b = options["n"], options["batch"]
    a = torch.empty(n, n, device=uvm.device)
    w = torch.empty(n, n, device=uvm.device)
    c = torch.empty(n, n, device=uvm.device)
    x = torch.empty(b, n, n // b, device=uvm.device)
    y = torch.empty(b, n // b, n, device=uvm.device)
    z = torch.empty(b, n, n, device=uvm.device)
    for _ in uvm.iterations():
        c.addmm_(a, w)  # c += a @ w, in place
        torch.mm(a, w, out=c)  # c = a @ w into an existing tensor
        z.baddbmm_(x, y)  # z += x @ y, batched, in place
