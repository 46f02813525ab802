"""An inference (serving) loop: a model's weights stay on the GPU, each request's input comes from the host and its
answer goes back (docs/workloads.md).

    uvmlab run docs/examples/programs/inference.py -n 4 --oversub 1.5

Any torch code on ``uvm.device`` is recorded as in a training trace, here a ``torch.nn`` model under
``torch.no_grad()``: no gradients, no optimizer.
"""

DEFAULT_BATCH_SIZE = 64
OPTIONS = {"features": 1024, "hidden": 4096, "layers": 4, "classes": 1000}
DESCRIPTION = "MLP inference: host input -> forward -> host reads the logits, one request per iteration"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    f, h = options["features"], options["hidden"]
    with torch.device(uvm.device):  # the model's parameters are made on uvm.device (managed memory on a GPU)
        layers = [torch.nn.Linear(f, h), torch.nn.ReLU()]
        for _ in range(options["layers"] - 2):
            layers += [torch.nn.Linear(h, h), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(h, options["classes"]))
        model = torch.nn.Sequential(*layers).eval()
    for p in model.parameters():  # the weights are loaded from disk by the host, then moved to the GPU once
        uvm.host_write(p)
        uvm.prefetch(p, "gpu")
    request = torch.empty(cfg.batch_size, f, device=uvm.device)  # a pinned-in-place request buffer
    with torch.no_grad():
        for _ in uvm.iterations():
            uvm.host_write(request)  # the request arrives: the CPU writes it into managed memory
            logits = model(request)
            answer = logits.argmax(dim=1)
            uvm.host_read(answer)  # the server reads the answer on the host
