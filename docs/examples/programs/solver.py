"""An iterative solver: conjugate gradient on a dense symmetric positive definite system (docs/workloads.md).

    uvmlab run docs/examples/programs/solver.py -n 10 --oversub 2

One iteration of ``uvm.iterations()`` is one CG step: a matrix-vector product (reads all of A), three dot
products and three vector updates. The host reads the residual norm every step to test convergence, as a real
solver's loop does (a 4-byte host read of GPU memory: one page comes back).
"""

OPTIONS = {"n": 4096}
DESCRIPTION = "conjugate gradient, dense A (n x n), host checks the residual each step"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    n = options["n"]
    a = torch.empty(n, n, device=uvm.device)
    b = torch.empty(n, device=uvm.device)
    uvm.host_write(a)  # the host assembles the system
    uvm.host_write(b)
    uvm.advise(a, "set_read_mostly")  # A is only read from now on
    x = torch.zeros(n, device=uvm.device)
    r = b - a @ x
    p = r.clone()
    rr = r.dot(r)
    for _ in uvm.iterations():
        ap = a @ p
        alpha = rr / p.dot(ap)
        x.add_(alpha * p)
        r.sub_(alpha * ap)
        rr_new = r.dot(r)
        uvm.host_read(rr_new)  # if rr_new.sqrt() < tol: break (the test runs on the host)
        p.mul_(rr_new / rr).add_(r)
        rr = rr_new
    uvm.host_read(x)
