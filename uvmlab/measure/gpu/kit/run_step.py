"""Child step of ``uvmlab collect``: one ``uvmlab run --mode gpu`` end to end, sized so it cannot oversubscribe.

``python -m uvmlab.measure.gpu.kit.run_step OUT --workload resnet50 --batch-size 64 --oversub 0.75 [--iterations 4]``

The GPU run path (uvmlab.measure.gpu.runner.run_gpu: calibrate with ``--footprint measure``, baseline, run behind a
balloon taken after a warm-up iteration, the capacity probe, the effective factor, the cuDNN engines of both runs)
at a factor below 1, where UVM's capacity M / f exceeds the job's footprint M: nothing is evicted and no managed
memory beyond what the card has free is asked for. Before anything runs, the footprint is checked against the
free memory NVML reports (no CUDA context in this process): the calibration step holds M of managed memory with no
balloon, so the simulator's estimate, inflated by its worst known error, must fit the managed limit
(uvmlab.measure.gpu.kit.sizing), and M / f plus the reserve must fit the free memory; otherwise the step refuses in
one sentence (exit 2) and writes ``OUT/refused.json``. The run directory is OUT itself (``uvmlab compare`` and
``uvmlab report`` read it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError, UvmlabError


def check_fits(estimate_bytes: int, oversub: float, free_bytes: int, reserve_bytes: int) -> dict[str, Any]:
    """The sizing decision (module docstring); InputError (one sentence) when the run could exceed free memory."""
    from uvmlab.measure.gpu.kit.sizing import inflated, managed_limit

    limit = managed_limit(free_bytes)
    held = inflated(estimate_bytes)
    capacity = int(held / oversub) + reserve_bytes
    decision = {
        "estimate_bytes": estimate_bytes,
        "estimate_inflated_bytes": held,
        "free_bytes": free_bytes,
        "managed_limit_bytes": limit,
        "capacity_asked_bytes": capacity,
    }
    if held > limit or capacity > free_bytes:
        raise InputError(
            f"the run's footprint (estimate {estimate_bytes} B, {held} B after the estimator's worst known error) "
            f"at factor {oversub:g} could need more than the {limit} B of managed memory this card's {free_bytes} B "
            "free allow; choose a smaller workload or batch"
        )
    return decision


def main(argv: list[str] | None = None) -> int:
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.files.atomic import atomic_write_json
    from uvmlab.files.rundir import RunDir
    from uvmlab.measure.gpu.balloon import DEFAULT_RESERVE_BYTES
    from uvmlab.measure.gpu.detect import gpu_status
    from uvmlab.measure.gpu.runner import GpuRunOptions, run_gpu
    from uvmlab.uvm.simulate import footprint_bytes

    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.run_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--workload", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--oversub", type=float, default=0.75)
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args(argv)
    try:
        status = gpu_status().require()
        cfg = RunConfig(
            WorkloadConfig(args.workload, batch_size=args.batch_size, iterations=args.iterations),
            oversub=args.oversub,
            pca=True,
            mode="gpu",
        )
        free = status.free_bytes if status.free_bytes is not None else int(status.memory_bytes or 0)
        try:
            decision = check_fits(int(footprint_bytes(cfg)), args.oversub, free, DEFAULT_RESERVE_BYTES)
        except InputError as exc:
            args.out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(args.out / "refused.json", {"refused": str(exc)})
            raise
        rd = RunDir(args.out)
        rd.prepare()
        try:
            run_gpu(cfg, GpuRunOptions(footprint="measure", baseline=True), rd)
            rd.write_json_file(Path(rd.path) / "sizing.json", decision)
        finally:
            rd.release()
    except UvmlabError as exc:
        print(f"uvmlab run step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
