"""The estimators practitioners use, side by side with uvmlab on the same fine-tuning jobs (docs/estimate.md).

    python benchmarks/llm_peers.py [--no-trackers]

Jobs: every published measurement of uvmlab.evaluate.llm_published (so the measured value is in the table) and three
full fine-tuning jobs in fp32 where PyTorch's own trackers can run here. Peers (uvmlab.trace.peers): accelerate
estimate-memory's "Training using Adam" figure, DeepSpeed's ZeRO-2/3 model-state estimators (the ZeRO jobs),
PyTorch's MemTracker (single GPU) and FSDPMemTracker (FSDP2) under FakeTensorMode on the CPU. Figures in GB
(1e9 bytes); "n/a" says why a peer has no answer. uvmlab's figure is the device peak (what nvidia-smi shows) and,
in brackets, the peak allocated bytes (what the trackers count).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.llm_published import PublishedRow, evaluate, rows, workload_config
from uvmlab.trace.peers import accelerate_estimate, deepspeed_estimate, deepspeed_params, memtracker_peak
from workloads.hf_models import PRESETS

EXTRA = [
    PublishedRow("qwen2.5-0.5b-full-fp32-bs4-1024", "(no measurement)", "A100-80GB", "device", None,
                 "hf:qwen2.5-0.5b", {"batch_size": 4, "options": {"seq_len": 1024}, "iterations": 2}),
    PublishedRow("llama-3.2-1b-fsdp2-8-bs2-2048", "(no measurement)", "A100-80GB", "device", None,
                 "hf:llama-3.2-1b", {"batch_size": 2, "options": {"seq_len": 2048}, "iterations": 2,
                                     "shard": "fsdp2", "world_size": 8}),
    PublishedRow("llama-3.2-1b-zero3-8-bs2-2048", "(no measurement)", "A100-80GB", "device", None,
                 "hf:llama-3.2-1b", {"batch_size": 2, "options": {"seq_len": 2048}, "iterations": 2,
                                     "shard": "zero3", "world_size": 8}),
]  # fmt: skip


def _config_json(cfg: WorkloadConfig) -> dict:
    name = cfg.workload.removeprefix("hf:")
    if name.lower() in PRESETS:
        return PRESETS[name.lower()][0]
    return json.loads((Path(name) / "config.json").read_text())


def _gb(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1e9:.2f}"


def main(argv: list[str]) -> None:
    trackers = "--no-trackers" not in argv
    jobs = rows() + EXTRA
    t0 = time.perf_counter()
    results = {r.row.row_id: r for r in evaluate(jobs, progress=lambda rid: print(f"... {rid}", file=sys.stderr))}
    print(
        "| job | measured | uvmlab device (allocated) | accelerate training | DeepSpeed model states | "
        "MemTracker / FSDPMemTracker |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for job in jobs:
            cfg = workload_config(job, Path(tmp) / job.row_id)
            res = results[job.row_id]
            mixed = cfg.dtype == "bf16" or cfg.weights_dtype == "bf16"
            acc = accelerate_estimate(_config_json(cfg), "bfloat16" if mixed else "float32")["training_bytes"]
            ds = None
            if cfg.shard in ("zero2", "zero3"):
                total, largest = deepspeed_params(cfg)
                ds = deepspeed_estimate(total, largest, int(cfg.shard[-1]), cfg.world_size)
            tracked: str
            if not trackers:
                tracked = "not run"
            elif cfg.shard not in ("", "fsdp2"):
                tracked = "n/a (no tracker for this layout)"
            else:
                print(f"... tracker {job.row_id}", file=sys.stderr, flush=True)
                try:
                    tracked = _gb(memtracker_peak(cfg, cfg.world_size if cfg.shard == "fsdp2" else None))
                except InputError as exc:
                    tracked = "n/a (" + str(exc).split(":")[0] + ")"
            measured = job.measured_bytes
            m = "OOM" if measured is None and job.source != "(no measurement)" else _gb(measured)
            print(
                f"| {job.row_id} | {m} | {_gb(res.device_peak_bytes)} ({_gb(res.peak_allocated_bytes)}) | "
                f"{_gb(acc)} | {_gb(ds)} | {tracked} |"
            )
    print(f"\nwall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
