"""Re-faulting after a CPU touch (issue 41 section 3): a managed array the GPU wrote, read back by the CPU, then read
again by the GPU, each iteration; prints the time per iteration, its CPU part and its GPU fault stall with the shipped
costs and with those the profiles had before they were measured (a CPU fault 4.95 us: the GCN fault scale; no
unmapping of the CPU's pages). Usage::

    python benchmarks/cpu_refault_table.py [--gpu A100-80GB] [--mb 1024] [--iterations 2]
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from program_run import program_file, table_arguments, uvmlab_run

PROGRAM = """
OPTIONS = {"mb": 1024}


def program(uvm, cfg, options):
    import torch  # noqa: TID251

    n = (options["mb"] << 20) // 4
    m = torch.empty(n, device=uvm.device)
    out = torch.empty(n, device=uvm.device)
    m.fill_(1.0)  # the GPU writes the array
    for _ in uvm.iterations():
        uvm.host_read(m)  # the CPU reads it back: CPU faults, DtoH
        torch.mul(m, 2.0, out=out)  # the GPU reads it again: GPU faults, HtoD
"""
BEFORE = {"cpu_fault_ns": 4950.0612980162305, "cpu_unmap_chunk_ns": 0.0}
"""The costs before stop 49: cpu_fault_ns 30 us x the GCN fault scale 0.165, no cpu_unmap_chunk_ns."""


def run(program: Path, gpu: str, mb: int, iterations: int, params: Path | None) -> dict[str, float]:
    out = program.parent / ("old" if params else "new")
    options = [
        "--gpu",
        gpu,
        "-n",
        str(iterations),
        "--option",
        f"mb={mb}",
        *(["--params", str(params)] if params else []),
    ]
    last = pd.read_parquet(uvmlab_run(program, out, *options) / "iterations.parquet").iloc[-1]  # steady
    return {k: float(last[k]) / 1e6 for k in ("duration_ns", "host_ns", "fault_stall_ns")}


def main() -> None:
    ap = table_arguments(__doc__, "A100-80GB")
    ap.add_argument("--iterations", type=int, default=2)
    a = ap.parse_args()
    with program_file("refault.py", PROGRAM) as program:
        old = program.parent / "old.json"
        old.write_text(json.dumps({"schema_version": 1, "source": "before stop 49", "params": BEFORE}))
        rows = {
            "shipped profile": run(program, a.gpu, a.mb, a.iterations, None),
            "before (4.95 us, no unmapping)": run(program, a.gpu, a.mb, a.iterations, old),
        }
    print(f"{a.mb} MiB, GPU write / CPU read / GPU read, {a.iterations} iterations on {a.gpu}\n")
    print("| costs | last iteration (ms) | its CPU part (ms) | its GPU fault stall (ms) |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['duration_ns']:.1f} | {r['host_ns']:.1f} | {r['fault_stall_ns']:.1f} |")


if __name__ == "__main__":
    main()
