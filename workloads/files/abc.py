"""uvm-eval's ``abc`` (Titan V fault logs): three managed 2 MiB arrays, c[p] = a[p] + b[p] by one warp.

``uvmlab run workloads/files/abc.py --gpu TitanV --pca off --no-prefetch --iterations 1
--sim-option batch_unique_pages=256``

tallendev/uvm-eval ``archive/benchmarksv3/abc/abc.cu`` as its logs show it (real-data/uvm README section 1): three
``cudaMallocManaged`` arrays ``a``, ``b``, ``c`` of 2 MiB each (one range each: ``--pca off``); the CPU initialises
the first 32 pages of each (``uvm.host_write``); one warp of 32 threads does ``c[p] = a[p] + b[p]``, one 4-byte
element per thread, thread ``p`` in page ``p`` (``uvm.kernel`` with ``threads=32``, ``stride_bytes`` = a page,
order ``sequential``: each thread its own page of each array, reads of ``a`` and ``b`` then the write of ``c``).
The logged driver ran with ``uvm_perf_prefetch_enable=0`` (``genabcfaults.sh``): ``--no-prefetch``. One warp's 64
loads are in flight together, so nothing limits its batch below the 256-entry fault buffer
(``--sim-option batch_unique_pages=256``). The kernel is the one iteration; the host writes are setup.
"""

OPTIONS = {"pages": 32, "array_bytes": 2 * 1024 * 1024}
DESCRIPTION = "uvm-eval abc: one warp adds the first 32 pages of two host-initialised managed arrays"

PAGE_BYTES = 4096
WARP = 32


def program(uvm, cfg, options):
    import torch

    pages, size = int(options["pages"]), int(options["array_bytes"])
    if not 0 < pages * PAGE_BYTES <= size:
        raise ValueError(f"pages ({pages}) must be > 0 and fit the {size}-byte arrays")
    a, b, c = (torch.empty(size // 4, dtype=torch.float32, device=uvm.device) for _ in range(3))
    used = pages * PAGE_BYTES
    for t in (a, b, c):
        uvm.host_write(t, nbytes=used)
    span = pages * PAGE_BYTES // 4
    for _ in uvm.iterations():
        uvm.kernel(
            "abc",
            reads=[a[:span], b[:span]],
            writes=[c[:span]],
            pattern="sequential",
            threads=pages,
            warp_size=WARP,
            stride_bytes=PAGE_BYTES,
            flops=float(pages),
            touched_bytes=3 * pages * 32,
        )
