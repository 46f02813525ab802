"""Child step of ``uvmlab collect``: the host-device link and the fault path, measured (uvmlab.measure.gpu.microbench).

``python -m uvmlab.measure.gpu.kit.link_step OUT [--factors 1.5,2,4]``

Writes ``OUT/timings.csv`` (uvmlab.measure.gpu.microbench.TIMING_COLUMNS): ``cudaMemPrefetchAsync`` of 2 MiB ... 1 GiB
in
both directions (the bandwidth curve), first-touch, host-resident and random-order page touches (the fault service
cost). The ``touch_oversub`` rows, which ask for more managed memory than a balloon leaves free, run only with
``--factors`` (``uvmlab collect --allow-oversubscription``): on a shared GPU such a request can stall other tenants.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uvmlab.errors import UvmlabError


def sizes_within_limit(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The transfer sizes that fit the managed limit of the free memory measured now (uvmlab.measure.gpu.kit.sizing;
    each row holds one allocation of its size at a time); the others are dropped with a line on stderr."""
    try:
        import cupy as cp
    except ImportError:
        return sizes  # run_microbench refuses with its own sentence
    from uvmlab.measure.gpu.kit.sizing import managed_limit

    limit = managed_limit(int(cp.cuda.runtime.memGetInfo()[0]))
    kept = tuple(s for s in sizes if s <= limit)
    if len(kept) < len(sizes):
        print(f"uvmlab link step: sizes above the managed limit of {limit} B dropped", file=sys.stderr)
    if not kept:
        raise UvmlabError(f"no transfer size fits the managed limit of {limit} B of this card's free memory")
    return kept


def main(argv: list[str] | None = None) -> int:
    from uvmlab.files.atomic import atomic_write_with
    from uvmlab.measure.gpu.microbench import DEFAULT_SIZES, run_microbench

    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.link_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--factors", default="")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    factors = tuple(float(f) for f in args.factors.split(",") if f)
    sizes = tuple(int(s) for s in args.sizes.split(",") if s)
    try:
        sizes = sizes_within_limit(sizes)
        timings = run_microbench(sizes=sizes, factors=factors, repeats=args.repeats)
    except UvmlabError as exc:
        print(f"uvmlab link step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_with(args.out / "timings.csv", lambda tmp: timings.to_csv(tmp, index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
