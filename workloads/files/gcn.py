"""noob512/uvm's PyTorch GCN (``benchmark_gnn_uvm.py``, RTX 5090 runs) as a uvmlab program, in plain torch.

``uvmlab run workloads/files/gcn.py --option nodes=5000000 --gpu RTX5090 --gpu-memory 33669316608 --pca off``
(add ``--option prefetch=true`` for the with-user-prefetch runs).

Source: noob512/uvm ``workloads/pytorch/benchmark_gnn_uvm.py`` at 5a9f2f2 (``--dataset random --prop chunked``:
features 128, hidden 256, 10 classes, 10 edges per node, chunks of 2,000,000 edges, Adam, 1 warm-up + 2 timed
epochs), measured in real-data/uvm/noob512-uvm_rtx5090_pytorch_gcn. With ``use_uvm`` every tensor is its own
``cudaMallocManaged`` and every free a ``cudaFree`` (no caching): run it with ``--pca off``.

* setup: a random graph (``edge_index`` [2, 10N] int64, features ``x`` [N, 128], labels ``y``, the training
  nodes), symmetrised with self loops (``src``, ``dst`` [21N] int64) and weighted ``1 / sqrt(deg_src deg_dst)``
  (``w`` [21N] fp32; the temporaries freed); ``lin1`` 128 -> 256, ``lin2`` 256 -> 10, Adam (lr 0.01);
* every epoch (``uvm.iterations()``: ``--iterations``, default 3 = the warm-up and the 2 timed epochs):
  ``lin1``; the chunked weighted aggregation (``ChunkedIndexAddWeightedFunction``: ``out = zeros``, per chunk of
  ``chunk_edges`` edges ``g = x[src]``, ``msg = g * w``, ``out.index_add_(0, dst, msg)``; its backward gathers
  by ``dst`` and scatters by ``src``); ReLU, dropout 0.5, ``lin2``, the aggregation again; cross-entropy on the
  10 % training nodes; backward; Adam.
* ``prefetch=true``: the allocator of the with-user-prefetch runs (``cudaMemPrefetchAsync`` of every new tensor to
  the GPU right after its ``cudaMallocManaged``, at every size: noob512/uvm ``workloads/pytorch/docs/
  UVM_EVALUATION.md`` section 2.4, weiso131/schedcp ``workloads/pytorch/uvm_allocator.c`` @8a8dccd):
  ``uvm.prefetch_new_allocations(True)`` before the first tensor.

Approximations: the degree is counted with ``index_add_`` of ones (``torch.bincount``'s output size is data, so it
has no meta kernel), and the training nodes are a fixed random 10 % selected with ``index_select`` (boolean-mask
indexing has a data-dependent size; same bytes read and written); the script's evaluation pass after training is
not run. The file imports nothing from uvmlab.
"""

OPTIONS = {"nodes": 5_000_000, "chunk_edges": 2_000_000, "prefetch": False}
DESCRIPTION = "noob512/uvm PyTorch GCN (random graph, chunked aggregation, Adam): 1 warm-up + timed epochs"

FEATURES = 128
HIDDEN = 256
CLASSES = 10
EDGES_PER_NODE = 10
TRAIN_SHARE = 10
"""One node in ``TRAIN_SHARE`` is a training node (the script's 10 % mask)."""
DROPOUT = 0.5
LR = 0.01
"""benchmark_gnn_uvm.py defaults as recorded in every result JSON (``hidden_dim``, ``chunk_size``, ...)."""


def _flag(value):
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
            raise ValueError(f"prefetch must be true or false, not {value!r}")
        return value.lower() in ("true", "on", "1", "yes")
    return bool(value)


def aggregate(torch):
    """``ChunkedIndexAddWeightedFunction.apply`` of the script, built on ``torch`` (the file imports torch lazily);
    uvmlab's GPU evidence kit runs the same function (``uvmlab.measure.gpu.kit.gcn``)."""

    class ChunkedIndexAddWeighted(torch.autograd.Function):
        """out[dst] += x[src] * w, chunk by chunk; the backward gathers by dst and scatters by src."""

        @staticmethod
        def forward(ctx, x, src, dst, w, chunk):
            ctx.save_for_backward(src, dst, w)
            ctx.chunk = chunk
            out = torch.zeros_like(x)
            for s in range(0, src.numel(), chunk):
                g = x[src[s : s + chunk]]
                msg = g * w[s : s + chunk, None]
                del g
                out.index_add_(0, dst[s : s + chunk], msg)
                del msg
            return out

        @staticmethod
        def backward(ctx, grad_out):
            src, dst, w = ctx.saved_tensors
            grad = torch.zeros_like(grad_out)
            for s in range(0, src.numel(), ctx.chunk):
                g = grad_out.index_select(0, dst[s : s + ctx.chunk]) * w[s : s + ctx.chunk, None]
                grad.index_add_(0, src[s : s + ctx.chunk], g)
                del g
            return grad, None, None, None, None

    return ChunkedIndexAddWeighted.apply


def program(uvm, cfg, options):
    """Build the graph, then train ``cfg.iterations`` epochs (module docstring)."""
    import torch
    import torch.nn.functional as F

    n, chunk = int(options["nodes"]), int(options["chunk_edges"])
    if n < TRAIN_SHARE or chunk < 1:
        raise ValueError(f"nodes must be >= {TRAIN_SHARE} and chunk_edges >= 1 (got {n}, {chunk})")
    if _flag(options["prefetch"]):
        uvm.prefetch_new_allocations(True)
    dev = uvm.device
    torch.manual_seed(0)
    edge_index = torch.randint(0, n, (2, EDGES_PER_NODE * n), device=dev)
    x = torch.randn(n, FEATURES, device=dev)
    y = torch.randint(0, CLASSES, (n,), device=dev)
    train = torch.randperm(n, device=dev)[: n // TRAIN_SHARE]
    loop = torch.arange(n, device=dev)
    src = torch.cat([edge_index[0], edge_index[1], loop])
    dst = torch.cat([edge_index[1], edge_index[0], loop])
    del loop  # edge_index stays alive, as the script's graph object keeps it
    ones = torch.ones(1, device=dev).expand(dst.numel())
    deg = torch.zeros(n, device=dev).index_add_(0, dst, ones).clamp_(min=1.0)
    w = deg[src].rsqrt() * deg[dst].rsqrt()
    del deg, ones
    lin1 = torch.nn.Linear(FEATURES, HIDDEN, device=dev)
    lin2 = torch.nn.Linear(HIDDEN, CLASSES, device=dev)
    opt = torch.optim.Adam([*lin1.parameters(), *lin2.parameters()], lr=LR)
    agg = aggregate(torch)

    def forward():
        """The model's forward (a function: its activations are held by autograd only, as in the script's
        ``nn.Module``, so each is freed as soon as the backward is done with it)."""
        h = agg(lin1(x), src, dst, w, chunk)
        h = F.dropout(torch.relu(h), DROPOUT, training=True)
        return agg(lin2(h), src, dst, w, chunk)

    for _ in uvm.iterations():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward().index_select(0, train), y.index_select(0, train))
        loss.backward()
        opt.step()
        del loss
