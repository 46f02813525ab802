"""A gather over a given index: a distribution (uniform, zipf, sorted) or the rows themselves (uvm.kernel index=).

    uvmlab run docs/examples/programs/gather_index.py -n 2 --oversub 2 --option index=zipf:1.1
    uvmlab run docs/examples/programs/gather_index.py -n 2 --oversub 2 --option index=uniform
    uvmlab run docs/examples/programs/gather_index.py -n 2 --oversub 2 --option index=rows

Each of ``lookups`` threads copies one row of an embedding table. Which rows is data: a Zipf law's hot rows stay
resident and fault once, uniform rows spread over the whole table, sorted rows sweep it in order; ``rows`` gives
the exact rows (here a seeded draw on the CPU; a ``.npy`` file path works too).
"""

OPTIONS = {"rows": 1 << 18, "width": 256, "lookups": 1 << 16, "index": "zipf:1.1"}
DESCRIPTION = "an embedding gather under different index distributions"


def program(uvm, cfg, options):
    import torch  # noqa: TID251 (a workload file needs torch)

    rows, width, lookups = options["rows"], options["width"], options["lookups"]
    table = torch.empty(rows, width, device=uvm.device)  # 256 MiB at the defaults
    out = torch.empty(lookups, width, device=uvm.device)
    index = options["index"]
    if index == "rows":  # the exact rows, drawn on the CPU (values a meta tensor cannot hold)
        index = torch.randint(0, rows, (lookups,), generator=torch.Generator().manual_seed(0))
    uvm.host_write(table)
    for _ in uvm.iterations():
        uvm.kernel("embedding_gather", reads=[table], writes=[out], pattern="gather", threads=lookups, index=index)
